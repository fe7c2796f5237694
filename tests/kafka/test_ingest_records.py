"""A Kafka record of a failed request is validated exactly as `POST /v1/requests` validates a body,
keyed as the API keys it, and a refused one carries its reason and coordinates to the rejects topic."""

from __future__ import annotations

import json

from queues import Enqueue
from services.kafka.ingest_records import Incoming, Rejection, decide, reject_record
from submission.models import SUBMISSION
from submission.rules import build_enqueue

BODY = {"kind": "transfer", "ref_key": "order-1", "payload": {"transfer_id": "t1", "payer": "a", "payee": "b",
        "amount_minor": 100, "currency": "CNY"}, "failure": {"error_class": "timeout"}}  # fmt: skip
TRACE = {"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}
TARGETS = frozenset({"merchant-demo"})


def incoming(
    value: bytes | None, key: bytes | None = b"key-1", headers: tuple[tuple[str, bytes], ...] = ()
) -> Incoming:
    return Incoming(topic="requests", partition=2, offset=41, key=key, value=value, headers=headers)


def decided(record: Incoming) -> Enqueue | Rejection:
    return decide(record, producer="kafka", body_bytes_max=4096, now_ms=1_000, trace_headers={"traceparent": "batch"},
                  callback_targets=TARGETS)  # fmt: skip


def test_a_valid_record_becomes_the_command_the_api_would_build_under_the_ingest_producer() -> None:
    command = decided(incoming(json.dumps(BODY).encode(), headers=tuple((k, v.encode()) for k, v in TRACE.items())))
    expected = build_enqueue(producer="kafka", key="key-1", submission=SUBMISSION.validate_python(BODY),
                             trace_headers=TRACE, now_ms=1_000, callback_targets=TARGETS)  # fmt: skip
    assert command == expected
    assert isinstance(command, Enqueue) and command.idempotency_key == "kafka:key-1"
    assert command.headers["failure-class"] == "timeout" and command.headers["traceparent"] == TRACE["traceparent"]


def test_the_header_key_wins_over_the_record_key_and_the_batch_trace_fills_in() -> None:
    command = decided(incoming(json.dumps(BODY).encode(), headers=(("idempotency-key", b"from-header"),)))
    assert isinstance(command, Enqueue)
    assert command.idempotency_key == "kafka:from-header" and command.headers["traceparent"] == "batch"


def test_refusals_name_the_problem_and_every_bad_field() -> None:
    bad_amount = {**BODY, "payload": {**BODY["payload"], "amount_minor": "100"}}  # type: ignore[dict-item]
    cases = {
        "malformed-body": incoming(b"{not json"),
        "invalid-request": incoming(json.dumps(bad_amount).encode()),
        "idempotency-key-missing": incoming(json.dumps(BODY).encode(), key=None),
        "idempotency-key-invalid": incoming(json.dumps(BODY).encode(), key=b" spaced "),
        "body-too-large": incoming(b" " * 5000),
    }
    for reason, record in cases.items():
        refused = decided(record)
        assert isinstance(refused, Rejection) and refused.reason == reason, (reason, refused)
    unknown_kind = decided(incoming(json.dumps({**BODY, "kind": "nope"}).encode()))
    assert isinstance(unknown_kind, Rejection) and unknown_kind.errors[0]["field"] == "kind"
    callback = {"kind": "callback", "ref_key": "order-1", "payload": {"target": "merchant-demo", "body": {}}}
    assert isinstance(decided(incoming(json.dumps(callback).encode())), Enqueue)
    elsewhere = decided(incoming(json.dumps({**callback, "payload": {"target": "unknown", "body": {}}}).encode()))
    assert isinstance(elsewhere, Rejection) and elsewhere.reason == "invalid-request"
    assert [e["field"] for e in elsewhere.errors] == ["payload.target"]
    amount = decided(incoming(json.dumps(bad_amount).encode()))
    assert isinstance(amount, Rejection) and amount.errors == [
        {"field": "payload.amount_minor", "message": "Input should be a valid integer"}
    ]


def test_a_reject_keeps_the_record_and_says_why_and_where_it_was() -> None:
    record = incoming(b"{not json", headers=(("traceparent", b"x"), ("source-offset", b"forged")))
    refused = decided(record)
    assert isinstance(refused, Rejection)
    reject = reject_record(record, refused)
    headers = dict(reject.headers)
    assert reject.key == b"key-1" and reject.value == b"{not json"
    assert headers["reject-reason"] == b"malformed-body"
    assert (headers["source-topic"], headers["source-partition"], headers["source-offset"]) == (
        b"requests",
        b"2",
        b"41",
    )
    assert headers["traceparent"] == b"x" and json.loads(headers["reject-errors"]) == []
