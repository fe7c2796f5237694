"""The nodes' store: the port's tables as named databases of one LMDB file.

Why LMDB: the queue's state must live on disk (ten million waiting requests of 1 KiB are 10 GiB),
and an apply must cost a few microseconds per row, not SQLite's statements through Python. LMDB is
a copy-on-write B-tree in a memory-mapped file: a read is a pointer walk, a write transaction costs
its dirty pages once at its commit, readers never block the writer, and a reader pins a consistent
state for as long as it lives (what a follower's snapshot copy, and a checkpoint, need).

Durability is the Raft log's, plus checkpoints (queues/stores/lmdb_checkpoint.py): applies share one
write transaction, committed every COMMIT_EVERY_CHANGES rows written (or when the node finds the
pipeline idle, or before a checkpoint or a copy), without fsync; each entry is a nested
transaction inside it, so an entry that raises is undone alone. `checkpoint` fsyncs the file in the
background at the state of the moment, saves that state's meta page and keeps a reader on it until
the next one, and answers the newest state already durable. After an unclean stop the store rolls
back to that state, and the node replays the log from it: the log is only ever compacted up to a
durable checkpoint.

Threads: LMDB's write transaction belongs to the thread that began it (its writer lock is a
process-shared mutex), and the node calls its machine from more than one thread (the apply thread,
the event loop for small batches, the I/O thread for a snapshot install). With `threaded=True` the
store runs everything that touches it on a thread of its own (`call`), and commits a grown group
there after handing back the entry's results. Without a thread (tests, the simulator, in-process
benchmarks) the store refuses, with a StoreError, a write from another thread than the one whose
transaction is open: a clear error instead of a deadlock.

Must never: commit an entry's half, compact-worthy durability it does not have (a checkpoint is
answered only once fsynced), or leave a write transaction open across a restore.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import lmdb

from queues.core.port import KvRead, KvWrite, Table
from queues.stores import StoreError
from queues.stores import lmdb_checkpoint as ckpt

T = TypeVar("T")

COMMIT_EVERY_CHANGES: Final = 16_384
"""Rows written between two commits of the group's transaction. A commit writes (no fsync) every
page the group dirtied, once: a page shared by many inserts is written once per group."""
MAP_SIZE: Final = 1 << 40
"""The address space reserved for the file (1 TiB: virtual, not allocated; the file grows as written)."""
_NAMES: Final = tuple(table.name.lower().encode() for table in Table)


class _Tx:
    """The port over one LMDB transaction."""

    __slots__ = ("_dbs", "_txn", "changes")

    def __init__(self, txn: lmdb.Transaction, dbs: tuple[Any, ...]) -> None:
        self._txn = txn
        self._dbs = dbs
        self.changes = 0

    def get(self, table: Table, key: bytes) -> bytes | None:
        return cast("bytes | None", self._txn.get(key, db=self._dbs[table]))

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        cursor = self._txn.cursor(db=self._dbs[table])
        if not reverse:
            if not cursor.set_range(start):
                return
            for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor.iternext()):
                if stop is not None and key >= stop:
                    return
                yield key, value
            return
        if stop is None:
            positioned = cursor.last()
        elif cursor.set_range(stop):
            positioned = cursor.prev()  # the last key below stop, if any
        else:
            positioned = cursor.last()  # every key is below stop
        if not positioned:
            return
        for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor.iterprev()):
            if key < start:
                return
            yield key, value

    def count(self, table: Table) -> int:
        return int(self._txn.stat(self._dbs[table])["entries"])

    def put(self, table: Table, key: bytes, value: bytes, *, append: bool = False) -> None:
        if not self._txn.put(key, value, db=self._dbs[table], append=append) and append:
            raise StoreError(f"{table.name}: an append of {key.hex()} is not above the table's last key")
        self.changes += 1

    def delete(self, table: Table, key: bytes) -> bool:
        found = bool(self._txn.delete(key, db=self._dbs[table]))
        self.changes += found
        return found


class _Worker:
    """A thread of the store's own: tasks run one at a time, in order; `after` runs once a task's
    caller has its answer (the group commit)."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.after: Callable[[], None] | None = None
        self.failure: BaseException | None = None
        self._thread.start()

    def run(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        if self.failure is not None:
            raise StoreError(f"the store failed: {self.failure!r}") from self.failure
        box: list[Any] = []
        done = threading.Event()
        self._tasks.put((fn, box, done))
        done.wait()
        ok, value = box
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, box, done = task
            try:
                box.extend((True, fn()))
            except BaseException as error:  # handed to the caller, who decides
                box.extend((False, error))
            done.set()
            if self.after is not None and self.failure is None:
                try:
                    self.after()
                except BaseException as error:  # a failed commit: every later call raises
                    self.failure = error

    def stop(self) -> None:
        self._tasks.put(None)
        self._thread.join()


class LmdbStore:
    """The port's tables in one LMDB file at `path` (see the module docstring)."""

    durable = True

    def __init__(self, path: str | Path, *, threaded: bool = False, commit_every: int = COMMIT_EVERY_CHANGES,
                 readonly: bool = False) -> None:  # fmt: skip
        self.path = str(path)
        self.commit_every = commit_every
        self._readonly = readonly
        self._txn: lmdb.Transaction | None = None
        self._owner: int | None = None
        self._reader: lmdb.Transaction | None = None
        self._changes = 0
        self._durable: tuple[lmdb.Transaction, ckpt.Checkpoint] | None = None
        """The reader pinned on the newest durable state, and that state's checkpoint record."""
        self._syncing: threading.Thread | None = None
        self._sync_failure: BaseException | None = None
        self._worker = _Worker(f"lmdb-{os.path.basename(self.path)}") if threaded else None
        self._env, self._dbs = self.call(self._open)
        if self._worker is not None:
            self._worker.after = self._commit_if_grown

    def _open(self, *, recover: bool = True) -> tuple[lmdb.Environment, tuple[Any, ...]]:
        _refuse_foreign(self.path)
        if recover and not self._readonly:
            self._recover()
        try:
            env = lmdb.open(
                self.path, subdir=False, map_size=MAP_SIZE, max_dbs=len(Table) + 4, sync=False, metasync=False,
                readahead=False, meminit=False, readonly=self._readonly, lock=not self._readonly, max_readers=256,
            )  # fmt: skip
        except lmdb.Error as error:
            raise StoreError(f"{self.path}: cannot open the queue store: {error}") from None
        if self._readonly:
            try:
                return env, tuple(env.open_db(name, create=False) for name in _NAMES)
            except lmdb.Error as error:
                env.close()
                raise StoreError(f"{self.path} is not a queue store of this version: {error}") from None
        dbs = tuple(env.open_db(name) for name in _NAMES)
        self._env, self._dbs = env, dbs
        self._make_durable()  # what is in the file now is the state to roll back to
        return env, dbs

    def _recover(self) -> None:
        """Before opening: a clean stop's file is trusted as it is; a file with a checkpoint record
        and no clean stop rolls back to that checkpoint; a file with neither (a copy, a snapshot
        installed, `python -m queues.migrate`'s output) is opened as it is: it was written whole
        and fsynced, and LMDB refuses one that is not a store."""
        clean = ckpt.clean_path(self.path)
        if os.path.exists(clean):
            os.unlink(clean)
            ckpt.fsync_dir(self.path)
            return
        saved = ckpt.load(self.path) if os.path.exists(self.path) else None
        if saved is not None:
            ckpt.roll_back(self.path, saved)

    # ---- Store ------------------------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: object) -> T:
        if self._worker is not None:
            return self._worker.run(lambda: fn(*args))
        result = fn(*args)
        self._commit_if_grown()
        return result

    @contextlib.contextmanager
    def write(self) -> Iterator[KvWrite]:
        if self._txn is None:
            self._drop_reader()
            self._txn = self._env.begin(write=True)
            self._owner = threading.get_ident()
        else:
            self._check_owner()
        child = self._env.begin(write=True, parent=self._txn)
        tx = _Tx(child, self._dbs)
        try:
            yield tx
        except BaseException:
            child.abort()
            raise
        child.commit()
        self._changes += tx.changes

    def read(self) -> KvRead:
        if self._txn is not None:
            return _Tx(self._txn, self._dbs)
        if self._reader is None:
            self._reader = self._env.begin()
        return _Tx(self._reader, self._dbs)

    @property
    def uncommitted(self) -> bool:
        return self._txn is not None

    def commit(self) -> None:
        if self._txn is not None:
            self._check_owner()
            txn, self._txn, self._owner, self._changes = self._txn, None, None, 0
            txn.commit()

    def _commit_if_grown(self) -> None:
        if self._changes >= self.commit_every:
            self.commit()

    def checkpoint(self, index_of: Callable[[KvRead], int]) -> int:
        """Start making the state of this moment durable (fsync on a thread of its own) and answer
        the applied index of the newest state already durable. The first answer waits for its sync
        (the node takes 0 for "this store cannot"), later ones never do: the log is kept one
        checkpoint longer instead of the applies waiting for an fsync."""
        if self._sync_failure is not None:
            raise StoreError(f"{self.path}: a checkpoint's fsync failed: {self._sync_failure!r}")
        syncing = self._syncing
        if syncing is None or not syncing.is_alive():
            pinned = self.call(self._pin_for_checkpoint, index_of)
            thread = threading.Thread(target=self._sync, args=pinned, name="lmdb-checkpoint", daemon=True)
            self._syncing = thread
            thread.start()
            if self._durable is None or self._durable[1].index == 0:
                thread.join()
        durable = self._durable
        assert durable is not None
        return durable[1].index

    def _pin_for_checkpoint(self, index_of: Callable[[KvRead], int]) -> tuple[lmdb.Transaction, ckpt.Checkpoint]:
        """On the writer's thread: commit, and pin a reader on the state just committed."""
        self.commit()
        reader = self._env.begin()
        txnid = int(reader.id())
        page = ckpt.read_meta(self.path, int(self._env.stat()["psize"]), txnid)
        return reader, ckpt.Checkpoint(txnid, index_of(_Tx(reader, self._dbs)), page)

    def _sync(self, reader: lmdb.Transaction, checkpoint: ckpt.Checkpoint) -> None:
        try:
            self._env.sync(True)
            ckpt.save(self.path, checkpoint)
        except BaseException as error:
            reader.abort()
            self._sync_failure = error
            return
        previous, self._durable = self._durable, (reader, checkpoint)
        if previous is not None:
            previous[0].abort()  # its pages may be reused now: the newer state is the one to roll back to

    def _make_durable(self) -> None:
        """At open, synchronously: the state in the file becomes the checkpoint."""
        pinned = self._pin_for_checkpoint(lambda view: 0)
        self._sync(*pinned)
        if self._sync_failure is not None:
            raise StoreError(f"{self.path}: cannot make the store durable: {self._sync_failure!r}")

    def sync(self) -> bool:
        """Commit and fsync now (a clean stop, tests): the current state is durable."""
        self.commit()
        self._env.sync(True)
        return True

    def pin(self) -> LmdbPinned:
        self.commit()
        return LmdbPinned(self._env, self._env.begin(), self._dbs)

    def copy_to(self, path: Path) -> None:
        pinned = self.pin()
        try:
            pinned.write(path)
        finally:
            pinned.close()

    def restore(self, path: Path) -> None:
        """Replace the state by a copy (`pin`): the copy, fsynced, becomes the checkpoint."""
        _refuse_foreign(str(path), required=True)
        self._wait_for_sync()
        self._discard()
        self._release_durable()
        self._env.close()
        # The old checkpoint record goes first: a crash before the copy's own is saved leaves a
        # file without one, which the next open discards (the node then rejoins), never a record
        # of the old file applied to the new one.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ckpt.side_path(self.path))
        ckpt.fsync_dir(self.path)
        os.replace(path, self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path + "-lock")
        self._env, self._dbs = self._open(recover=False)

    def close(self) -> None:
        def close() -> None:
            self._wait_for_sync()
            if not self._readonly:
                self.sync()
                self._release_durable()
                self._drop_reader()
                self._env.close()
                with open(ckpt.clean_path(self.path), "wb") as marker:
                    os.fsync(marker.fileno())
                ckpt.fsync_dir(self.path)
            else:
                self._drop_reader()
                self._env.close()

        self.call(close)
        if self._worker is not None:
            self._worker.stop()

    def discard(self) -> None:
        """Undo every write since the last commit."""
        self._discard()

    def abandon(self) -> None:
        """Stop as a kill -9 would (crash tests): nothing more is committed or synced, and no clean
        marker is left, so the next open rolls back to the last checkpoint."""

        def abandon() -> None:
            self._wait_for_sync()
            self._discard()
            self._release_durable()
            self._env.close()

        self.call(abandon)
        if self._worker is not None:
            self._worker.stop()

    # ---- internals ------------------------------------------------------------------------------
    def _wait_for_sync(self) -> None:
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None

    def _release_durable(self) -> None:
        if self._durable is not None:
            self._durable[0].abort()
            self._durable = None

    def _check_owner(self) -> None:
        if self._owner != threading.get_ident():
            raise StoreError(
                "the store's write transaction was opened on another thread: build it with threaded=True "
                "when more than one thread calls it"
            )

    def _discard(self) -> None:
        if self._txn is not None:
            self._check_owner()
            txn, self._txn, self._owner, self._changes = self._txn, None, None, 0
            txn.abort()
        self._drop_reader()

    def _drop_reader(self) -> None:
        if self._reader is not None:
            self._reader.abort()
            self._reader = None


class LmdbPinned:
    """A read transaction pinned on the store: a consistent state that later writes do not touch."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction, dbs: tuple[Any, ...]) -> None:
        self._env = env
        self._txn: lmdb.Transaction | None = txn
        self._dbs = dbs

    def read(self) -> KvRead:
        assert self._txn is not None
        return _Tx(self._txn, self._dbs)

    def write(self, path: Path) -> None:
        """A compacted copy of the pinned state (free pages left out), fsynced, from any thread."""
        assert self._txn is not None
        copy_env(self._env, path, self._txn)

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None


def copy_env(env: lmdb.Environment, path: Path, txn: lmdb.Transaction | None = None) -> None:
    """A compacted, fsynced copy of the state `txn` sees (None: the latest), renamed into `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    env.copy(str(tmp), compact=True, txn=txn)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _refuse_foreign(path: str, *, required: bool = False) -> None:
    """An existing file that is not an LMDB store (a SQLite queue store from before, say) is named
    in one line, never opened as if it were one."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except FileNotFoundError:
        if required:
            raise StoreError(f"{path}: no such store") from None
        return
    if head.startswith(b"SQLite format 3\x00"):
        raise StoreError(
            f"{path} is a SQLite queue store from before the LMDB store: convert it with"
            f" `python -m queues.migrate {os.path.dirname(path) or '.'}` (or move the data directory aside and let"
            " the node rejoin empty from a snapshot)"
        )
    if len(head) >= 24:
        try:
            ckpt.meta_txnid(head)
        except StoreError:
            raise StoreError(f"{path} is not an LMDB queue store") from None
