"""The wire: every frame round-trips, and bytes that are not a frame end the connection."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raft_store import codec
from raft_store.codec import CodecError, FrameType
from raft_store.handshake import DialerHandshake
from raft_store.testing.credentials import cluster_auth
from raft_store.transport import Transport, dial
from raft_store.types import ConfState, Entry, EntryKind, Message, MessageType, Snapshot, SnapshotMeta

entries = st.lists(
    st.builds(Entry, st.integers(0, 2**40), st.integers(1, 2**40), st.sampled_from(EntryKind), st.binary(max_size=64)),
    max_size=5,
)
messages = st.builds(
    Message,
    type=st.sampled_from(MessageType), to=st.integers(1, 9), frm=st.integers(1, 9), term=st.integers(0, 2**40),
    log_term=st.integers(0, 2**40), index=st.integers(0, 2**40), entries=entries.map(tuple),
    commit=st.integers(0, 2**40), reject=st.booleans(), reject_hint=st.integers(0, 2**40),
    context=st.binary(max_size=16),
    snapshot=st.none() | st.builds(
        Snapshot, st.builds(SnapshotMeta, st.integers(0, 2**40), st.integers(0, 2**40),
                            st.builds(ConfState, st.frozensets(st.integers(1, 9)), st.frozensets(st.integers(10, 19))))),
)


@given(messages)
@settings(max_examples=300, deadline=None)
def test_raft_messages_round_trip(m: Message) -> None:
    assert codec.decode_message(codec.encode_message(m)) == m


@given(st.binary(max_size=200))
@settings(max_examples=500, deadline=None)
def test_garbage_never_decodes_silently_into_something_else(blob: bytes) -> None:
    for decode in (codec.decode_message, codec.decode_propose, codec.decode_result, codec.decode_chunk):
        try:
            decoded = decode(blob)
        except CodecError:
            continue
        # Whatever decodes must re-encode to the same bytes (no lenient parsing).
        encode = {codec.decode_message: codec.encode_message, codec.decode_propose: codec.encode_propose,
                  codec.decode_result: codec.encode_result, codec.decode_chunk: codec.encode_chunk}[decode]
        assert encode(decoded) == blob  # type: ignore[operator]


@given(st.integers(0, 2**63), st.booleans(), st.binary(max_size=64), st.integers(0, 2**63), st.integers(0, 120_000),
       st.booleans())  # fmt: skip
def test_reads_round_trip_and_a_read_that_does_not_wait_keeps_its_old_bytes(
    request_id: int, linearizable: bool, query: bytes, after: int, wait_ms: int, wakes_one: bool
) -> None:
    plain = codec.Read(request_id, linearizable, query)
    assert codec.encode_read(plain) == struct.pack(">QB", request_id, linearizable) + query
    assert codec.decode_read(codec.encode_read(plain)) == plain
    waiting = codec.Read(request_id, linearizable, query, after, wait_ms, wakes_one)
    decoded = codec.decode_read(codec.encode_read(waiting))
    expected = codec.Read(request_id, linearizable, query, after, min(wait_ms, codec.READ_WAIT_MS_MAX), wakes_one)
    assert decoded == (expected if wait_ms else plain)


def test_truncated_message_is_refused() -> None:
    m = Message(MessageType.APP, to=2, frm=1, term=3, entries=(Entry(3, 1, EntryKind.NORMAL, b"payload"),))
    blob = codec.encode_message(m)
    for cut in range(len(blob)):
        with pytest.raises(CodecError):
            codec.decode_message(blob[:cut])


async def test_a_peer_sending_garbage_is_disconnected(tmp_path: Path) -> None:
    received: list[bytes] = []
    auth = cluster_auth(tmp_path)
    transport = Transport(1, ("127.0.0.1", 0), {}, lambda s, t, b: received.append(b), lambda c, t, b: None, auth=auth)
    await transport.start()
    assert transport._server is not None
    port = transport._server.sockets[0].getsockname()[1]
    key = auth.secrets.presented()
    for opening in (b"GET / HTTP/1.1\r\n\r\n", DialerHandshake(key, 2, 99).hello(),
                    codec.frame(FrameType.HELLO, struct.pack(">5sQQ", b"RSTR\x01", 2, 1))):  # fmt: skip
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(opening)
        await writer.drain()
        assert b"\x00" not in (await asyncio.wait_for(reader.read(), 5))[5:]  # at most REFUSED, then it hung up
        writer.close()
    assert transport.refused == {"malformed": 1, "cluster": 1, "version": 1}
    # Let in, then an unknown frame type: disconnected.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await dial(reader, writer, DialerHandshake(key, 2, 1))
    writer.write(struct.pack(">IB", 10, 250) + b"x" * 9)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # A well-formed peer frame still gets through afterwards.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await dial(reader, writer, DialerHandshake(key, 2, 1))
    m = Message(MessageType.HEARTBEAT, to=1, frm=2, term=1)
    writer.write(codec.frame(FrameType.RAFT, codec.encode_message(m)))
    await writer.drain()
    for _ in range(100):
        if received:
            break
        await asyncio.sleep(0.01)
    assert received and codec.decode_message(received[0]) == m
    writer.close()
    await transport.close()
