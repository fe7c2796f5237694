"""Segmented, checksummed write-ahead log for the Raft hard state and log entries.

Called from one dedicated thread (never the event loop): `append`/`set_hard_state` only buffer
a write, `sync` makes everything since the previous sync durable with one fsync, so many
appends share one fsync (group commit). An acknowledgement may leave the node only after the
`sync` covering it has returned.

The log is replayed, not indexed: recovery (raft_store/wal_recovery.py) applies the records of
every segment in order with the same rules the live object applies (the records and their replay
are raft_store/wal_records.py), so what is on disk always means exactly one state. This module
is the writing side: segments rolled at sync boundaries, group commit, compaction. See
docs/storage.md for the format and the recovery rules.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from raft_store import framing
from raft_store.files import (
    AppendFile,
    FaultHook,
    FileSystem,
    FsyncFailedError,
    SimulatedCrash,
    WalFailedError,
)
from raft_store.framing import CorruptLogError, TornTail
from raft_store.types import Entry, HardState
from raft_store.wal_records import (
    COMPACT,
    ENTRY,
    HARD_STATE,
    MAX_DATA,
    REC_COMPACT,
    REC_ENTRY,
    REC_HARD_STATE,
    REC_TRUNCATE,
    TRUNCATE,
    Replay,
    Segment,
)
from raft_store.wal_recovery import Recovered, recover, segment_name
from raft_store.wal_spare import SpareSegment

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


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What one sync covered, for the fsync-batch-size metric."""

    entries: int
    bytes: int
    fsyncs: int


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


class Wal:
    """The durable log of one Raft node. Not thread-safe: one thread owns it."""

    def __init__(
        self,
        directory: Path,
        fs: FileSystem,
        segment_bytes: int,
        segments: list[Segment],
        replay: Replay,
        spare: SpareSegment | None = None,
    ) -> None:
        self._dir = directory
        self._fs = fs
        self._segment_bytes = segment_bytes
        self._segments = segments
        self._cur: AppendFile | None = fs.open_at(segments[-1].path, segments[-1].end) if segments else None
        self._spare = spare
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
        preallocate: bool = False,
    ) -> tuple[Wal, Recovered]:
        """`preallocate`: new segments are zero-filled and synced ahead of need on a thread of
        their own (raft_store/wal_spare.py), so syncs write data only. Not with `volatile`, whose
        point is a file that holds exactly what was synced."""
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        if preallocate and volatile:
            raise ValueError("a volatile WAL does not preallocate")
        directory = Path(directory)
        fs = FileSystem(volatile=volatile, fault=fault)
        segments, replay, recovered = recover(directory, fs)
        spare = SpareSegment(directory, segment_bytes) if preallocate else None
        wal = cls(directory, fs, segment_bytes, segments, replay, spare)
        if spare is not None:
            spare.prepare()
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
    def spare(self) -> SpareSegment | None:
        """The next segment being prepared, with preallocation on."""
        return self._spare

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
        A segment can therefore exceed its size by up to one group-commit batch.

        Full means `segment_bytes`, or, with preallocation and a spare ready, the end of the
        current segment's zero-filled space (for a segment without any, such as the one a restart
        found, now): writes go on into preallocated space wherever there is some. Either way a
        segment rolls only once written up to (or past) its capacity, so a closed segment never
        keeps zeros after its records, which recovery refuses in any segment but the last.
        """
        cur = self._cur
        spare = self._spare
        if cur is not None:
            if self._pending_bytes > 0 or cur.size * 2 < cur.capacity:
                return 0  # unsynced data stays in its segment; well inside preallocated space
            if spare is None:
                if cur.size < max(cur.capacity, self._segment_bytes):
                    return 0
            elif not spare.ready:
                spare.prepare()  # the next segment's spare, from half way through this one
                if cur.size < max(cur.capacity, self._segment_bytes):
                    return 0
            elif cur.size < cur.capacity:
                return 0
        seq = self._segments[-1].seq + 1 if self._segments else 1
        first = self.last_index() + 1
        path = self._dir / segment_name(seq, first)
        filled = spare.take() if spare is not None else None
        new = self._fs.adopt(filled, path) if filled is not None else self._fs.create(path)
        if spare is not None:
            spare.settle()
        if cur is not None:
            cur.close()
        self._cur = new
        self._segments.append(Segment(seq, first, path, 0))
        self._created_since_sync = True
        hs = self._hs
        n = framing.append_record(head, REC_HARD_STATE, HARD_STATE.pack(hs.term, hs.vote, hs.commit))
        n += framing.append_record(head, REC_COMPACT, COMPACT.pack(self._snap_index, self._snap_term, 0))
        self._pending_records += 2
        return n

    def append(self, entries: Sequence[Entry], hard_state: HardState | None = None) -> None:
        """Buffer entries (not durable until `sync`); an index <= last_index overwrites from there.
        `hard_state`: then `set_hard_state(hard_state)`, in the same write (the records and their
        order are exactly those of the two calls; a Ready's usual pair costs one syscall)."""
        self._check()
        if not entries:
            if hard_state is not None:
                self.set_hard_state(hard_state)
            return
        first = entries[0].index
        last = self.last_index()
        if first > last + 1:
            raise ValueError(f"append at {first} leaves a gap after {last}")
        if first <= self._snap_index:
            raise ValueError(f"append at {first} would overwrite compacted entries (<= {self._snap_index})")

        parts: list[bytes] = []
        ap = parts.append
        pack_entry = ENTRY.pack
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
            if len(data) > MAX_DATA:
                raise ValueError(f"entry {e.index} data of {len(data)} bytes is too large")
            head = pack_entry(e.term, e.index, e.kind)
            ap(pack_header(17 + len(data), crc(data, crc(head, seed)), REC_ENTRY))
            ap(head)
            ap(data)
            add_term(e.term)
        new_hs = hard_state is not None and hard_state != self._hs
        if hard_state is not None and new_hs:
            framing.append_record(parts, REC_HARD_STATE, HARD_STATE.pack(hard_state.term, hard_state.vote, hard_state.commit))
        head_parts: list[bytes] = []
        self._roll_if_needed(head_parts)
        if first <= last:
            framing.append_record(head_parts, REC_TRUNCATE, TRUNCATE.pack(first))
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
        if hard_state is not None and new_hs:
            self._hs = hard_state
            self._pending_records += 1

    def set_hard_state(self, hs: HardState) -> None:
        """Buffer a hard-state change (latest wins at recovery); unchanged states write nothing."""
        self._check()
        if hs == self._hs:
            return
        parts: list[bytes] = []
        self._roll_if_needed(parts)
        framing.append_record(parts, REC_HARD_STATE, HARD_STATE.pack(hs.term, hs.vote, hs.commit))
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
        framing.append_record(parts, REC_COMPACT, COMPACT.pack(upto_index, term, 0 if keep_suffix else 1))
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

        doomed: list[Segment] = []
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
        if self._spare is not None:
            self._spare.close()
        if self._cur is not None:
            self._cur.close()
            self._cur = None
