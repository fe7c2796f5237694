"""Segmented, checksummed write-ahead log for the Raft hard state and log entries.

Called from one dedicated thread (never the event loop): `append`/`set_hard_state` only buffer
a write, `sync` makes everything since the previous sync durable with one fsync, so many
appends share one fsync (group commit). An acknowledgement may leave the node only after the
`sync` covering it has returned.

The log is replayed, not indexed: recovery applies the records of every segment in order with
the same rules the live object applies, so what is on disk always means exactly one state.
See docs/storage.md for the format and the recovery rules.
"""

from __future__ import annotations

import math
import re
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, pairwise
from pathlib import Path

from raft_store import framing
from raft_store.files import (
    AppendFile,
    FaultHook,
    FileSystem,
    FsyncFailedError,
    SimulatedCrash,
    WalFailedError,
    private_dir,
)
from raft_store.framing import CorruptLogError, TornTail
from raft_store.types import Entry, EntryKind, HardState

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "CorruptLogError",
    "FaultHook",
    "FsyncFailedError",
    "GroupCommitPolicy",
    "Recovered",
    "SimulatedCrash",
    "SyncStats",
    "TornTail",
    "Wal",
    "WalFailedError",
]

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024

# Record types (type 0 is never written, see framing).
REC_ENTRY = 1  # term u64, index u64, kind u8, data
REC_HARD_STATE = 2  # term u64, vote u64, commit u64
REC_TRUNCATE = 3  # from_index u64: drop entries with index >= from_index
REC_COMPACT = 4  # index u64, term u64, reset u8: the log now starts after index
KNOWN_TYPES = frozenset({REC_ENTRY, REC_HARD_STATE, REC_TRUNCATE, REC_COMPACT})

_ENTRY = struct.Struct("<QQB")
_HARD_STATE = struct.Struct("<QQQ")
_TRUNCATE = struct.Struct("<Q")
_COMPACT = struct.Struct("<QQB")
_MAX_DATA = framing.MAX_PAYLOAD - _ENTRY.size

_SEGMENT_NAME = re.compile(r"^(\d{16})-(\d{20})\.wal$")


def segment_name(seq: int, first_index: int) -> str:
    """Zero-padded so lexical order is creation order; first index helps humans and checks."""
    return f"{seq:016d}-{first_index:020d}.wal"


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What one sync covered, for the fsync-batch-size metric."""

    entries: int
    bytes: int
    fsyncs: int


@dataclass(frozen=True, slots=True)
class Recovered:
    hard_state: HardState
    entries: list[Entry]
    first_index: int
    torn_tail: TornTail | None
    snapshot_index: int
    snapshot_term: int


@dataclass(frozen=True, slots=True)
class GroupCommitPolicy:
    """When the runner should call `sync`: a batch is full, or its oldest write waited too long.

    Count pending hard-state changes as pending entries too: a vote must be fsynced before the
    reply leaves, just like an entry.
    """

    max_entries: int = 256
    max_delay_ms: float = 2.0

    def validate(self) -> None:
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {self.max_entries}")
        if not math.isfinite(self.max_delay_ms) or self.max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must be finite and >= 0, got {self.max_delay_ms}")

    def should_sync(self, pending_entries: int, pending_age_ms: float) -> bool:
        if pending_entries <= 0:
            return False
        return pending_entries >= self.max_entries or pending_age_ms >= self.max_delay_ms


@dataclass(slots=True)
class _Segment:
    seq: int
    first_index: int
    path: Path
    max_index: int  # highest entry index ever written in it; decides when compaction may delete it


class _Replay:
    """Applies records in order; used by recovery, mirrored by the live Wal methods."""

    def __init__(self) -> None:
        self.offset = 0  # index before the first entry held in `entries`
        self.entries: list[Entry] = []
        self.snap_index = 0
        self.snap_term = 0
        self.hs = HardState()

    def last(self) -> int:
        return self.offset + len(self.entries)

    def segment(self, seg: _Segment, buf: bytes, records: list[framing.Record], first: bool) -> None:
        path = seg.path
        if first:
            # Entries before this segment were deleted by compaction; a later (or this segment's)
            # compaction record must cover them, which the final check in Wal.open verifies.
            self.offset = seg.first_index - 1
        elif seg.first_index != self.last() + 1:
            raise CorruptLogError(
                path, 0, f"segment starts at index {seg.first_index} but the log ends at {self.last()}"
            )
        entries = self.entries
        unpack_entry = _ENTRY.unpack_from
        for rec in records:
            rtype = rec.rtype
            if rtype == REC_ENTRY:
                term, index, kind = unpack_entry(buf, rec.start)
                if index != self.offset + len(entries) + 1:
                    raise CorruptLogError(
                        path, rec.offset, f"entry {index} does not follow {self.offset + len(entries)}"
                    )
                try:
                    ekind = EntryKind(kind)
                except ValueError:
                    raise CorruptLogError(path, rec.offset, f"unknown entry kind {kind}") from None
                entries.append(Entry(term, index, ekind, buf[rec.start + _ENTRY.size : rec.end]))
                if index > seg.max_index:
                    seg.max_index = index
            elif rtype == REC_HARD_STATE:
                self.hs = HardState(*_HARD_STATE.unpack_from(buf, rec.start))
            elif rtype == REC_TRUNCATE:
                (frm,) = _TRUNCATE.unpack_from(buf, rec.start)
                last = self.last()
                if frm <= self.snap_index or frm > last:
                    raise CorruptLogError(path, rec.offset, f"truncation at {frm} outside ({self.snap_index}, {last}]")
                if frm <= self.offset:
                    # Only possible in the first retained segment: the truncated entries were in
                    # deleted segments; the compaction that deleted them covers this range.
                    entries.clear()
                    self.offset = frm - 1
                else:
                    del entries[frm - self.offset - 1 :]
            elif rtype == REC_COMPACT:
                index, term, reset = _COMPACT.unpack_from(buf, rec.start)
                if index < self.snap_index or (index == self.snap_index and term != self.snap_term and index):
                    raise CorruptLogError(
                        path,
                        rec.offset,
                        f"compaction to {index}/{term} after {self.snap_index}/{self.snap_term}",
                    )
                if reset:
                    entries.clear()
                    self.offset = index
                elif index > self.offset:
                    if index > self.last():
                        raise CorruptLogError(path, rec.offset, f"compaction to {index} past the log end")
                    del entries[: index - self.offset]
                    self.offset = index
                self.snap_index, self.snap_term = index, term
            else:  # pragma: no cover - scan_log rejects unknown types
                raise CorruptLogError(path, rec.offset, f"unknown record type {rtype}")


class Wal:
    """The durable log of one Raft node. Not thread-safe: one thread owns it."""

    def __init__(
        self,
        directory: Path,
        fs: FileSystem,
        segment_bytes: int,
        segments: list[_Segment],
        replay: _Replay,
    ) -> None:
        self._dir = directory
        self._fs = fs
        self._segment_bytes = segment_bytes
        self._segments = segments
        self._cur: AppendFile | None = fs.open_append(segments[-1].path) if segments else None
        self._offset = replay.offset
        self._terms = array("Q", [e.term for e in replay.entries])
        self._snap_index = replay.snap_index
        self._snap_term = replay.snap_term
        self._hs = replay.hs
        self._pending_entries = 0
        self._pending_records = 0
        self._pending_bytes = 0
        self._created_since_sync = False
        self._closed = False

    # ------------------------------------------------------------------ recovery

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        volatile: bool = False,
        fault: FaultHook | None = None,
    ) -> tuple[Wal, Recovered]:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        directory = Path(directory)
        fs = FileSystem(volatile=volatile, fault=fault)
        if not directory.exists():
            private_dir(directory)
            fs.fsync_dir(directory.parent)

        segments: list[_Segment] = []
        for p in directory.iterdir():
            if p.suffix != ".wal":
                continue
            m = _SEGMENT_NAME.match(p.name)
            if m is None:
                raise CorruptLogError(p, 0, "unrecognised segment name")
            segments.append(_Segment(int(m.group(1)), int(m.group(2)), p, 0))
        segments.sort(key=lambda s: s.seq)
        for prev, nxt in pairwise(segments):
            if nxt.seq != prev.seq + 1:
                raise CorruptLogError(nxt.path, 0, f"segment {prev.seq + 1} is missing")

        # One segment in memory at a time: scan, check its header, replay, move on.
        replay = _Replay()
        drop_last = False
        last_torn: TornTail | None = None
        last_size = 0
        for i, seg in enumerate(segments):
            is_last = i == len(segments) - 1
            buf = seg.path.read_bytes()
            records, torn_here = framing.scan_log(buf, seg.path, is_last=is_last, known_types=KNOWN_TYPES)
            # Every segment starts with a hard-state and a compaction record, written in the same
            # write as its first data. Only the last segment may lack them, and only as the result
            # of a crash before its first sync: then nothing in it was ever durable and it goes.
            has_header = len(records) >= 2 and records[0].rtype == REC_HARD_STATE and records[1].rtype == REC_COMPACT
            if not has_header:
                partial = not records or (len(records) == 1 and records[0].rtype == REC_HARD_STATE)
                if not (is_last and partial):
                    raise CorruptLogError(seg.path, 0, "segment does not start with its header records")
                drop_last = True
            else:
                replay.segment(seg, buf, records, first=i == 0)
            if is_last:
                last_torn, last_size = torn_here, len(buf)
            del buf, records
        if replay.offset != replay.snap_index:
            raise CorruptLogError(
                segments[0].path,
                0,
                f"entries {replay.snap_index + 1}..{replay.offset} are missing "
                f"(compaction point {replay.snap_index}, first segment starts at {segments[0].first_index})",
            )

        # Only now, with the whole log verified, change files.
        torn: TornTail | None = None
        if drop_last:
            last = segments.pop()
            fs.remove(last.path)
            fs.fsync_dir(directory)
            if last_size:
                reason = last_torn.reason if last_torn else "no data after the header"
                torn = TornTail(last.path, 0, last_size, f"segment header incomplete: {reason}")
        elif last_torn is not None:
            torn = last_torn
            fs.truncate(torn.path, torn.offset)

        wal = cls(directory, fs, segment_bytes, segments, replay)
        recovered = Recovered(
            hard_state=replay.hs,
            entries=replay.entries,
            first_index=replay.offset + 1,
            torn_tail=torn,
            snapshot_index=replay.snap_index,
            snapshot_term=replay.snap_term,
        )
        return wal, recovered

    # ------------------------------------------------------------------ queries

    def last_index(self) -> int:
        return self._offset + len(self._terms)

    def first_index(self) -> int:
        """First index the log can hold: one past the last compaction (snapshot) point."""
        return self._offset + 1

    @property
    def pending_entries(self) -> int:
        return self._pending_entries

    @property
    def pending_records(self) -> int:
        """Entries plus other records (hard state, truncation) not yet fsynced."""
        return self._pending_records

    @property
    def segment_paths(self) -> list[Path]:
        return [s.path for s in self._segments]

    # ------------------------------------------------------------------ writes

    def _check(self) -> None:
        if self._closed:
            raise ValueError("WAL is closed")
        self._fs.check()

    def _roll_if_needed(self, head: list[bytes]) -> int:
        """Start a new segment when the current one is full *and* fully synced.

        Rolling only at sync boundaries keeps "one sync = one file fsync (+ one directory fsync
        if a segment was created)", and means no un-synced data ever sits in a closed segment.
        A segment can therefore exceed segment_bytes by up to one group-commit batch.
        """
        cur = self._cur
        if cur is not None and (cur.size < self._segment_bytes or self._pending_bytes > 0):
            return 0
        seq = self._segments[-1].seq + 1 if self._segments else 1
        first = self.last_index() + 1
        path = self._dir / segment_name(seq, first)
        new = self._fs.create(path)
        if cur is not None:
            cur.close()
        self._cur = new
        self._segments.append(_Segment(seq, first, path, 0))
        self._created_since_sync = True
        hs = self._hs
        n = framing.append_record(head, REC_HARD_STATE, _HARD_STATE.pack(hs.term, hs.vote, hs.commit))
        n += framing.append_record(head, REC_COMPACT, _COMPACT.pack(self._snap_index, self._snap_term, 0))
        self._pending_records += 2
        return n

    def append(self, entries: Sequence[Entry]) -> None:
        """Buffer entries (not durable until `sync`); an index <= last_index overwrites from there."""
        self._check()
        if not entries:
            return
        first = entries[0].index
        last = self.last_index()
        if first > last + 1:
            raise ValueError(f"append at {first} leaves a gap after {last}")
        if first <= self._snap_index:
            raise ValueError(f"append at {first} would overwrite compacted entries (<= {self._snap_index})")

        parts: list[bytes] = []
        ap = parts.append
        pack_entry = _ENTRY.pack
        pack_header = framing.RECORD_HEADER.pack
        crc = framing.crc32c
        seed = framing.crc_seed(REC_ENTRY)
        terms = array("Q")
        add_term = terms.append
        expected = first
        for e in entries:
            if e.index != expected:
                raise ValueError(f"entries not contiguous: expected {expected}, got {e.index}")
            expected += 1
            data = e.data
            if len(data) > _MAX_DATA:
                raise ValueError(f"entry {e.index} data of {len(data)} bytes is too large")
            head = pack_entry(e.term, e.index, e.kind)
            ap(pack_header(17 + len(data), crc(data, crc(head, seed)), REC_ENTRY))
            ap(head)
            ap(data)
            add_term(e.term)

        head_parts: list[bytes] = []
        self._roll_if_needed(head_parts)
        if first <= last:
            framing.append_record(head_parts, REC_TRUNCATE, _TRUNCATE.pack(first))
            self._pending_records += 1
        buf = b"".join(chain(head_parts, parts)) if head_parts else b"".join(parts)
        assert self._cur is not None
        self._cur.write(buf)

        if first <= last:
            del self._terms[first - self._offset - 1 :]
        self._terms.extend(terms)
        seg = self._segments[-1]
        if expected - 1 > seg.max_index:
            seg.max_index = expected - 1
        self._pending_entries += len(entries)
        self._pending_records += len(entries)
        self._pending_bytes += len(buf)

    def set_hard_state(self, hs: HardState) -> None:
        """Buffer a hard-state change (latest wins at recovery); unchanged states write nothing."""
        self._check()
        if hs == self._hs:
            return
        parts: list[bytes] = []
        self._roll_if_needed(parts)
        framing.append_record(parts, REC_HARD_STATE, _HARD_STATE.pack(hs.term, hs.vote, hs.commit))
        buf = b"".join(parts)
        assert self._cur is not None
        self._cur.write(buf)
        self._hs = hs
        self._pending_records += 1
        self._pending_bytes += len(buf)

    def sync(self) -> SyncStats:
        """Make everything written since the last sync durable: one file fsync (+ dir if new segment).

        On failure the WAL is poisoned (FsyncFailedError now and on every later call).
        """
        self._check()
        cur = self._cur
        if cur is None or (self._pending_bytes == 0 and not self._created_since_sync):
            return SyncStats(0, 0, 0)
        cur.sync()
        fsyncs = 1
        if self._created_since_sync:
            self._fs.fsync_dir(self._dir)
            fsyncs += 1
            self._created_since_sync = False
        stats = SyncStats(self._pending_entries, self._pending_bytes, fsyncs)
        self._pending_entries = self._pending_records = self._pending_bytes = 0
        return stats

    def compact(self, upto_index: int, term: int) -> SyncStats:
        """Record that a snapshot covers the log up to (upto_index, term), then drop old segments.

        Follows Raft's snapshot rule (§7): entries after upto_index are kept only if the log has
        upto_index with the same term; otherwise the whole log is discarded (a follower that
        installed a leader's snapshot). The marker is fsynced before any segment is deleted, so a
        crash in between never leaves a log whose start is unexplained. Returns the sync stats.
        """
        self._check()
        if upto_index <= self._snap_index:
            return self.sync()
        last = self.last_index()
        keep_suffix = upto_index <= last and self._terms[upto_index - self._offset - 1] == term
        parts: list[bytes] = []
        self._roll_if_needed(parts)
        framing.append_record(parts, REC_COMPACT, _COMPACT.pack(upto_index, term, 0 if keep_suffix else 1))
        buf = b"".join(parts)
        assert self._cur is not None
        self._cur.write(buf)
        if keep_suffix:
            del self._terms[: upto_index - self._offset]
        else:
            self._terms = array("Q")
        self._offset = upto_index
        self._snap_index, self._snap_term = upto_index, term
        self._pending_records += 1
        self._pending_bytes += len(buf)
        stats = self.sync()

        doomed: list[_Segment] = []
        for seg in self._segments[:-1]:
            if keep_suffix and seg.max_index > upto_index:
                break
            doomed.append(seg)
        if doomed:
            for seg in doomed:
                self._fs.remove(seg.path)
            del self._segments[: len(doomed)]
            self._fs.fsync_dir(self._dir)
            stats = SyncStats(stats.entries, stats.bytes, stats.fsyncs + 1)
        return stats

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Sync and release; after a storage failure only releases (the failure was raised already)."""
        if self._closed:
            return
        try:
            if self._fs.failure is None:
                self.sync()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release descriptors without syncing: what a kill -9 leaves (volatile mode loses the tail)."""
        self._closed = True
        if self._cur is not None:
            self._cur.close()
            self._cur = None
