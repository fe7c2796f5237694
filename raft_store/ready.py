"""What the pure Raft core hands its runner, and what durable storage hands the core at start.

The runner's contract, per Ready:
1. send `early_messages` (the leader's appends: safe before its own fsync, because the leader
   counts its own copy only once `on_persisted` says it is durable);
2. persist `snapshot`, `entries` and `hard_state`, then fsync (in order with earlier Readies);
3. send `messages` (votes, append replies) only once this Ready and all earlier ones are durable;
4. apply `committed` in order, then call `on_applied`;
5. call `on_persisted(ready)` when step 2 is done. `advance(ready)` does 4+5 for runners that
   do everything in sequence.

Several Readies may be outstanding: the runner need not wait for an fsync before stepping new
messages, which is how the leader overlaps its own fsync with replication and application.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raft_store.types import Entry, HardState, Message, ReadState, Snapshot, SnapshotMeta


@dataclass(frozen=True, slots=True)
class Recovered:
    """What durable storage gave back at start-up."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta = field(default_factory=SnapshotMeta)
    entries: tuple[Entry, ...] = ()
    applied: int = 0


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None
    entries: list[Entry]
    snapshot: Snapshot | None
    early_messages: list[Message]
    messages: list[Message]
    committed: list[Entry]
    read_states: list[ReadState]

    def is_empty(self) -> bool:
        return not (
            self.hard_state
            or self.entries
            or self.snapshot
            or self.early_messages
            or self.messages
            or self.committed
            or self.read_states
        )

    must_sync: bool = False
    """True when entries, a snapshot, or a new term or vote must be fsynced before `messages` go
    out. A hard state whose only change is the commit index may be written lazily."""
