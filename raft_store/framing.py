"""Record framing shared by the WAL: `u32 length | u32 crc32c | u8 type | payload`.

Little-endian. `length` is the payload length (the type byte is not counted). The CRC32C covers
the type byte and the payload, so a record whose type was damaged cannot be misread as another
kind of record. Type 0 is never written: a zero-filled region therefore never parses as a record.
Zeros from some offset to the end of a file are *unwritten* space: a preallocated WAL segment's
room not used yet (raft_store/wal_spare.py), or what some file systems leave after a crash that
extended a file but did not write its blocks. Either way nothing there was ever synced.

The decoder only *classifies* what it sees (valid record, torn/incomplete, checksum mismatch);
`scan_log` applies the recovery policy of Protocol-Aware Recovery (FAST'18): a damaged region is
a torn tail only if it is at the very end of the last segment and nothing valid follows it;
anything else is corruption and must be reported, never truncated away, because truncating in
the middle of the log silently drops records that may have been acknowledged.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import crc32c as _crc32c

RECORD_HEADER = struct.Struct("<IIB")
HEADER_SIZE = RECORD_HEADER.size  # 9
# A single record larger than this is a corrupted length field, not a real record: it bounds how
# far a damaged length can send the decoder and how much memory a bogus length can claim.
MAX_PAYLOAD = 1 << 30

crc32c = _crc32c.crc32c

# CRC of the type byte alone, for every possible type: appending a record then costs one
# crc32c call per chunk with no concatenation of type byte and payload.
_TYPE_SEED: tuple[int, ...] = tuple(crc32c(bytes([t])) for t in range(256))


class CorruptLogError(Exception):
    """The log is damaged somewhere other than a torn tail; opening must stop.

    Carries where and why so an operator (or a repair-from-leader path) can act on it.
    """

    def __init__(self, path: Path | str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = Path(path)
        self.offset = offset
        self.reason = reason


def crc_seed(rtype: int) -> int:
    """Running CRC after the type byte, to continue with `crc32c(payload, seed)`."""
    return _TYPE_SEED[rtype]


def record_checksum(rtype: int, *chunks: bytes) -> int:
    crc = _TYPE_SEED[rtype]
    for chunk in chunks:
        crc = crc32c(chunk, crc)
    return crc


def encode_record(rtype: int, payload: bytes) -> bytes:
    """One framed record; for the hot path use `append_record` to avoid the concatenation."""
    if not 1 <= rtype <= 255:
        raise ValueError(f"record type {rtype} out of range 1..255")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return RECORD_HEADER.pack(len(payload), crc32c(payload, _TYPE_SEED[rtype]), rtype) + payload


def append_record(parts: list[bytes], rtype: int, head: bytes, body: bytes = b"") -> int:
    """Append a record split as `head + body` to `parts` without copying body; returns its size.

    Lets the WAL build a whole batch as a list of chunks and issue one `b"".join` and one write.
    """
    n = len(head) + len(body)
    if n > MAX_PAYLOAD:
        raise ValueError(f"payload of {n} bytes exceeds {MAX_PAYLOAD}")
    crc = crc32c(head, _TYPE_SEED[rtype])
    if body:
        crc = crc32c(body, crc)
    parts.append(RECORD_HEADER.pack(n, crc, rtype))
    parts.append(head)
    if body:
        parts.append(body)
    return HEADER_SIZE + n


class Record(NamedTuple):
    """A valid record: its payload is `buf[start:end]`; the next record starts at `end`."""

    offset: int
    rtype: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Torn:
    """The bytes at `offset` are an incomplete record: what a crash mid-write leaves."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class ChecksumMismatch:
    """A complete-looking record at `offset` whose CRC does not match: damage or a torn sector."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Unwritten:
    """Only zeros from `offset` to the end: space never written (see the module docstring)."""

    offset: int


Decoded = Record | Torn | ChecksumMismatch | Unwritten


def _zero_tail(buf: bytes, offset: int) -> bool:
    return buf.count(0, offset) == len(buf) - offset


def written_end(buf: bytes) -> int:
    """One past the last non-zero byte: no record can start at or after it, since every record's
    type byte is non-zero."""
    return len(buf.rstrip(b"\0"))


def decode_at(buf: bytes, offset: int) -> Decoded:
    """Classify the record starting at `offset` (which must be < len(buf))."""
    size = len(buf)
    if size - offset < HEADER_SIZE:
        if _zero_tail(buf, offset):
            return Unwritten(offset)
        return Torn(offset, f"incomplete header ({size - offset} of {HEADER_SIZE} bytes)")
    length, crc, rtype = RECORD_HEADER.unpack_from(buf, offset)
    if length == 0 and crc == 0 and rtype == 0 and _zero_tail(buf, offset):
        return Unwritten(offset)
    start = offset + HEADER_SIZE
    end = start + length
    if length > MAX_PAYLOAD:
        return ChecksumMismatch(offset, f"implausible length {length}")
    if end > size:
        return Torn(offset, f"record of {length} bytes runs {end - size} bytes past the end")
    actual = crc32c(memoryview(buf)[start:end], _TYPE_SEED[rtype])
    if actual != crc:
        return ChecksumMismatch(offset, f"checksum mismatch (stored {crc:#010x}, computed {actual:#010x})")
    return Record(offset, rtype, start, end)


def scan(buf: bytes, start: int = 0) -> tuple[list[Record], Torn | ChecksumMismatch | Unwritten | None]:
    """Decode records from `start` until the end or the first problem (which is returned)."""
    records: list[Record] = []
    offset = start
    size = len(buf)
    unpack_from = RECORD_HEADER.unpack_from
    view = memoryview(buf)
    seeds = _TYPE_SEED
    while offset < size:
        # Inline fast path for the common valid record; fall back to decode_at to classify.
        if size - offset >= HEADER_SIZE:
            length, crc, rtype = unpack_from(buf, offset)
            s = offset + HEADER_SIZE
            e = s + length
            if e <= size and crc32c(view[s:e], seeds[rtype]) == crc:
                records.append(Record(offset, rtype, s, e))
                offset = e
                continue
        problem = decode_at(buf, offset)
        if isinstance(problem, Record):  # only if the fast path and decode_at ever disagree
            records.append(problem)
            offset = problem.end
            continue
        return records, problem
    return records, None


def find_valid_record_after(buf: bytes, offset: int, known_types: frozenset[int]) -> int | None:
    """Offset of the first valid record of a known type starting anywhere after `offset`.

    This is what separates a torn tail from mid-log damage when a length field itself is hit:
    a crash only ever tears the end of what was written, so a valid record after the damage
    proves the damage is not a torn write.
    """
    size = len(buf)
    view = memoryview(buf)
    unpack_from = RECORD_HEADER.unpack_from
    # A record's type byte (at +8) is non-zero, so none starts in a preallocated segment's zeros.
    for pos in range(offset + 1, min(size - HEADER_SIZE, written_end(buf) - HEADER_SIZE) + 1):
        rtype = buf[pos + 8]
        if rtype not in known_types:
            continue
        length, crc, _ = unpack_from(buf, pos)
        end = pos + HEADER_SIZE + length
        if end > size:
            continue
        if crc32c(view[pos + HEADER_SIZE : end], _TYPE_SEED[rtype]) == crc:
            return pos
    return None


@dataclass(frozen=True, slots=True)
class TornTail:
    """A torn tail that recovery truncated: reported so the node can log and count it."""

    path: Path
    offset: int
    dropped_bytes: int
    reason: str


def scan_log(
    buf: bytes, path: Path, *, is_last: bool, known_types: frozenset[int]
) -> tuple[list[Record], TornTail | None]:
    """Apply the recovery policy to one segment's bytes.

    Returns the valid records and, for the last segment only, the torn tail to truncate (zeros
    after the records are unwritten space, neither torn nor reported).
    Raises CorruptLogError for anything that is not provably a torn tail.
    """
    records, problem = scan(buf)
    for rec in records:
        if rec.rtype not in known_types:
            raise CorruptLogError(path, rec.offset, f"unknown record type {rec.rtype} with a valid checksum")
    if problem is None:
        return records, None
    if isinstance(problem, Unwritten):
        if not is_last:
            raise CorruptLogError(path, problem.offset, "zero-filled tail in a segment that is not the last")
        return records, None
    later = find_valid_record_after(buf, problem.offset, known_types)
    if later is not None:
        raise CorruptLogError(path, problem.offset, f"{problem.reason}, followed by a valid record at offset {later}")
    if not is_last:
        raise CorruptLogError(path, problem.offset, f"{problem.reason} in a segment that is not the last")
    # A complete-length record with a bad CRC at the very end is indistinguishable from a crash
    # that persisted the file size but not the data; it is truncated like a torn write but the
    # reason says so, so the node can treat it with suspicion.
    return records, TornTail(path, problem.offset, len(buf) - problem.offset, problem.reason)
