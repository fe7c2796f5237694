"""One Kafka record of failed requests -> the store command the API would have built, or the
reason it is refused, and the rejects topic's record for a refused one.

A record's value is the body of ``POST /v1/requests``, validated by the same code
(submission/rules.py); its idempotency key is the ``idempotency-key`` header, or else the record's
key, with the API's rules; it is stored as ``{producer}:{key}`` under the ingest's configured
producer name. A ``traceparent`` header continues the producer's trace.

A refused record goes to the rejects topic as it came (same key, value and headers) with headers
that say why and where it was: ``reject-reason`` (a problem type of docs/api.md), ``reject-detail``,
``reject-errors`` (JSON, one entry per bad field), ``source-topic``, ``source-partition`` and
``source-offset`` (docs/kafka.md).

Must never: do I/O, read a clock, or put a rejected value into a reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from queues import Enqueue
from services.kafka.event_records import TRACE_HEADERS, Record
from submission.rules import Invalid, build_enqueue, check_key, parse_submission

HEADER_IDEMPOTENCY_KEY: Final = "idempotency-key"
HEADER_REASON: Final = "reject-reason"
HEADER_DETAIL: Final = "reject-detail"
HEADER_ERRORS: Final = "reject-errors"
HEADER_SOURCE_TOPIC: Final = "source-topic"
HEADER_SOURCE_PARTITION: Final = "source-partition"
HEADER_SOURCE_OFFSET: Final = "source-offset"
REJECT_HEADERS: Final = frozenset({HEADER_REASON, HEADER_DETAIL, HEADER_ERRORS, HEADER_SOURCE_TOPIC,
                                   HEADER_SOURCE_PARTITION, HEADER_SOURCE_OFFSET})  # fmt: skip
DETAIL_BYTES_MAX: Final = 1024
ERRORS_MAX: Final = 50


@dataclass(frozen=True, slots=True)
class Incoming:
    """A consumed record, as this module needs it (aiokafka's ConsumerRecord, in plain values)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    """A problem type name: malformed-body, invalid-request, idempotency-key-missing, ..."""
    detail: str
    errors: list[dict[str, str]] = field(default_factory=list)


def decide(
    record: Incoming, *, producer: str, body_bytes_max: int, now_ms: int, trace_headers: Mapping[str, str],
    callback_targets: Collection[str],
) -> Enqueue | Rejection:
    headers = dict(record.headers)
    raw_key = headers.get(HEADER_IDEMPOTENCY_KEY, record.key)
    if raw_key is None:
        return Rejection("idempotency-key-missing", "give the record a key or an idempotency-key header")
    if record.value is None:
        return Rejection("malformed-body", "the record has no value")
    if len(record.value) > body_bytes_max:
        return Rejection(
            "body-too-large", f"the value is {len(record.value)} bytes; at most {body_bytes_max} are taken"
        )
    try:
        key = check_key(raw_key.decode("utf-8"))
        submission = parse_submission(record.value)
        return build_enqueue(producer=producer, key=key, submission=submission,
                             trace_headers=_trace(headers) or trace_headers, now_ms=now_ms,
                             callback_targets=callback_targets)  # fmt: skip
    except UnicodeDecodeError:
        return Rejection("idempotency-key-invalid", "the key is not UTF-8")
    except Invalid as refused:
        return Rejection(refused.name, refused.detail, refused.errors)


def _trace(headers: Mapping[str, bytes]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in TRACE_HEADERS:
        value = headers.get(name)
        if value is not None:
            try:
                found[name] = value.decode("ascii")
            except UnicodeDecodeError:
                return {}
    return found if "traceparent" in found else {}


def reject_record(record: Incoming, rejection: Rejection) -> Record:
    """The record as it came, with why and where it was refused."""
    detail = rejection.detail.encode()[:DETAIL_BYTES_MAX]
    kept = [(name, value) for name, value in record.headers if name not in REJECT_HEADERS]
    headers = (
        *kept,
        (HEADER_REASON, rejection.reason.encode()),
        (HEADER_DETAIL, detail),
        (HEADER_ERRORS, msgspec.json.encode(rejection.errors[:ERRORS_MAX])),
        (HEADER_SOURCE_TOPIC, record.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(record.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
    )
    return Record(key=record.key or b"", value=record.value or b"", headers=headers)
