"""The gateway over real sockets: it repeats a request only when it certainly was not sent, and
counts every ending of a call as an answer, not sent, or outcome unknown. The stand-ins count
the requests they saw, so "never retried" is checked on the server's side."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
from handlers_support import FAST, WITHHOLD_MS, Standins, recording_server
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handlers.answers import BODY_BYTES_MAX, Answer, NotSent, NotSentClass, OutcomeUnknown, UnknownClass
from handlers.gateway import Gateway, GatewaySettings, Outbound
from ledger import pg

TRANSFER = msgspec.json.encode({"transfer_id": "t-1", "payer": "escrow", "payee": "u-1", "amount_minor": 5,
                                "currency": "CNY", "business_id": "g-1"})  # fmt: skip
POST = Outbound(method="POST", url="/transfers", body=TRANSFER,
                headers=(("content-type", "application/json"), ("idempotency-key", "t-1")))  # fmt: skip


def gateway(base_url: str, settings: GatewaySettings = FAST) -> Gateway:
    return Gateway(downstream="payment", settings=settings, base_url=base_url, rng=random.Random(1))


async def test_a_connect_error_is_retried_inside_the_attempt_then_reported_not_sent() -> None:
    nobody = gateway(f"http://127.0.0.1:{pg.free_tcp_port()}")
    try:
        outcome = await nobody.send(POST)
    finally:
        await nobody.aclose()
    assert isinstance(outcome, NotSent)
    assert (outcome.error_class, outcome.tries) == (NotSentClass.CONNECT_FAILED, FAST.connect_tries_max)
    assert outcome.detail.startswith("ConnectError: ")


async def test_a_read_timeout_is_never_retried(standins: Standins) -> None:
    await standins.faults("payment", apply_then_timeout_rate=1.0, withhold_ms=WITHHOLD_MS)
    payment = gateway(standins.urls["payment"])
    try:
        outcome = await payment.send(POST)
    finally:
        await payment.aclose()
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.TIMEOUT
    stats = await standins.stats("payment")
    assert (stats["requests"], stats["applied"]) == (1, 1)  # one request, and it was applied


async def test_a_connection_cut_after_the_write_is_an_unknown_outcome_never_retried(standins: Standins) -> None:
    await standins.faults("payment", apply_then_drop_rate=1.0)
    payment = gateway(standins.urls["payment"])
    try:
        outcome = await payment.send(POST)
    finally:
        await payment.aclose()
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert (await standins.stats("payment"))["requests"] == 1


async def test_no_free_connection_in_the_pool_is_not_sent_and_retried(standins: Standins) -> None:
    await standins.faults("payment", latency_ms=1000)
    one_connection = GatewaySettings(
        connect_timeout_s=0.5, read_timeout_s=2.0, pool_timeout_s=0.1, attempt_timeout_s=3.0, connections_max=1,
        keepalive_connections_max=1, connect_tries_max=2, connect_backoff_min_s=0.01, connect_backoff_max_s=0.02,
    )  # fmt: skip
    payment = gateway(standins.urls["payment"], one_connection)
    lookup = Outbound(method="GET", url="/transfers/t-1")
    try:
        first, second = await asyncio.gather(payment.send(lookup), payment.send(lookup))
    finally:
        await payment.aclose()
    assert isinstance(first, Answer) and first.status == 404
    assert isinstance(second, NotSent)
    assert (second.error_class, second.tries) == (NotSentClass.POOL_EXHAUSTED, 2)
    assert (await standins.stats("payment"))["requests"] == 1


async def test_nothing_is_written_once_the_lease_has_ended() -> None:
    import dataclasses
    import time

    async with recording_server(201) as server:
        late = gateway(server.url)
        try:
            outcome = await late.send(dataclasses.replace(POST, send_by=time.monotonic() - 0.001))
        finally:
            await late.aclose()
        assert server.heads == []
    assert isinstance(outcome, NotSent) and (outcome.error_class, outcome.tries) == (NotSentClass.LEASE_ENDED, 1)


async def test_a_lease_that_ends_during_the_connect_backoff_stops_the_tries() -> None:
    import dataclasses
    import time

    slow_backoff = GatewaySettings(connect_timeout_s=0.5, connect_tries_max=5, connect_backoff_min_s=0.3,
                                   connect_backoff_max_s=0.3)  # fmt: skip
    nobody = gateway(f"http://127.0.0.1:{pg.free_tcp_port()}", slow_backoff)
    try:
        outcome = await nobody.send(dataclasses.replace(POST, send_by=time.monotonic() + 0.15))
    finally:
        await nobody.aclose()
    assert isinstance(outcome, NotSent) and (outcome.error_class, outcome.tries) == (NotSentClass.LEASE_ENDED, 2)


async def test_a_lease_that_ends_while_the_request_waits_for_a_connection_sends_nothing(standins: Standins) -> None:
    """Checked again just before the headers are written: the request below passed the check
    before its try, then waited for the pool's one connection past its lease."""
    import dataclasses
    import time

    await standins.faults("payment", latency_ms=600)
    one_connection = GatewaySettings(read_timeout_s=2.0, pool_timeout_s=2.0, attempt_timeout_s=3.0, connections_max=1,
                                     keepalive_connections_max=1)  # fmt: skip
    payment = gateway(standins.urls["payment"], one_connection)
    lookup = Outbound(method="GET", url="/transfers/t-1")
    try:
        first, second = await asyncio.gather(
            payment.send(lookup), payment.send(dataclasses.replace(POST, send_by=time.monotonic() + 0.2)))
    finally:
        await payment.aclose()
    assert isinstance(first, Answer) and first.status == 404
    assert isinstance(second, NotSent) and (second.error_class, second.tries) == (NotSentClass.LEASE_ENDED, 1)
    assert (await standins.stats("payment"))["requests"] == 1


async def test_the_attempt_deadline_bounds_a_slow_answer_as_unknown(standins: Standins) -> None:
    await standins.faults("payment", latency_ms=1500)
    patient_reads = GatewaySettings(connect_timeout_s=0.5, read_timeout_s=5.0, attempt_timeout_s=0.5)
    payment = gateway(standins.urls["payment"], patient_reads)
    try:
        outcome = await payment.send(POST)
    finally:
        await payment.aclose()
    assert outcome == OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail="no answer within the attempt's 0.5 s")


async def test_an_answer_comes_back_whole_with_status_headers_and_body(standins: Standins) -> None:
    payment = gateway(standins.urls["payment"])
    try:
        created, missing = await payment.send(POST), await payment.send(Outbound(method="GET", url="/transfers/t-2"))
    finally:
        await payment.aclose()
    assert isinstance(created, Answer) and created.status == 201
    assert created.header("Content-Type") == "application/json"
    assert msgspec.json.decode(created.body)["transfer_id"] == "t-1"
    assert isinstance(missing, Answer) and (missing.status, missing.body) == (404, b'{"code":"not_found"}')


async def test_a_redirect_is_returned_never_followed(standins: Standins) -> None:
    target = f"{standins.urls['callback']}/callbacks/merchant-a"
    async with recording_server(307, headers={"Location": target}) as redirecting:
        client = gateway("")
        try:
            outcome = await client.send(Outbound(method="POST", url=f"{redirecting.url}/hook", body=b"{}"))
        finally:
            await client.aclose()
    assert isinstance(outcome, Answer) and (outcome.status, outcome.header("location")) == (307, target)
    assert len(redirecting.heads) == 1
    assert (await standins.stats("callback"))["requests"] == 0


async def test_only_the_trace_context_of_an_attempt_is_passed_on() -> None:
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE",
             "authorization": "Bearer not-for-downstream"}  # fmt: skip
    async with recording_server(200) as downstream:
        client = gateway(downstream.url)
        try:
            await client.send(Outbound(method="POST", url="/x", body=b"{}", trace=trace,
                                       headers=(("idempotency-key", "k-1"),)))  # fmt: skip
        finally:
            await client.aclose()
    (head,) = downstream.heads
    assert (head["traceparent"], head["tracestate"], head["idempotency-key"]) == (
        trace["traceparent"], trace["tracestate"], "k-1")
    assert "authorization" not in head and head["user-agent"] == "compensator/1"


async def test_a_long_body_is_read_up_to_the_limit() -> None:
    async with recording_server(200, body=b"x" * (BODY_BYTES_MAX * 2)) as downstream:
        client = gateway(downstream.url)
        try:
            outcome = await client.send(Outbound(method="GET", url="/big"))
        finally:
            await client.aclose()
    assert isinstance(outcome, Answer)
    assert (len(outcome.body), outcome.body_truncated) == (BODY_BYTES_MAX, True)


def test_settings_that_contradict_each_other_are_refused() -> None:
    settings = GatewaySettings(connections_max=2, keepalive_connections_max=4, connect_timeout_s=3.0, attempt_timeout_s=2.0)
    assert settings.problems() == [
        "keepalive_connections_max must be at most connections_max",
        "attempt_timeout_s must be at least connect_timeout_s (or no try can connect)",
    ]
    with pytest.raises(ValueError, match=r"^payment gateway: keepalive"):
        gateway("http://127.0.0.1:1", settings)
    assert GatewaySettings(read_timeout_s=0).problems() == ["Expected `float` > 0.0 - at `$.read_timeout_s`"]


async def test_an_answer_that_cannot_be_read_is_an_unknown_outcome_not_an_exception() -> None:
    async with recording_server(200, headers={"Content-Encoding": "gzip"}, body=b"not gzip at all") as downstream:
        client = gateway(downstream.url)
        try:
            outcome = await client.send(POST)
        finally:
            await client.aclose()
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert outcome.detail.startswith("DecodingError: ")
    assert downstream.heads[0]["accept-encoding"] == "identity"


async def test_a_call_is_a_client_span_under_the_attempt_and_the_downstream_gets_its_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    async with recording_server(503) as downstream:
        client = Gateway(downstream="payment", settings=FAST, base_url=downstream.url, rng=random.Random(1),
                         tracer=tracer)  # fmt: skip
        try:
            with tracer.start_as_current_span("attempt transfer") as attempt:
                await client.send(Outbound(method="POST", url="/transfers", body=b"{}"))
        finally:
            await client.aclose()
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "POST payment"]
    assert call.parent is not None and call.parent.span_id == attempt.get_span_context().span_id
    assert call.attributes is not None and call.attributes["http.response.status_code"] == 503
    (head,) = downstream.heads
    trace_id, span_id = head["traceparent"].split("-")[1:3]
    assert (int(trace_id, 16), int(span_id, 16)) == (call.context.trace_id, call.context.span_id)
