"""Opening a write-ahead log directory: its segment files found, checked in order, replayed,
and a tail torn by a crash repaired.

Nothing is changed on disk until the whole log has been verified: a corrupt record anywhere
but at the torn tail of the last segment stops the start with `CorruptLogError`, never a
silent truncation. See docs/storage.md for the recovery rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from raft_store import framing
from raft_store.files import FileSystem, private_dir
from raft_store.framing import CorruptLogError, TornTail
from raft_store.types import Entry, HardState
from raft_store.wal_records import KNOWN_TYPES, REC_COMPACT, REC_HARD_STATE, Replay, Segment

SPARE_SUFFIX = ".spare"

_SEGMENT_NAME = re.compile(r"^(\d{16})-(\d{20})\.wal$")


def segment_name(seq: int, first_index: int) -> str:
    """Zero-padded so lexical order is creation order; first index helps humans and checks."""
    return f"{seq:016d}-{first_index:020d}.wal"


@dataclass(frozen=True, slots=True)
class Recovered:
    """What the log held: the state the node starts from, and the tail a crash tore, if any."""

    hard_state: HardState
    entries: list[Entry]
    first_index: int
    torn_tail: TornTail | None
    snapshot_index: int
    snapshot_term: int


def recover(directory: Path, fs: FileSystem) -> tuple[list[Segment], Replay, Recovered]:
    """Read and verify every segment, then (only then) repair the tail: a last segment whose
    header never became durable is removed, a torn last record cut off. Zeros after the last
    segment's records are kept: unwritten space the log writes on into (`Segment.end`)."""
    if not directory.exists():
        private_dir(directory)
        fs.fsync_dir(directory.parent)

    segments: list[Segment] = []
    spares: list[Path] = []
    for p in directory.iterdir():
        if p.suffix == SPARE_SUFFIX:
            spares.append(p)  # a spare being filled when the node stopped: never part of the log
            continue
        if p.suffix != ".wal":
            continue
        m = _SEGMENT_NAME.match(p.name)
        if m is None:
            raise CorruptLogError(p, 0, "unrecognised segment name")
        segments.append(Segment(int(m.group(1)), int(m.group(2)), p, 0))
    segments.sort(key=lambda s: s.seq)
    for prev, nxt in pairwise(segments):
        if nxt.seq != prev.seq + 1:
            raise CorruptLogError(nxt.path, 0, f"segment {prev.seq + 1} is missing")

    # One segment in memory at a time: scan, check its header, replay, move on.
    replay = Replay()
    drop_last = False
    last_torn: TornTail | None = None
    last_size = 0
    last_held_data = False
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
        seg.end = records[-1].end if records else 0
        if is_last:
            last_torn, last_size = torn_here, len(buf)
            last_held_data = bool(records) or torn_here is not None  # else only zeros: an adopted spare
        del buf, records
    if replay.offset != replay.snap_index:
        raise CorruptLogError(
            segments[0].path,
            0,
            f"entries {replay.snap_index + 1}..{replay.offset} are missing "
            f"(compaction point {replay.snap_index}, first segment starts at {segments[0].first_index})",
        )

    # Only now, with the whole log verified, change files.
    for spare in spares:
        fs.remove(spare)
    torn: TornTail | None = None
    if drop_last:
        last = segments.pop()
        fs.remove(last.path)
        fs.fsync_dir(directory)
        if last_held_data:  # an adopted spare still all zeros held nothing: not worth a report
            reason = last_torn.reason if last_torn else "no data after the header"
            torn = TornTail(last.path, 0, last_size, f"segment header incomplete: {reason}")
    elif last_torn is not None:
        torn = last_torn
        fs.truncate(torn.path, torn.offset)

    recovered = Recovered(
        hard_state=replay.hs,
        entries=replay.entries,
        first_index=replay.offset + 1,
        torn_tail=torn,
        snapshot_index=replay.snap_index,
        snapshot_term=replay.snap_term,
    )
    return segments, replay, recovered
