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

The reader on the checkpoint is what makes the rollback possible (LMDB never reuses a page a
reader can still see), and what it costs: every page freed since that state stays allocated, and
with random-keyed indexes a group's commit frees thousands (each insert copies its leaf). Held for
a snapshot interval of the node's (64 MiB of log), that was most of the file. So a store given
`index_of` (the machine's: where a state keeps its applied index) moves its checkpoint on its own:
each fsync of the syncer makes the last committed state durable, and the pages pinned are those
of about a second of applies. `checkpoint` then only answers the newest one.

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
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import lmdb

from queues.core.port import KvRead, KvWrite, Table
from queues.stores import StoreError
from queues.stores import lmdb_checkpoint as ckpt
from queues.stores.lmdb_tx import ADDED_LATER, NAMES, OlderTx, Tx
from queues.stores.owner_thread import OwnerThread, result_of
from raft_store.files import PRIVATE_FILE

T = TypeVar("T")

COMMIT_EVERY_CHANGES: Final = 65_536
"""Rows written between two commits of the group's transaction. A commit writes (no fsync) every
page the group dirtied, once: a page shared by many inserts is written once per group.

Why this many: LMDB copies a page on its first write in each transaction, and an enqueue lands on
a random leaf of each random-keyed index (idempotency key, ref key, and a delayed message's due
time), so each commit writes about one 4 KiB leaf per index per enqueue until a group is large
against the index. At 16,384 rows a 1 M-message backlog of UUID keys wrote 21.6-21.9 GB to the
disk for its three replicas; at 65,536, 15.3 GB, and took its enqueues 17-21 % faster (docs/
benchmarks.md, "fewer, larger group commits"). The costs: memory, the group's dirty pages living
in the process until its commit (anonymous RSS at 1 M pending 134 -> 181 MiB per node); and a
longer pause at each commit, which the next apply waits for (enqueue p99 at 256 in flight over a
1 M backlog 89-129 ms against 74-82 ms, for 5-11 % more enqueues a second and 6-10 % less CPU). A larger
group cannot fail for size: LMDB spills dirty pages to the file beyond its own limit (a group of
262,144 rows over a 200,000-leaf tree committed; the same section)."""
SYNC_EVERY_S: Final = 0.5
"""How often the syncer fsyncs what was committed since its last fsync (see _Syncer)."""
MAP_SIZE: Final = 1 << 40
"""The address space reserved for the file (1 TiB: virtual, not allocated; the file grows as written)."""


Pin = tuple[lmdb.Transaction, ckpt.Checkpoint]
"""A reader on a committed state, and that state's checkpoint record."""


class _Syncer:
    """fdatasyncs the store's file every SYNC_EVERY_S while commits are made, and keeps the
    checkpoints: the reader on the newest durable state (the one an unclean stop rolls back to)
    and the candidate its next fsync makes durable. Without it the kernel writes the file back in
    bursts of hundreds of megabytes, and a checkpoint's fsync then stalls the Raft log's own fsyncs
    on the same disk for as long."""

    def __init__(self, store: LmdbStore, index_of: Callable[[KvRead], int] | None) -> None:
        self._store = store
        self.index_of = index_of
        """Given: each fsync makes the last committed state the checkpoint (the module docstring)."""
        self.durable: Pin | None = None
        self.candidate: Pin | None = None
        self.failure: BaseException | None = None
        """An fsync that failed: the store refuses every checkpoint from then on."""
        self._pins = threading.Lock()
        """Held while `candidate` or `durable` changes: this thread and a checkpoint's caller both do."""
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._synced_txnid = -1
        self._thread = threading.Thread(target=self._run, name=f"lmdb-sync-{os.path.basename(store.path)}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        self._idle.clear()
        self._wake.set()

    def wait_idle(self) -> None:
        """Until the sync asked for (if any) has returned."""
        self._idle.wait()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        store = self._store
        while not self._stop.is_set():
            self._wake.wait(SYNC_EVERY_S)
            self._wake.clear()
            try:
                with store._env_lock:
                    if self._stop.is_set():
                        break
                    candidate = self.candidate
                    txnid = int(store._env.info()["last_txnid"])
                    if txnid != self._synced_txnid or candidate is not None:
                        store._env.sync(True)
                        self._synced_txnid = txnid
                    self.synced(candidate)
                    self._advance()
            except BaseException as error:
                self.failure = error
            finally:
                if not self._wake.is_set():
                    self._idle.set()
        self._idle.set()

    # ---- the checkpoints --------------------------------------------------------------------------
    def propose(self, index_of: Callable[[KvRead], int]) -> None:
        """The last committed state, unless one waits already, is the next fsync's candidate."""
        with self._pins:
            if self.candidate is None:
                self.candidate = self._pin(index_of)

    def _pin(self, index_of: Callable[[KvRead], int]) -> Pin:
        """A reader on the last committed state, with that state's checkpoint record."""
        env, path = self._store._env, self._store.path
        page_size = int(env.stat()["psize"])
        while True:
            reader = env.begin()
            txnid = int(reader.id())
            try:
                page = ckpt.read_meta(path, page_size, txnid)
            except StoreError:  # two commits since the reader began overwrote its meta slot: again
                reader.abort()
                continue
            return reader, ckpt.Checkpoint(txnid, index_of(Tx(reader, self._store._dbs)), page)

    def synced(self, candidate: Pin | None) -> None:
        """After an fsync that began after `candidate`'s commit: it is durable."""
        if candidate is None:
            return
        ckpt.save(self._store.path, candidate[1])
        with self._pins:
            previous, self.durable = self.durable, candidate
            if self.candidate is candidate:
                self.candidate = None
        if previous is not None:
            previous[0].abort()  # its pages may be reused now: the newer state is the one to roll back to

    def _advance(self) -> None:
        """With `index_of`: the last committed state, if newer than the checkpoint, becomes the
        candidate that the next fsync makes durable."""
        if self.index_of is None:
            return
        with self._pins:
            durable = self.durable
            if self.candidate is not None or durable is None:
                return
            if int(self._store._env.info()["last_txnid"]) <= durable[1].txnid:
                return
            self.candidate = self._pin(self.index_of)

    def make_durable(self) -> None:
        """At open, synchronously: the state in the file becomes the checkpoint."""
        candidate = self._pin(self.index_of or (lambda view: 0))
        self._store._env.sync(True)
        self.synced(candidate)

    def release(self) -> None:
        with self._pins:
            pinned, self.durable, self.candidate = (self.durable, self.candidate), None, None
        for held in pinned:
            if held is not None:
                held[0].abort()


class LmdbStore:
    """The port's tables in one LMDB file at `path` (see the module docstring)."""

    durable = True

    def __init__(self, path: str | Path, *, threaded: bool = False, commit_every: int = COMMIT_EVERY_CHANGES,
                 readonly: bool = False, index_of: Callable[[KvRead], int] | None = None) -> None:  # fmt: skip
        self.path = str(path)
        self.commit_every = commit_every
        self._readonly = readonly
        self._txn: lmdb.Transaction | None = None
        self._thread_id: int | None = None
        """Without an owner thread: the thread whose group transaction is open."""
        self._pending: tuple[list[Any], threading.Event] | None = None
        """A commit handed to the owner thread and not yet waited for."""
        self._failure: BaseException | None = None
        self._reader: lmdb.Transaction | None = None
        self._changes = 0
        self._owner = OwnerThread(f"lmdb-{os.path.basename(self.path)}") if threaded else None
        self._env_lock = threading.Lock()
        """Held by the syncer while it uses the environment, and while the environment is replaced or closed."""
        self._syncer = _Syncer(self, index_of)
        self._env, self._dbs = self._open()
        if not readonly:
            self._syncer.start()

    def _open(self, *, recover: bool = True) -> tuple[lmdb.Environment, tuple[Any, ...]]:
        _refuse_foreign(self.path)
        if recover and not self._readonly:
            self._recover()
        try:
            env = lmdb.open(
                self.path, subdir=False, map_size=MAP_SIZE, max_dbs=len(Table) + 4, sync=False, metasync=False,
                readahead=False, meminit=False, readonly=self._readonly, lock=not self._readonly, max_readers=256,
                mode=PRIVATE_FILE,
            )  # fmt: skip
        except lmdb.Error as error:
            raise StoreError(f"{self.path}: cannot open the queue store: {error}") from None
        if self._readonly:
            try:
                return env, tuple(self._open_existing(env, table) for table in Table)
            except lmdb.Error as error:
                env.close()
                raise StoreError(f"{self.path} is not a queue store of this version: {error}") from None
        dbs = tuple(env.open_db(name) for name in NAMES)
        self._env, self._dbs = env, dbs
        self._syncer.make_durable()  # what is in the file now is the state to roll back to
        return env, dbs

    @staticmethod
    def _open_existing(env: lmdb.Environment, table: Table) -> Any:
        try:
            return env.open_db(NAMES[table], create=False)
        except lmdb.NotFoundError:
            if table in ADDED_LATER:
                return None
            raise

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
        result = fn(*args)
        self._commit_if_grown()
        return result

    @contextlib.contextmanager
    def write(self) -> Iterator[KvWrite]:
        parent = self._group()
        child = self._env.begin(write=True, parent=parent)
        tx = Tx(child, self._dbs)
        try:
            yield tx
        except BaseException:
            child.abort()
            raise
        child.commit()
        self._changes += tx.changes

    def read(self) -> KvRead:
        self._settle()
        if self._txn is not None:
            return Tx(self._txn, self._dbs)
        if self._reader is None:
            self._reader = self._env.begin()
        return OlderTx(self._reader, self._dbs) if None in self._dbs else Tx(self._reader, self._dbs)

    @property
    def uncommitted(self) -> bool:
        return self._txn is not None or self._pending is not None

    def commit(self) -> None:
        self._settle()
        if self._txn is not None:
            txn, self._txn, self._changes = self._txn, None, 0
            self._owned(txn.commit)

    def _commit_if_grown(self) -> None:
        """Commit a group grown past `commit_every` rows: on the owner thread, after the caller has
        its answer (the next use of the store waits for it)."""
        if self._changes < self.commit_every or self._txn is None:
            return
        txn, self._txn, self._changes = self._txn, None, 0
        if self._owner is None:
            self._owned(txn.commit)
        else:
            self._pending = self._owner.start(txn.commit)

    def _group(self) -> lmdb.Transaction:
        """The group's write transaction, begun (on the owner thread) if none is open."""
        self._settle()
        if self._txn is None:
            self._drop_reader()
            self._txn = self._owned(lambda: self._env.begin(write=True))
        return self._txn

    def _settle(self) -> None:
        """Wait for a commit handed to the owner thread; a failed one fails every later use."""
        if self._failure is not None:
            raise StoreError(f"{self.path}: a commit failed: {self._failure!r}") from self._failure
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                result_of(*pending)
            except lmdb.Error as error:
                self._failure = error
                raise StoreError(f"{self.path}: a commit failed: {error}") from error
            except BaseException as error:
                self._failure = error
                raise

    def _owned(self, fn: Callable[[], T]) -> T:
        """Run a begin, commit or abort of the group's transaction where LMDB allows it: on the
        owner thread; without one, on the thread that began the group (else a StoreError, which
        is better than the deadlock LMDB's mutex would give)."""
        try:
            return self._owned_run(fn)
        except lmdb.Error as error:  # a storage failure, named as one (raft_store/stop_reason.py)
            raise StoreError(f"{self.path}: {error}") from error

    def _owned_run(self, fn: Callable[[], T]) -> T:
        if self._owner is not None:
            return self._owner.run(fn)
        here = threading.get_ident()
        if self._thread_id not in (None, here):
            raise StoreError(
                "the store's write transaction was opened on another thread: build it with threaded=True "
                "when more than one thread calls it"
            )
        result = fn()
        self._thread_id = here if isinstance(result, lmdb.Transaction) else None
        return result

    def checkpoint(self, index_of: Callable[[KvRead], int]) -> int:
        """Start making the last committed state durable and answer the applied index of the
        newest state already durable: the syncer thread fsyncs, saves the state's checkpoint record
        and moves the pinned reader to it. Nothing here waits for an fsync (the log is kept one
        checkpoint longer instead), but the first time: 0 would tell the node "this store cannot"."""
        syncer = self._syncer
        if syncer.failure is not None:
            raise StoreError(f"{self.path}: a checkpoint's fsync failed: {syncer.failure!r}")
        first = syncer.durable is None or syncer.durable[1].index == 0
        if first:
            self.commit()
        syncer.propose(index_of)
        syncer.kick()
        if first:
            syncer.wait_idle()
            if syncer.failure is not None:
                raise StoreError(f"{self.path}: a checkpoint's fsync failed: {syncer.failure!r}")
        durable = syncer.durable
        assert durable is not None
        return durable[1].index

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
        self._env_lock.acquire()
        try:
            self._restore_locked(path)
        finally:
            self._env_lock.release()

    def _restore_locked(self, path: Path) -> None:
        self._discard()
        self._syncer.release()
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
        self._syncer.stop()
        if not self._readonly:
            self.sync()
            self._syncer.release()
            self._drop_reader()
            self._env.close()
            marker = os.open(ckpt.clean_path(self.path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
            try:
                os.fsync(marker)
            finally:
                os.close(marker)
            ckpt.fsync_dir(self.path)
        else:
            self._drop_reader()
            self._env.close()
        if self._owner is not None:
            self._owner.stop()

    def discard(self) -> None:
        """Undo every write since the last commit."""
        self._discard()

    def abandon(self) -> None:
        """Stop as a kill -9 would (crash tests): nothing more is committed or synced, and no clean
        marker is left, so the next open rolls back to the last checkpoint."""
        self._syncer.stop()
        self._discard()
        self._syncer.release()
        self._env.close()
        if self._owner is not None:
            self._owner.stop()

    # ---- internals ------------------------------------------------------------------------------
    def _discard(self) -> None:
        try:
            self._settle()
        except BaseException:  # a failed commit: its transaction is gone; so is the group
            self._failure = None
        if self._txn is not None:
            txn, self._txn, self._changes = self._txn, None, 0
            self._owned(txn.abort)
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
        return Tx(self._txn, self._dbs)

    def write(self, path: Path) -> None:
        """A compacted copy of the pinned state (free pages left out), fsynced, from any thread."""
        assert self._txn is not None
        copy_env(self._env, path, self._txn)

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None


def copy_env(env: lmdb.Environment, path: Path, txn: lmdb.Transaction | None = None) -> None:
    """A compacted, fsynced copy of the state `txn` sees (None: the latest), renamed into `path`
    (mode 0600, as every file of a node's: it holds payloads and password hashes)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        env.copyfd(fd, compact=True, txn=txn)
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
