"""Every event type, the ones the publisher has never heard of included, becomes a record of the
versioned schema: nothing is mapped by a closed table that a new type could miss."""

from __future__ import annotations

import json

import pytest

from queues import Event, EventType
from services.kafka.event_records import SCHEMA, MessageRef, event_record, seq_of


@pytest.mark.parametrize("event_type", list(EventType))
def test_every_event_type_is_a_record_with_its_seq_type_and_schema(event_type: EventType) -> None:
    event = Event(seq=7, log_index=3, ts_ms=1000, type=event_type, message_id=5, kind="transfer",
                  data={"reason": "x", "attempt": 2, "late": False, "due_ms": None})  # fmt: skip
    record = event_record(event, MessageRef("order-9", {"traceparent": "00-aa-bb-01", "other": "no"}), 2)
    headers = dict(record.headers)
    assert record.key == b"order-9" and seq_of(headers) == 7 and headers["set"] == b"2"  # seqs are per set
    assert headers["type"] == event_type.value.encode() and headers["schema"] == SCHEMA.encode()
    assert headers["traceparent"] == b"00-aa-bb-01" and "other" not in headers
    assert json.loads(record.value) == {"v": 1, "set": 2, "seq": 7, "log_index": 3, "ts_ms": 1000, "type": event_type.value,
                                        "message_id": 5, "kind": "transfer", "ref_key": "order-9",
                                        "data": {"reason": "x", "attempt": 2, "late": False, "due_ms": None}}  # fmt: skip


def test_events_without_a_ref_key_are_keyed_by_their_kind_and_say_so() -> None:
    paused = Event(seq=1, log_index=1, ts_ms=1, type=EventType.PAUSED, message_id=0, kind="transfer", data={})
    tokens = Event(seq=2, log_index=1, ts_ms=1, type=EventType.TOKEN_PUT, message_id=0, kind="", data={})
    assert (
        event_record(paused, None).key == b"transfer"
        and json.loads(event_record(paused, None).value)["ref_key"] is None
    )
    assert event_record(tokens, None).key == b""
    assert "traceparent" not in dict(event_record(paused, None).headers)
