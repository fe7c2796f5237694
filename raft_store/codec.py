"""Binary frames for node-to-node and client-to-node traffic. No pickle: a peer's bytes are data.

Every frame on a connection is `u32 length | u8 type | body`. Decoding validates lengths and
enum values and returns frozen values, or raises CodecError; the transport disconnects a peer
whose bytes do not decode (validate at the gateway, trust inside).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from raft_store.types import ConfState, Entry, EntryKind, Message, MessageType, Snapshot, SnapshotMeta

FRAME_HEADER = struct.Struct(">IB")
FRAME_BYTES_MAX = 64 << 20
HELLO_MAGIC = b"RSTR\x03"  # version 3: the clock trailer on Raft messages; 2 was the handshake alone


class CodecError(ValueError):
    """Bytes that are not a valid frame: the sender is broken or hostile."""


class FrameType(enum.IntEnum):
    HELLO = 1  # magic, u64 sender node id (0 for a client), u64 cluster id, key id, nonce
    CHALLENGE = 4  # the node's nonce and proof (raft_store/handshake.py)
    AUTH = 5  # the dialer's proof
    WELCOME = 6  # the node let the dialer in
    REFUSED = 7  # the node did not; it closes the connection
    RAFT = 2  # one Message
    SNAP_CHUNK = 3  # a piece of a snapshot file on its way to a follower
    PROPOSE = 10  # a batch of client commands
    RESULT = 11  # the answers to one PROPOSE or READ
    READ = 12  # a read request: linearizable (ReadIndex) or stale-ok
    STATUS = 13  # ask for the node's status
    STATUS_RESULT = 14
    ADMIN = 15  # membership change or leader transfer


FRAME_TYPES: dict[int, FrameType] = {t.value: t for t in FrameType}
"""A frame's type byte to its type: a dict lookup, where `FrameType(byte)` is two Python calls."""

# ---- Raft messages ---------------------------------------------------------------------
_MESSAGE_TYPES: dict[int, MessageType] = {t.value: t for t in MessageType}
_MSG = struct.Struct(">BQQQQQQ?QI")  # type, to, frm, term, log_term, index, commit, reject, hint, n
_ENTRY = struct.Struct(">QQBI")
_META = struct.Struct(">QQHH")
_CLOCKS = struct.Struct(">QQ")  # wall_ms, clock_ms: an optional trailer, absent when both are 0


def _encode_meta(meta: SnapshotMeta) -> bytes:
    voters, learners = sorted(meta.conf.voters), sorted(meta.conf.learners)
    return _META.pack(meta.index, meta.term, len(voters), len(learners)) + b"".join(
        n.to_bytes(8, "big") for n in (*voters, *learners)
    )


def _decode_meta(buf: bytes, offset: int) -> tuple[SnapshotMeta, int]:
    if offset + _META.size > len(buf):
        raise CodecError("snapshot meta truncated")
    index, term, n_voters, n_learners = _META.unpack_from(buf, offset)
    offset += _META.size
    end = offset + 8 * (n_voters + n_learners)
    if end > len(buf):
        raise CodecError("snapshot membership truncated")
    ids = [int.from_bytes(buf[i : i + 8], "big") for i in range(offset, end, 8)]
    conf = ConfState(voters=frozenset(ids[:n_voters]), learners=frozenset(ids[n_voters:]))
    return SnapshotMeta(index=index, term=term, conf=conf), end


def encode_message(m: Message, *, wall_ms: int | None = None, clock_ms: int | None = None) -> bytes:
    """`wall_ms`/`clock_ms` stand in for the message's own (the runner stamps them as it sends)."""
    wall_ms = m.wall_ms if wall_ms is None else wall_ms
    clock_ms = m.clock_ms if clock_ms is None else clock_ms
    parts = [
        _MSG.pack(m.type, m.to, m.frm, m.term, m.log_term, m.index, m.commit, m.reject, m.reject_hint, len(m.entries))
    ]
    pack = _ENTRY.pack
    for e in m.entries:
        parts.append(pack(e.term, e.index, e.kind, len(e.data)))
        parts.append(e.data)
    parts.append(len(m.context).to_bytes(4, "big"))
    parts.append(m.context)
    if m.snapshot is not None:
        parts.append(b"\x01")
        parts.append(_encode_meta(m.snapshot.meta))
    else:
        parts.append(b"\x00")
    if wall_ms or clock_ms:
        parts.append(_CLOCKS.pack(wall_ms, clock_ms))
    return b"".join(parts)


def decode_message(buf: bytes) -> Message:
    try:
        return _decode_message(buf)
    except (struct.error, ValueError) as exc:
        raise CodecError(f"bad raft message: {exc}") from None


def _decode_message(buf: bytes) -> Message:
    if len(buf) < _MSG.size:
        raise CodecError("raft message truncated")
    mtype, to, frm, term, log_term, index, commit, reject, hint, count = _MSG.unpack_from(buf, 0)
    offset = _MSG.size
    if count > (len(buf) - offset) // _ENTRY.size:
        raise CodecError(f"message claims {count} entries")
    entries = []
    unpack = _ENTRY.unpack_from
    size = _ENTRY.size
    for _ in range(count):
        if offset + size > len(buf):
            raise CodecError("entry header truncated")
        e_term, e_index, kind, length = unpack(buf, offset)
        offset += size
        if offset + length > len(buf):
            raise CodecError("entry data truncated")
        entries.append(Entry(e_term, e_index, EntryKind(kind), buf[offset : offset + length]))
        offset += length
    if offset + 4 > len(buf):
        raise CodecError("context length truncated")
    clen = int.from_bytes(buf[offset : offset + 4], "big")
    offset += 4
    context = buf[offset : offset + clen]
    if len(context) != clen:
        raise CodecError("context truncated")
    offset += clen
    if offset >= len(buf):
        raise CodecError("snapshot flag missing")
    snapshot = None
    if buf[offset] == 1:
        meta, offset = _decode_meta(buf, offset + 1)
        snapshot = Snapshot(meta=meta)
    else:
        offset += 1
    wall_ms = clock_ms = 0
    if len(buf) - offset == _CLOCKS.size:
        wall_ms, clock_ms = _CLOCKS.unpack_from(buf, offset)
        offset += _CLOCKS.size
    if offset != len(buf):
        raise CodecError("trailing bytes after raft message")
    message_type = _MESSAGE_TYPES.get(mtype)
    if message_type is None:
        raise CodecError(f"bad raft message: unknown message type {mtype}")
    return Message(
        message_type,
        to=to,
        frm=frm,
        term=term,
        log_term=log_term,
        index=index,
        entries=tuple(entries),
        commit=commit,
        reject=bool(reject),
        reject_hint=hint,
        context=bytes(context),
        snapshot=snapshot,
        wall_ms=wall_ms,
        clock_ms=clock_ms,
    )


# ---- snapshot chunks -----------------------------------------------------------------
_CHUNK = struct.Struct(">QQQQ?")  # frm, to, term, offset, last


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    frm: int
    to: int
    term: int
    meta: SnapshotMeta
    offset: int
    last: bool
    data: bytes


def encode_chunk(c: SnapshotChunk) -> bytes:
    return _CHUNK.pack(c.frm, c.to, c.term, c.offset, c.last) + _encode_meta(c.meta) + c.data


def decode_chunk(buf: bytes) -> SnapshotChunk:
    try:
        frm, to, term, offset, last = _CHUNK.unpack_from(buf, 0)
        meta, pos = _decode_meta(buf, _CHUNK.size)
    except struct.error as exc:
        raise CodecError(f"bad snapshot chunk: {exc}") from None
    return SnapshotChunk(frm, to, term, meta, offset, last, bytes(buf[pos:]))


# ---- client protocol -------------------------------------------------------------------
class Status(enum.IntEnum):
    """How a node answered one request. NOT_LEADER, DROPPED and ERROR mean the node did not put
    the request in its log, so it was certainly not applied through this node; IN_DOUBT means it
    did and cannot tell the outcome. A client needs the difference to tell its caller whether a
    command it gave up on may still apply."""

    OK = 0
    NOT_LEADER = 1  # not proposed here; leader_hint says where to go (0: unknown, retry later)
    DROPPED = 2  # the leader could not take it now (transfer, overload): retry
    ERROR = 3  # the request itself is wrong: do not retry
    IN_DOUBT = 4  # proposed, then this node stopped leading (or stopped) before it committed:
    # the entry may still commit under the next leader (leader_hint); retry on the same session


_STATUSES = tuple(Status)
_PROPOSE = struct.Struct(">QI")  # request id, count
_COMMAND = struct.Struct(">QQI")  # client id, seq, length
_RESULT = struct.Struct(">QBQI")  # request id, status, leader hint, count


@dataclass(frozen=True, slots=True)
class Propose:
    request_id: int
    commands: tuple[tuple[int, int, bytes], ...]  # (client_id, seq, data)


@dataclass(frozen=True, slots=True)
class Result:
    request_id: int
    status: Status
    leader_hint: int
    results: tuple[bytes, ...]


def encode_propose(p: Propose) -> bytes:
    parts = [_PROPOSE.pack(p.request_id, len(p.commands))]
    for client_id, seq, data in p.commands:
        parts.append(_COMMAND.pack(client_id, seq, len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_propose(buf: bytes) -> Propose:
    try:
        request_id, count = _PROPOSE.unpack_from(buf, 0)
        offset = _PROPOSE.size
        if count > (len(buf) - offset) // _COMMAND.size:
            raise CodecError(f"propose claims {count} commands")
        commands = []
        for _ in range(count):
            client_id, seq, length = _COMMAND.unpack_from(buf, offset)
            offset += _COMMAND.size
            data = bytes(buf[offset : offset + length])
            if len(data) != length:
                raise CodecError("command truncated")
            commands.append((client_id, seq, data))
            offset += length
    except struct.error as exc:
        raise CodecError(f"bad propose frame: {exc}") from None
    if offset != len(buf):
        raise CodecError("trailing bytes after propose")
    return Propose(request_id, tuple(commands))


def encode_result(r: Result) -> bytes:
    parts = [_RESULT.pack(r.request_id, r.status, r.leader_hint, len(r.results))]
    for item in r.results:
        parts.append(len(item).to_bytes(4, "big"))
        parts.append(item)
    return b"".join(parts)


def decode_result(buf: bytes) -> Result:
    try:
        request_id, status, hint, count = _RESULT.unpack_from(buf, 0)
        offset = _RESULT.size
        if count > (len(buf) - offset) // 4:
            raise CodecError(f"result claims {count} items")
        results = []
        for _ in range(count):
            (length,) = _LENGTH.unpack_from(buf, offset)
            offset += 4
            item = bytes(buf[offset : offset + length])
            if len(item) != length:
                raise CodecError("result item truncated")
            results.append(item)
            offset += length
        if offset != len(buf):
            raise CodecError("trailing bytes after result")
        return Result(request_id, _STATUSES[status], hint, tuple(results))
    except (struct.error, ValueError, IndexError) as exc:
        raise CodecError(f"bad result frame: {exc}") from None


def result_request_id(buf: bytes) -> int:
    """The request id of a RESULT body, without decoding the rest (the client's dispatch)."""
    if len(buf) < 8:
        raise CodecError("result frame truncated")
    return int.from_bytes(buf[:8], "big")


_LENGTH = struct.Struct(">I")
_READ = struct.Struct(">QB")  # request id, flags (READ_LINEARIZABLE, READ_WAITS)
_READ_WAIT = struct.Struct(">QI")  # with READ_WAITS: answer once the applied index passes this, or after this many ms
READ_LINEARIZABLE = 0x01
READ_WAITS = 0x02
READ_WAKES_ONE = 0x04
READ_WAIT_MS_MAX = 60_000


@dataclass(frozen=True, slots=True)
class Read:
    request_id: int
    linearizable: bool
    query: bytes
    wait_after_index: int = 0
    """With `wait_ms`: the node holds the read until its applied index is past this one (a
    command applied since the caller's last answer), then answers it from that state."""
    wait_ms: int = 0
    """How long the node may hold the read (0: answer at once); it answers when it runs out."""
    wakes_one: bool = False
    """Of the waiting reads with the same query, one is answered per applied index (the oldest);
    the rest wait for the next apply: idle workers asking the same question do not all rush to
    lease the one message an enqueue made ready."""


def encode_read(r: Read) -> bytes:
    """A read waits only when asked to: a frame without READ_WAITS is the same bytes as a node
    that knows no waiting reads expects (flags 0 or 1)."""
    if r.wait_ms <= 0:
        return _READ.pack(r.request_id, READ_LINEARIZABLE if r.linearizable else 0) + r.query
    flags = READ_WAITS | (READ_LINEARIZABLE if r.linearizable else 0) | (READ_WAKES_ONE if r.wakes_one else 0)
    return (
        _READ.pack(r.request_id, flags)
        + _READ_WAIT.pack(r.wait_after_index, min(r.wait_ms, READ_WAIT_MS_MAX))
        + r.query
    )


def decode_read(buf: bytes) -> Read:
    try:
        request_id, flags = _READ.unpack_from(buf, 0)
        if not flags & READ_WAITS:
            return Read(request_id, bool(flags & READ_LINEARIZABLE), bytes(buf[_READ.size :]))
        after, wait_ms = _READ_WAIT.unpack_from(buf, _READ.size)
    except struct.error as exc:
        raise CodecError(f"bad read frame: {exc}") from None
    if flags & ~(READ_LINEARIZABLE | READ_WAITS | READ_WAKES_ONE):
        raise CodecError(f"bad read frame: unknown flags {flags:#x}")
    start = _READ.size + _READ_WAIT.size
    return Read(
        request_id, bool(flags & READ_LINEARIZABLE), bytes(buf[start:]), after, min(wait_ms, READ_WAIT_MS_MAX),
        bool(flags & READ_WAKES_ONE),
    )  # fmt: skip


def frame(ftype: FrameType, body: bytes) -> bytes:
    if len(body) + 1 > FRAME_BYTES_MAX:
        raise CodecError(f"frame of {len(body)} bytes exceeds {FRAME_BYTES_MAX}")
    return FRAME_HEADER.pack(len(body) + 1, ftype) + body
