"""The in-memory view of one node's Raft log: what is stored, handed to disk, committed, applied.

Owns the index bookkeeping the safety of Raft rests on; never does I/O. The runner persists what
`unstable_entries()` returns and reports back through `stable_to()`.

    # Invariant: snapshot_index <= applied <= applying <= committed <= last_index
    # Invariant: persisted <= handed <= last_index
"""

from __future__ import annotations

from collections.abc import Sequence

from raft_store.membership import apply_change
from raft_store.types import ConfState, Entry, EntryKind, SnapshotMeta


class LogSafetyError(AssertionError):
    """An operation would rewrite committed history: a bug or a Byzantine peer, never recoverable."""


class RaftLog:
    def __init__(self, snapshot: SnapshotMeta, entries: Sequence[Entry], committed: int, applied: int) -> None:
        self.snapshot_index = snapshot.index
        self.snapshot_term = snapshot.term
        self._entries: list[Entry] = list(entries)
        if self._entries:
            assert self._entries[0].index == snapshot.index + 1, "log must start right after the snapshot"
        last = self.last_index()
        self.committed = min(max(committed, applied, snapshot.index), last)
        self.applied = max(applied, snapshot.index)
        assert self.applied <= self.committed, f"applied {self.applied} beyond committed {self.committed}"
        self.applying = self.applied
        self.persisted = last
        self.handed = last
        # Membership as of each CONF entry still in the log; the first element is the snapshot's.
        self.conf_history: list[tuple[int, ConfState]] = [(snapshot.index, snapshot.conf)]
        for entry in self._entries:
            if entry.kind == EntryKind.CONF:
                self._note_conf(entry)

    # ---- reading --------------------------------------------------------------------
    def last_index(self) -> int:
        return self._entries[-1].index if self._entries else self.snapshot_index

    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot_term

    def first_index(self) -> int:
        return self.snapshot_index + 1

    def term(self, index: int) -> int | None:
        """The term of `index`, or None when it is compacted away or beyond the end."""
        if index == self.snapshot_index:
            return self.snapshot_term
        offset = index - self.snapshot_index - 1
        if offset < 0 or offset >= len(self._entries):
            return None
        return self._entries[offset].term

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Election restriction (Raft 5.4.1): vote only for a log at least as complete as ours."""
        ours = self.last_term()
        return last_term > ours or (last_term == ours and last_index >= self.last_index())

    def slice(self, lo: int, hi: int, bytes_max: int) -> list[Entry]:
        """Entries [lo, hi), at least one, then as many as fit in `bytes_max`."""
        assert lo > self.snapshot_index, "slice below the snapshot"
        start = lo - self.snapshot_index - 1
        stop = min(hi, self.last_index() + 1) - self.snapshot_index - 1
        out: list[Entry] = []
        size = 0
        for entry in self._entries[start:stop]:
            size += len(entry.data) + 24
            if out and size > bytes_max:
                break
            out.append(entry)
        return out

    def entry(self, index: int) -> Entry:
        return self._entries[index - self.snapshot_index - 1]

    def conf(self) -> ConfState:
        return self.conf_history[-1][1]

    def conf_at(self, index: int) -> ConfState:
        conf = self.conf_history[0][1]
        for at, state in self.conf_history:
            if at <= index:
                conf = state
        return conf

    def pending_conf_index(self) -> int:
        return self.conf_history[-1][0]

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """The largest index <= `index` whose term is <= `term` (fast back-off, etcd's rule)."""
        while index > self.snapshot_index:
            ours = self.term(index)
            if ours is not None and ours <= term:
                break
            index -= 1
        return index

    # ---- writing --------------------------------------------------------------------
    def append(self, entries: Sequence[Entry]) -> None:
        """Leader path: extend the log. Entries must follow the last index."""
        if not entries:
            return
        assert entries[0].index == self.last_index() + 1, "leader append must be contiguous"
        self._entries.extend(entries)
        for entry in entries:
            if entry.kind == EntryKind.CONF:
                self._note_conf(entry)

    def maybe_append(self, prev_index: int, prev_term: int, leader_commit: int, entries: Sequence[Entry]) -> int | None:
        """Follower path (AppendEntries receiver rules). Returns the last index now matching the
        leader, or None when the previous entry does not match."""
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        conflict = self._find_conflict(entries)
        if conflict:
            if conflict <= self.committed:
                raise LogSafetyError(f"entry {conflict} conflicts with committed {self.committed}")
            self._truncate_from(conflict)
            self.append(entries[conflict - prev_index - 1 :])
        self.commit_to(min(leader_commit, last_new))
        return last_new

    def _find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry that is new or whose term differs; 0 when all are present."""
        for entry in entries:
            if entry.index <= self.snapshot_index:
                continue
            if not self.match_term(entry.index, entry.term):
                return entry.index
        return 0

    def _truncate_from(self, index: int) -> None:
        if index > self.last_index():
            return
        assert index > self.committed, "truncating committed entries"
        del self._entries[index - self.snapshot_index - 1 :]
        self.persisted = min(self.persisted, index - 1)
        self.handed = min(self.handed, index - 1)
        while len(self.conf_history) > 1 and self.conf_history[-1][0] >= index:
            self.conf_history.pop()

    def _note_conf(self, entry: Entry) -> None:
        self.conf_history.append((entry.index, apply_change(self.conf(), entry.data)))

    def commit_to(self, index: int) -> bool:
        if index <= self.committed:
            return False
        if index > self.last_index():
            raise LogSafetyError(f"commit {index} beyond last index {self.last_index()}")
        self.committed = index
        return True

    # ---- persistence and application bookkeeping ------------------------------------
    def unstable_entries(self) -> list[Entry]:
        start = self.handed - self.snapshot_index
        return self._entries[start:] if start < len(self._entries) else []

    def has_unstable(self) -> bool:
        """Whether `unstable_entries` has any (without copying them)."""
        return self.handed - self.snapshot_index < len(self._entries)

    def hand_to_storage(self) -> int:
        self.handed = self.last_index()
        return self.handed

    def stable_to(self, index: int) -> None:
        """The runner fsynced the entries it was handed up to `index`; the caller checked that
        `index` still holds the entry that was written (not overwritten since)."""
        self.persisted = max(self.persisted, min(index, self.handed))

    def next_committed(self) -> list[Entry]:
        hi = min(self.committed, self.persisted)
        if hi <= self.applying:
            return []
        start = self.applying - self.snapshot_index
        out = self._entries[start : hi - self.snapshot_index]
        self.applying = hi
        return out

    def applied_to(self, index: int) -> None:
        assert index <= self.applying
        self.applied = max(self.applied, index)

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by a snapshot received from the leader."""
        self.snapshot_index = meta.index
        self.snapshot_term = meta.term
        self._entries = []
        self.committed = meta.index
        self.applied = self.applying = meta.index
        self.persisted = self.handed = meta.index
        self.conf_history = [(meta.index, meta.conf)]

    def compact(self, index: int) -> SnapshotMeta:
        """Drop entries up to `index` (already applied and snapshotted by the state machine)."""
        assert self.snapshot_index < index <= self.applied, "compact only applied entries"
        term = self.term(index)
        assert term is not None
        conf = self.conf_at(index)
        del self._entries[: index - self.snapshot_index]
        self.snapshot_index, self.snapshot_term = index, term
        later = [(at, state) for at, state in self.conf_history if at > index]
        self.conf_history = [(index, conf), *later]
        return SnapshotMeta(index=index, term=term, conf=conf)

    def entries_after(self, index: int) -> list[Entry]:
        start = max(index, self.snapshot_index) - self.snapshot_index
        return self._entries[start:]
