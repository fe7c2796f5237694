"""The WAL's contract with no files, for the WAL's tests: what recovery must return after the
operations a test made (tests/raft_store/test_wal.py, test_wal_spare.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raft_store.types import Entry, EntryKind, HardState
from raft_store.wal import Recovered


def mk(index: int, term: int = 1, data: bytes | None = None) -> Entry:
    return Entry(term, index, EntryKind.NORMAL, data if data is not None else f"e{index}".encode())


def run(first: int, last: int, term: int = 1) -> list[Entry]:
    return [mk(i, term) for i in range(first, last + 1)]


@dataclass
class Model:
    """The WAL's contract, with no files: what recovery must return."""

    entries: list[Entry] = field(default_factory=list)
    snap_index: int = 0
    snap_term: int = 0
    hs: HardState = field(default_factory=HardState)

    def copy(self) -> Model:
        return Model(list(self.entries), self.snap_index, self.snap_term, self.hs)

    def last(self) -> int:
        return self.snap_index + len(self.entries)

    def term_at(self, index: int) -> int | None:
        if self.snap_index < index <= self.last():
            return self.entries[index - self.snap_index - 1].term
        return None

    def append(self, entries: list[Entry]) -> None:
        del self.entries[entries[0].index - self.snap_index - 1 :]
        self.entries.extend(entries)

    def compact(self, upto: int, term: int) -> None:
        if upto <= self.snap_index:
            return
        if self.term_at(upto) == term:
            self.entries = self.entries[upto - self.snap_index :]
        else:
            self.entries = []
        self.snap_index, self.snap_term = upto, term

    def check(self, rec: Recovered) -> None:
        assert rec.entries == self.entries
        assert rec.hard_state == self.hs
        assert (rec.snapshot_index, rec.snapshot_term) == (self.snap_index, self.snap_term)
        assert rec.first_index == self.snap_index + 1
