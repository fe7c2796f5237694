"""The write-ahead log's records and their replay: what each record type means, applied in order.

Recovery replays every segment's records with the same rules the live `Wal` applies as it
writes, so what is on disk always means exactly one state. See docs/storage.md for the format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from raft_store import framing
from raft_store.framing import CorruptLogError
from raft_store.types import Entry, EntryKind, HardState

# Record types (type 0 is never written, see framing).
REC_ENTRY = 1  # term u64, index u64, kind u8, data
REC_HARD_STATE = 2  # term u64, vote u64, commit u64
REC_TRUNCATE = 3  # from_index u64: drop entries with index >= from_index
REC_COMPACT = 4  # index u64, term u64, reset u8: the log now starts after index
KNOWN_TYPES = frozenset({REC_ENTRY, REC_HARD_STATE, REC_TRUNCATE, REC_COMPACT})

ENTRY = struct.Struct("<QQB")
HARD_STATE = struct.Struct("<QQQ")
TRUNCATE = struct.Struct("<Q")
COMPACT = struct.Struct("<QQB")
MAX_DATA = framing.MAX_PAYLOAD - ENTRY.size


@dataclass(slots=True)
class Segment:
    """One segment file of the log."""

    seq: int
    first_index: int
    path: Path
    max_index: int  # highest entry index ever written in it; decides when compaction may delete it
    end: int = 0  # where its records end: the log writes on from there in the last segment


class Replay:
    """Applies records in order; used by recovery, mirrored by the live Wal methods."""

    def __init__(self) -> None:
        self.offset = 0  # index before the first entry held in `entries`
        self.entries: list[Entry] = []
        self.snap_index = 0
        self.snap_term = 0
        self.hs = HardState()

    def last(self) -> int:
        return self.offset + len(self.entries)

    def segment(self, seg: Segment, buf: bytes, records: list[framing.Record], first: bool) -> None:
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
        unpack_entry = ENTRY.unpack_from
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
                entries.append(Entry(term, index, ekind, buf[rec.start + ENTRY.size : rec.end]))
                if index > seg.max_index:
                    seg.max_index = index
            elif rtype == REC_HARD_STATE:
                self.hs = HardState(*HARD_STATE.unpack_from(buf, rec.start))
            elif rtype == REC_TRUNCATE:
                (frm,) = TRUNCATE.unpack_from(buf, rec.start)
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
                index, term, reset = COMPACT.unpack_from(buf, rec.start)
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
