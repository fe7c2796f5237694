"""The events topic's records: one store event -> one Kafka record (key, JSON value, headers).

Schema version 1 (docs/kafka.md): the value is a JSON object
``{"v": 1, "seq", "log_index", "ts_ms", "type", "message_id", "kind", "ref_key", "data"}``; the
record's key is the message's ref key, so one business id's events share a partition and keep
their order; headers carry the set and its sequence number (consumers deduplicate by the pair), the type, the
schema, and the trace context the request was submitted with.

Every event type is published the same way, the ones this version does not know included: the
type is the store's name for it, and `data` is the event's data as the store keeps it.

Must never: do I/O, read a clock, or leave out an event's data (a consumer sees what the store saw).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import msgspec

from queues import Event

SCHEMA_VERSION: Final = 1
SCHEMA: Final = f"compensator.event/v{SCHEMA_VERSION}"
HEADER_SEQ: Final = "seq"
HEADER_TYPE: Final = "type"
HEADER_SCHEMA: Final = "schema"
HEADER_MESSAGE_ID: Final = "message-id"
HEADER_SET: Final = "set"
TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""W3C trace context, as the API stored it with the message (api/intake.py)."""


@dataclass(frozen=True, slots=True)
class MessageRef:
    """What an event's message tells its record: the ref key and the submission's trace context."""

    ref_key: str
    trace: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def record_key(event: Event, ref: MessageRef | None) -> bytes:
    """The ref key for a message's event. Without one (a kind's pause or resume, or an event of a
    message the store no longer holds and the publisher never saw) the kind: a kind's own events
    stay in order; store-wide events (tokens, documents, retention) have the kind "" and share the
    empty key."""
    return (ref.ref_key if ref is not None else event.kind).encode()


def event_record(event: Event, ref: MessageRef | None, set_id: int = 1) -> Record:
    """`set_id`: the set whose log the event is from. Sequence numbers are per set, so with several
    sets (docs/sets.md) a consumer deduplicates by (set, seq), and a request's public id is
    ``{set}-{message_id}``."""
    value = {
        "v": SCHEMA_VERSION, "set": set_id, "seq": event.seq, "log_index": event.log_index, "ts_ms": event.ts_ms,
        "type": event.type.value, "message_id": event.message_id, "kind": event.kind,
        "ref_key": None if ref is None else ref.ref_key, "data": event.data,
    }  # fmt: skip
    headers = [
        (HEADER_SET, str(set_id).encode()),
        (HEADER_SEQ, str(event.seq).encode()),
        (HEADER_TYPE, event.type.value.encode()),
        (HEADER_SCHEMA, SCHEMA.encode()),
        (HEADER_MESSAGE_ID, str(event.message_id).encode()),
    ]
    if ref is not None:
        headers += [(name, ref.trace[name].encode()) for name in TRACE_HEADERS if name in ref.trace]
    return Record(key=record_key(event, ref), value=msgspec.json.encode(value), headers=tuple(headers))


def seq_of(headers: Mapping[str, bytes]) -> int:
    """A record's sequence number from its headers: what a consumer deduplicates by."""
    return int(headers[HEADER_SEQ])
