"""A simulated disk at the granularity of WAL records, with the failure modes real disks have.

Writes land in a volatile buffer until `sync()`. A crash keeps a random prefix of the unsynced
records (some writes reached the platter before power went), may tear the last of them (a
partial record the recovery must drop), and, on at most a minority of nodes, may corrupt a
durable record in the middle, which recovery must refuse, never skip.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft_store.types import Entry, HardState, Snapshot, SnapshotMeta


class SimCorruption(Exception):
    """Recovery found a record whose checksum fails in the middle of the log."""


@dataclass(slots=True)
class Record:
    kind: str  # "hs" | "entries" | "compact" | "reset"
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    compact_index: int = 0
    corrupt: bool = False
    torn: bool = False


@dataclass(slots=True)
class Recovery:
    hard_state: HardState
    snapshot: Snapshot | None
    entries: list[Entry]
    torn_tail: bool


@dataclass(slots=True)
class SimDisk:
    durable: list[Record] = field(default_factory=list)
    pending: list[Record] = field(default_factory=list)
    snapshot: Snapshot | None = None  # written atomically (temp, fsync, rename): never torn
    fsyncs: int = 0
    # Planted bug: treat a mid-log checksum failure as the end of the log (must be caught).
    truncate_on_corruption: bool = False

    def write_hard_state(self, hs: HardState) -> None:
        self.pending.append(Record("hs", hard_state=hs))

    def write_entries(self, entries: list[Entry]) -> None:
        if entries:
            self.pending.append(Record("entries", entries=tuple(entries)))

    def save_snapshot(self, snapshot: Snapshot, *, installed: bool) -> None:
        """Atomic and durable on return, like the real SnapshotStore. An installed snapshot (from
        the leader) replaces the whole log; a local one only compacts its prefix."""
        self.snapshot = snapshot
        self.pending.append(Record("reset" if installed else "compact", compact_index=snapshot.meta.index))
        self.sync()

    def sync(self) -> None:
        self.fsyncs += 1
        self.durable.extend(self.pending)
        self.pending = []

    def crash(self, rng: random.Random, *, may_corrupt: bool) -> str:
        """Power loss. Returns what happened, for the fault log."""
        kept = rng.randrange(len(self.pending) + 1) if self.pending else 0
        survivors = self.pending[:kept]
        what = f"kept {kept}/{len(self.pending)} unsynced"
        if survivors and rng.random() < 0.3:
            survivors[-1].torn = True
            what += ", tore the last"
        self.durable.extend(survivors)
        self.pending = []
        if may_corrupt and len(self.durable) > 2:
            victim = rng.randrange(len(self.durable) - 1)
            self.durable[victim].corrupt = True
            what += f", corrupted record {victim}"
        return what

    def recover(self) -> Recovery:
        hs = HardState()
        entries: list[Entry] = []
        first = 1
        torn = False
        for position, record in enumerate(self.durable):
            if record.torn and position == len(self.durable) - 1:
                torn = True
                break
            if record.corrupt or record.torn:
                if self.truncate_on_corruption:
                    del self.durable[position:]
                    break
                raise SimCorruption(f"record {position} of {len(self.durable)} fails its checksum")
            if record.kind == "hs":
                assert record.hard_state is not None
                hs = record.hard_state
            elif record.kind == "entries":
                start = record.entries[0].index
                if start > first + len(entries):
                    # A gap: the entries before were compacted away by a snapshot.
                    entries = []
                    first = start
                del entries[max(0, start - first) :]
                entries.extend(e for e in record.entries if e.index >= first)
            else:
                cut = record.compact_index
                entries = [] if record.kind == "reset" else [e for e in entries if e.index > cut]
                first = cut + 1
        if torn:
            self.durable.pop()
        snap = self.snapshot
        if snap is not None:
            entries = [e for e in entries if e.index > snap.meta.index]
            if entries and entries[0].index != snap.meta.index + 1:
                entries = []
        elif entries and entries[0].index != 1:
            entries = []
        return Recovery(hard_state=hs, snapshot=snap, entries=entries, torn_tail=torn)

    def snapshot_meta(self) -> SnapshotMeta:
        return self.snapshot.meta if self.snapshot else SnapshotMeta()
