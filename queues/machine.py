"""The compensation queue as raft_store's replicated state machine: the pure core over a store.

The queue's rules are `queues.core` (commands in, results and state changes out, through the
storage port, at the entry's own time); its state is in a `queues.stores` store. This class is the
seam to raft_store's `StateMachine`: it hands each committed entry to the core inside one atomic
write of the store, keeps the applied index, and maps checkpoints, snapshot copies and restores to
the store. Nothing here decides anything about a message.

A path opens the nodes' store (LMDB: `queues.stores.lmdb_store`); ":memory:" an in-memory SQLite
store (the simulator's: its state is one byte image); a `Store` is used as given.

Must never: read a clock, or apply an entry whose index is not above the applied one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from queues.core import apply, dead_letters
from queues.core.canonical import canonical_state, state_digest, store_digest
from queues.core.config import QueueConfig
from queues.core.entry import Catalog, load_meta
from queues.core.operator import policy_bytes
from queues.core.port import KvRead, Table
from queues.model import BUILTIN_KINDS
from queues.stores import Pinned, Store, StoreError
from queues.stores.lmdb_store import LmdbStore
from queues.stores.sqlite_store import SqliteStore
from raft_store.state_machine import Command

StoreLayoutError = StoreError
"""The store on disk was written by an incompatible version (a SQLite store from before LMDB)."""

MEMORY: Final = ":memory:"


def open_store(path: str | Path, *, threaded: bool | None = None) -> Store:
    """":memory:": an in-memory SQLite store; else the LMDB store at `path`, on a thread of its own
    unless `threaded=False` (a caller that uses it from one thread only)."""
    if str(path) == MEMORY:
        return SqliteStore(MEMORY)
    return LmdbStore(path, threaded=True if threaded is None else threaded, index_of=_applied_index)


def _applied_index(view: KvRead) -> int:
    return load_meta(view).applied_index


class _Copy:
    """A pinned state with the applied index it reflects (raft_store's PinnedCopy)."""

    def __init__(self, pinned: Pinned) -> None:
        self._pinned = pinned
        self.index = load_meta(pinned.read()).applied_index

    def write(self, path: Path) -> int:
        self._pinned.write(path)
        return self.index

    def close(self) -> None:
        self._pinned.close()


class _LiveView:
    """The port's reads, each on the store's current view (which an apply or commit replaces)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, table: Table, key: bytes) -> bytes | None:
        return self._store.read().get(table, key)

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._store.read().scan(table, start, stop, reverse=reverse)

    def count(self, table: Table) -> int:
        return self._store.read().count(table)


class QueueMachine:
    """The queue state machine. Drive it only through `apply_batch` with encoded commands."""

    def __init__(self, store: str | Path | Store = MEMORY, config: QueueConfig | None = None, *,
                 threaded: bool | None = None) -> None:  # fmt: skip
        self.config = config or QueueConfig()
        self.config.validate()
        self._store: Store = open_store(store, threaded=threaded) if isinstance(store, str | Path) else store
        self._catalog = Catalog(self.config)
        self._failed = False
        self._applied: int = self._store.call(self._open)

    def _open(self) -> int:
        """Register the built-in kinds a fresh store lacks, and read the applied index."""
        view = self._store.read()
        missing = [kind for kind in BUILTIN_KINDS if view.get(Table.KINDS, kind.encode()) is None]
        if missing:
            with self._store.write() as tx:
                for kind in missing:
                    tx.put(Table.KINDS, kind.encode(), policy_bytes(self.config.default_policy))
            self._store.commit()
        self._derive()
        return load_meta(self._store.read()).applied_index

    def _derive(self) -> None:
        """Build the derived indexes a store written by an earlier version lacks (today the dead
        tier's amount index, queues.core.dead_amounts): from the replicated rows alone, so every
        replica builds the same bytes, and no replicated value changes."""
        if not dead_letters.amount_index_current(self._store.read()):
            with self._store.write() as tx:
                dead_letters.rebuild_amount_index(tx)
            self._store.commit()

    @property
    def store(self) -> Store:
        return self._store

    @property
    def view(self) -> KvRead:
        """The applied state, for reads between applies, as it is at each read (tests and tools
        that drive the machine from one thread; the node reads through `query`)."""
        return _LiveView(self._store)

    # ---- StateMachine ---------------------------------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True) -> list[bytes]:
        results: list[bytes] = self._store.call(self._apply_batch, index, now_ms, commands, respond)
        return results

    def _apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], respond: bool) -> list[bytes]:
        assert index > self._applied, f"apply of {index} after {self._applied}"
        try:
            with self._store.write() as tx:
                results = apply.apply_entry(tx, index, now_ms, commands, self._catalog, respond=respond)
        except BaseException:
            self._catalog.forget()  # the entry rolled back: so must what was cached from it
            raise
        self._applied = index
        return results

    def note_applied(self, index: int) -> None:
        self._store.call(self._note_applied, index)

    def _note_applied(self, index: int) -> None:
        assert index > self._applied
        with self._store.write() as tx:
            apply.note_applied(tx, index)
        self._applied = index

    @property
    def uncommitted(self) -> bool:
        return self._store.uncommitted

    def commit(self) -> None:
        """End the store's open group of applies (the node does when its apply pipeline is idle)."""
        self._store.call(self._store.commit)

    def rollback(self) -> None:
        """After a storage failure: drop the applies since the last commit, and let `close` leave
        the store as a crash would (no sync, no clean stop), so that nothing is committed or made
        durable on the way out; the next start rolls back to the last checkpoint and the log
        replays the rest."""
        self._failed = True
        self._store.call(self._rollback)

    def _rollback(self) -> None:
        self._catalog.forget()
        self._store.discard()
        self._applied = load_meta(self._store.read()).applied_index

    def log_time_ms(self) -> int:
        """The time of the last applied entry (0 before the first): a read's "now" is never below it."""
        result: int = self._store.call(lambda: load_meta(self._store.read()).clock_ms)
        return result

    def checkpoint(self) -> int:
        """An applied index whose state is durable (0: this store cannot make one; copy instead)."""
        return self._store.checkpoint(_applied_index)

    def open_copy(self) -> _Copy | None:
        """Pin the state as it is now, for a copy written beside later applies (a follower's snapshot)."""
        pinned = self._store.call(self._store.pin)
        return None if pinned is None else _Copy(pinned)

    def write_snapshot(self, path: Path) -> int:
        copy = self.open_copy()
        if copy is None:
            self._store.call(self._store.copy_to, path)
            return self._applied
        try:
            return copy.write(path)
        finally:
            copy.close()

    def restore_snapshot(self, path: Path, index: int) -> None:
        self._store.call(self._restore, path, index)

    def _restore(self, path: Path, index: int) -> None:
        self._catalog.forget()
        self._store.restore(path)
        self._derive()
        self._applied = load_meta(self._store.read()).applied_index
        assert self._applied == index, f"snapshot says {self._applied}, expected {index}"

    def snapshot_bytes(self) -> bytes:
        """The whole state as one image (an in-memory store's: the simulator keeps disks in memory)."""
        store = self._store
        if not isinstance(store, SqliteStore):
            raise TypeError("snapshot_bytes is for the in-memory store")
        return store.image()

    def restore_bytes(self, image: bytes, index: int) -> None:
        store = self._store
        if not isinstance(store, SqliteStore):
            raise TypeError("restore_bytes is for the in-memory store")
        self._catalog.forget()
        store.load_image(image)
        self._derive()
        self._applied = load_meta(store.read()).applied_index
        assert self._applied == index, f"image says {self._applied}, expected {index}"

    def close(self) -> None:
        if self._failed:
            self._store.abandon()
        else:
            self._store.close()

    # ---- the state as values ----------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Every replicated value as plain rows (queues.core.canonical): equal exactly when equal."""
        result: dict[str, Any] = self._store.call(lambda: canonical_state(self._store.read()))
        return result

    def digest(self) -> bytes:
        """A digest of the canonical state (what another store or version holds alike)."""
        result: bytes = self._store.call(lambda: state_digest(self._store.read()))
        return result

    def store_digest(self) -> bytes:
        """A digest of every table's bytes, indexes included (what replicas of one version hold alike)."""
        result: bytes = self._store.call(lambda: store_digest(self._store.read()))
        return result


__all__ = ["MEMORY", "QueueConfig", "QueueMachine", "StoreLayoutError", "open_store"]
