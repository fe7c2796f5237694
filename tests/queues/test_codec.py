"""Wire compatibility: commands are strict, answers are lenient.

A replica must refuse a command field it does not know (dropping part of an intent in silence
would apply something else than was asked); a client must read an answer from a newer node that
added a field (as payload_hash was added to grants), or every upgrade would have to replace the
clients and the nodes at the same instant.
"""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from queues import codec
from queues import query_codec as qc
from queues.model import Code, ErrorResult, LeaseResult


def _newer(body: dict[str, object], version: int) -> bytes:
    return bytes([version]) + msgspec.msgpack.encode(body)


def test_a_command_with_a_field_this_version_does_not_know_is_refused() -> None:
    data = _newer({"t": "ack", "message_id": 1, "token": 2, "priority": "high"}, codec.CODEC_VERSION)
    result = codec.decode_command(data)
    assert isinstance(result, ErrorResult) and result.code is Code.INVALID and "priority" in result.detail


def test_a_result_from_a_newer_node_with_more_fields_is_read_for_what_it_has() -> None:
    grant = {
        "message_id": 7, "token": 9, "kind": "transfer", "idempotency_key": "k", "ref_key": "r", "payload": b"p",
        "headers": {}, "attempt": 1, "due_ms": 5, "deadline_ms": 6, "payload_hash": b"h", "shard": 3,
    }  # fmt: skip
    result = codec.decode_result(_newer({"t": "lease", "code": 0, "grants": [grant], "expired": 0, "zone": "a"},
                                        codec.CODEC_VERSION))
    assert isinstance(result, LeaseResult) and result.code is Code.OK
    assert [(g.message_id, g.token, g.payload, g.payload_hash) for g in result.grants] == [(7, 9, b"p", b"h")]


def test_a_grant_from_an_older_node_has_no_hash_and_an_answer_may_grow_too() -> None:
    grant = {
        "message_id": 7, "token": 9, "kind": "transfer", "idempotency_key": "k", "ref_key": "r", "payload": b"p",
        "headers": {}, "attempt": 1, "due_ms": 5, "deadline_ms": 6,
    }  # fmt: skip
    result = codec.decode_result(_newer({"t": "lease", "code": 0, "grants": [grant]}, codec.CODEC_VERSION))
    assert isinstance(result, LeaseResult) and result.grants[0].payload_hash == b""
    answer = qc.decode_answer(_newer({"r": "events_digest", "last_seq": 4, "digest": b"d", "algorithm": "x"},
                                     qc.QUERY_CODEC_VERSION))
    assert isinstance(answer, qc.DigestAnswer) and (answer.last_seq, answer.digest) == (4, b"d")


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=10))
def test_stored_headers_are_their_keys_sorted_whatever_order_they_came_in(headers: dict[str, str]) -> None:
    """The bytes every replica stores for a message's headers: its digests compare them."""
    canonical = msgspec.msgpack.encode(dict(sorted(headers.items())))
    assert codec.encode_headers(headers) == canonical
    assert codec.encode_headers(dict(reversed(list(headers.items())))) == canonical
    assert codec.decode_headers(canonical) == headers
