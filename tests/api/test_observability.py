"""Traces and metrics: a span per request with a child for the store round trip, the trace
context carried into the stored message (where the worker picks it up), and Prometheus series by
route template."""

from __future__ import annotations

from api_support import Api, transfer
from opentelemetry.trace import SpanKind

from queues import Role

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_a_submission_is_one_trace_from_the_producer_into_the_stored_message(api: Api) -> None:
    traceparent = f"00-{PRODUCER_TRACE}-00f067aa0ba902b7-01"
    headers = {**api.auth(), "Idempotency-Key": "traced", "traceparent": traceparent}
    created = await api.client.post("/v1/requests", json=transfer("t"), headers=headers)
    assert created.status_code == 201
    spans = api.spans.get_finished_spans()
    server = [s for s in spans if s.kind is SpanKind.SERVER and s.attributes
              and s.attributes.get("http.route") == "/v1/requests"]  # fmt: skip
    (store,) = [s for s in spans if s.name == "store.enqueue"]
    assert len(server) == 1
    assert server[0].context.trace_id == store.context.trace_id == int(PRODUCER_TRACE, 16)
    assert store.parent is not None and store.parent.span_id == server[0].context.span_id
    assert store.kind is SpanKind.CLIENT and store.attributes and store.attributes["compensator.ref_key"] == "rp-t"
    view = (await api.client.get(f"/v1/requests/{created.json()['id']}", headers=api.auth())).json()
    stored = view["trace"]["traceparent"].split("-")
    assert stored[1] == PRODUCER_TRACE and int(stored[2], 16) == store.context.span_id
    assert not [s for s in spans if s.name.endswith(("http receive", "http send"))]  # one span per request


async def test_metrics_by_route_template_and_store_round_trips(api: Api) -> None:
    for index in range(3):
        await api.client.post("/v1/requests", json=transfer(str(index)),
                              headers={**api.auth(), "Idempotency-Key": f"m{index}"})  # fmt: skip
        await api.client.get(f"/v1/requests/1-{1000 + index}", headers=api.auth())
    text = (await api.client.get("/metrics", headers=api.auth(Role.OPERATOR))).text
    assert 'compensator_api_requests_total{method="POST",route="/v1/requests",status="201"} 3.0' in text
    assert 'compensator_api_requests_total{method="GET",route="/v1/requests/{request_id}",status="404"} 3.0' in text
    assert 'compensator_api_store_seconds_count{operation="enqueue"} 3.0' in text
    assert 'compensator_api_request_seconds_bucket{le="0.05",method="POST",route="/v1/requests"}' in text
    assert "1-1000" not in text  # paths never become labels
