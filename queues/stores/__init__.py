"""The stores behind the queue core's storage port (queues.core.port).

    LmdbStore    the nodes' store: a memory-mapped B-tree file (LMDB), one write transaction held
                 across applies and committed in groups, durable at checkpoints
    SqliteStore  an ordered table per port table in SQLite: the simulator's store (its whole state
                 is one byte image, taken at every simulated fsync) and the port's second
                 implementation, which keeps the conformance suite honest

`Store` is what the queue machine needs besides the port itself: atomic writes per log entry, a
view of the applied state, group commit, durability on demand, a pinned copy for a follower's
snapshot, and a restore from one. tests/queues/test_store_port.py holds every store to it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, TypeVar

from queues.core.port import KvRead, KvWrite
from raft_store.files import StorageError

T = TypeVar("T")


class StoreError(RuntimeError, StorageError):
    """The store cannot be opened or used as asked (a foreign file, a wrong thread, a broken sync)."""


class Pinned(Protocol):
    """A state pinned by `Store.pin`: readable, and copyable to a file, beside later writes."""

    def read(self) -> KvRead: ...

    def write(self, path: Path) -> None:
        """Write the pinned state to `path` (a new file), from any thread."""
        ...

    def close(self) -> None: ...


class Store(Protocol):
    path: str
    durable: bool
    """False for a store in memory: nothing survives the process."""

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` where this store may be written (its own thread, if it has one), and
        afterwards commit a group that has grown large enough."""
        ...

    def write(self) -> AbstractContextManager[KvWrite]:
        """The writes of one log entry: all of them, or none when the block raises."""
        ...

    def read(self) -> KvRead:
        """The applied state (what every write so far left), valid until the next write or commit."""
        ...

    @property
    def uncommitted(self) -> bool:
        """Writes were made since the last commit."""
        ...

    def commit(self) -> None:
        """End the group: every write so far is in the store (not yet durable: `sync`)."""
        ...

    def sync(self) -> bool:
        """Commit and make everything durable now; False when the store cannot (it is in memory)."""
        ...

    def checkpoint(self, index_of: Callable[[KvRead], int]) -> int:
        """`index_of` the newest state that is durable, having started to make the current one so
        (a store may sync in the background and answer an older state); 0: it cannot."""
        ...

    def pin(self) -> Pinned | None:
        """Commit and pin the state as it is now, for a copy written later beside further writes;
        None when this store cannot (then copy with `copy_to`)."""
        ...

    def copy_to(self, path: Path) -> None:
        """Commit and write a copy of the state to `path` now."""
        ...

    def restore(self, path: Path) -> None:
        """Replace the whole state by a copy written by `pin` or `copy_to` of a store of this kind."""
        ...

    def discard(self) -> None:
        """Undo every write since the last commit (after a storage failure: the log replays them)."""
        ...

    def abandon(self) -> None:
        """Close as a crash would: nothing more committed or made durable, no clean stop recorded."""
        ...

    def close(self) -> None:
        """Commit, make durable, and record a clean stop."""
        ...


__all__ = ["Pinned", "Store", "StoreError"]
