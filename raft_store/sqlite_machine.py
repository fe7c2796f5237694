"""A StateMachine base on SQLite: applied index and client sessions in the same transaction.

Why SQLite: the state of a queue with tens of millions of waiting requests belongs on disk, not
in the Python heap, and SQLite is in the standard library. The Raft WAL already makes every
committed command durable, so the state store runs WAL mode with synchronous=NORMAL: after a
power cut it is consistent but may be behind, and the node replays the log tail after
`applied_index()`.

Subclasses implement `apply_command`; everything else (sessions, applied index, snapshots) lives
here so each replicated machine gets exactly-once semantics the same way.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from raft_store.files import private_copy, private_file
from raft_store.state_machine import Command

SESSION_RESULT_STALE = b"\x00stale-session"
"""Returned for a command whose seq is older than the session's last applied seq.

The client already got (or gave up on) that command's result; answering with a fresh
application would apply it twice, so the machine refuses instead."""

COMMIT_EVERY_CHANGES = 16_384
"""Rows written (inserted, updated, deleted) between two commits of the store's transaction (see
`commit`). Rows, not commands: one lease or AckMany command writes thousands."""

PAGE_CACHE_KIB = 128 << 10
"""SQLite's page cache per store (default: 2 MiB). A group of applies dirties a page per
random-key index insert, and with the default cache SQLite spilled dirty pages to the WAL in the
middle of the transaction and wrote them again at its commit. 128 MiB holds a group's pages."""

SESSIONS_MAX = 100_000
SESSION_EVICT_EVERY = 1024
"""Eviction runs on every 1024th log index: deterministic on every replica, off the hot path."""
"""Sessions are evicted oldest-first past this many; a client idle that long starts anew."""


class SqliteStateMachine:
    """Exactly-once, snapshot-able state machine over one SQLite file (or ":memory:")."""

    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        self._open = False
        self._changes_at_begin = 0
        self.responding = True
        """False while applying an entry whose results nobody will read (see StateMachine)."""
        self.commit_every_changes = COMMIT_EVERY_CHANGES
        self._conn = self._connect(self._path)
        self._init_schema()
        self._applied = self._read_applied()

    # ---- subclass hooks -------------------------------------------------------------
    def create_tables(self, conn: sqlite3.Connection) -> None:
        """Create the subclass's tables (IF NOT EXISTS)."""

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        """Apply one command inside the open transaction and return its result."""
        raise NotImplementedError

    def begin_batch(self, conn: sqlite3.Connection, index: int, now_ms: int) -> None:
        """Called inside the transaction before the entry's first command (load per-batch caches)."""

    def end_batch(self, conn: sqlite3.Connection) -> None:
        """Called inside the transaction after the entry's last command (flush what was buffered).

        Per-entry buffering is where the apply cost goes down: a counter kept in Python and
        written once, or rows written with one executemany, instead of one statement per use."""

    def session_record(self, data: bytes, result: bytes) -> bytes:
        """What the session table keeps of a result, to answer a retry of the same command."""
        return result

    def session_replay(self, conn: sqlite3.Connection, now_ms: int, stored: bytes) -> bytes:
        """The answer to a retried command, from what `session_record` kept."""
        return stored

    # ---- StateMachine -----------------------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True) -> list[bytes]:
        assert index > self._applied, f"apply of {index} after {self._applied}"
        conn = self._conn
        results: list[bytes] = []
        self.responding = respond
        self._begin()
        conn.execute("SAVEPOINT entry")
        try:
            self.begin_batch(conn, index, now_ms)
            sessions = _load_sessions(conn, commands)
            touched: dict[int, tuple[int, int, bytes, int]] = {}
            for command in commands:
                results.append(self._apply_in_session(conn, now_ms, command, sessions, touched, index))
            self.end_batch(conn)
            if touched:
                conn.executemany(
                    "INSERT INTO _sessions (client_id, seq, result, touched_index) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT(client_id) DO UPDATE SET seq = excluded.seq, result = excluded.result,"
                    " touched_index = excluded.touched_index",
                    list(touched.values()),
                )
            conn.execute("UPDATE _raft_meta SET applied_index = ? WHERE id = 0", (index,))
            if index % SESSION_EVICT_EVERY == 0:
                _evict_sessions(conn)
            conn.execute("RELEASE entry")
        except BaseException:
            # Undo this entry only; the entries before it in the open transaction stay applied.
            conn.execute("ROLLBACK TO entry")
            conn.execute("RELEASE entry")
            raise
        self._applied = index
        if conn.total_changes - self._changes_at_begin >= self.commit_every_changes:
            self.commit()
        return results

    def note_applied(self, index: int) -> None:
        assert index > self._applied
        self._begin()
        self._conn.execute("UPDATE _raft_meta SET applied_index = ? WHERE id = 0", (index,))
        self._applied = index

    @property
    def uncommitted(self) -> bool:
        """Entries were applied since the last commit (False: the store on disk is current)."""
        return self._open

    def commit(self) -> None:
        """End the open transaction, if any: every applied entry is now in the store's WAL.

        Applies share one SQLite transaction until they have written `commit_every_changes` rows
        (or the node commits an idle machine, or a checkpoint or copy needs the store current).
        Why: SQLite writes every page a transaction dirtied, once, at its commit; a random-key
        index insert dirties a page of its own, so small transactions write about one page per
        index per command, and larger ones share pages. Nothing is at risk meanwhile:
        the Raft log holds every applied entry durably, and the applied index commits with the
        state it describes, so a crash replays exactly the entries the store had not committed."""
        if self._open:
            try:
                self._conn.execute("COMMIT")
            finally:
                # A failed COMMIT (a full disk) may have rolled the transaction back or kept it
                # open; either way the flag says what SQLite holds, so nothing commits by mistake.
                self._open = self._conn.in_transaction

    def rollback(self) -> None:
        """Drop the applies since the last commit (after a storage failure; the log replays them)."""
        with contextlib.suppress(sqlite3.Error):
            if self._open or self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._applied = self._read_applied()
        self._open = False

    def _begin(self) -> None:
        if not self._open:
            self._conn.execute("BEGIN")
            self._open = True
            self._changes_at_begin = self._conn.total_changes

    def checkpoint(self) -> int:
        """Make every applied transaction durable; return the applied index that is now durable.

        In WAL mode with synchronous=NORMAL a commit is written but not fsynced; SQLite fsyncs the
        WAL before a checkpoint copies it into the database file (and the file after). So a
        checkpoint makes all commits so far durable, and the Raft log up to the applied index can
        be compacted without copying the store. An in-memory store cannot: it returns 0."""
        self.commit()
        if self._path == ":memory:":
            return 0
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        # SQLite syncs the WAL before it backfills frames; when a reader (an on-demand snapshot
        # copy) pins every frame there may be nothing to backfill, and durability must not hang on
        # that detail: fsync the database, its WAL and their directory ourselves (all committed
        # frames are already written to the WAL file, so this makes them durable).
        for name in (self._path, self._path + "-wal"):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fd = os.open(os.path.dirname(os.path.abspath(self._path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return self._applied

    def write_snapshot(self, path: Path) -> int:
        """A consistent copy of the store; returns the applied index the copy reflects."""
        copy = self.open_copy()  # commits first
        if copy is None:
            return _copy_to(self._conn, path)
        try:
            return copy.write(path)
        finally:
            copy.close()

    def open_copy(self) -> StoreCopy | None:
        """Pin the state as it is now for a copy that may be written later, beside applies.

        Call between applies (the node calls it in the apply thread): a second connection begins a
        read transaction here, so its `index` is exactly the applied index of this moment, and in
        WAL mode that transaction keeps seeing this state while the apply connection goes on
        committing. A 15 GB store takes minutes to copy; the leader's applies must not wait."""
        self.commit()
        if self._path == ":memory:":
            return None  # a second connection cannot see it: copied by write_snapshot, between applies
        return StoreCopy(self._path)

    def restore_snapshot(self, path: Path, index: int) -> None:
        self._discard()
        self._conn.close()
        if self._path == ":memory:":
            self._conn = self._connect(":memory:")
            source = sqlite3.connect(str(path))
            try:
                source.backup(self._conn)
            finally:
                source.close()
        else:
            for suffix in ("-wal", "-shm"):
                extra = Path(self._path + suffix)
                if extra.exists():
                    extra.unlink()
            tmp = self._path + ".restore"
            private_copy(path, Path(tmp))
            os.replace(tmp, self._path)
            self._conn = self._connect(self._path)
        self._init_schema()
        self._applied = self._read_applied()
        assert self._applied == index, f"snapshot says {self._applied}, expected {index}"

    def snapshot_bytes(self) -> bytes:
        """The whole state as one consistent image (sqlite3 serialize), for in-memory simulation.

        The deterministic simulator keeps disks in memory; this is the same state a file snapshot
        holds, without touching the file system."""
        self.commit()
        return self._conn.serialize()

    def restore_bytes(self, image: bytes, index: int) -> None:
        """Replace the whole state by an image from `snapshot_bytes`, which reflects `index`."""
        if self._path != ":memory:":
            raise ValueError("restore_bytes is for in-memory machines")
        self._discard()
        self._conn.deserialize(image)
        self._init_schema()
        self._applied = self._read_applied()
        assert self._applied == index, f"image says {self._applied}, expected {index}"

    def close(self) -> None:
        self.commit()
        self._conn.close()

    def _discard(self) -> None:
        """Roll back the open transaction: the state is about to be replaced wholesale."""
        if self._open:
            self._conn.execute("ROLLBACK")
            self._open = False

    # ---- internals ----------------------------------------------------------------
    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        if path != ":memory:":
            private_file(Path(path))  # SQLite gives its -wal and -shm files the database file's mode
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
            # Statement journals in memory. Every INSERT or UPDATE on a table with indexes and
            # NOT NULL columns opens one inside our long group-commit transaction and copies each
            # page it touches that the transaction had already dirtied. With temp files, once
            # one statement journal passed 64 KiB (SQLite's spill size) the file was never
            # truncated again, so every later statement paid a 4-byte and a 4 KiB pwrite per
            # page it touched: on the cluster 5.4-6.0 write syscalls and 13-17 KB written per
            # enqueue per node, against 1.9-2.9 and 6-11 KB with this pragma (/proc/<pid>/io
            # during `bench.queue enqueue`, 2026-11-22). A statement journal is bounded by its
            # statement (the machine's batches are capped), and our sorts are LIMIT-bounded, so
            # memory stays small.
            conn.execute("PRAGMA temp_store=MEMORY")
            # SQLite's default auto-checkpoint (every 1000 pages, 4 MiB) is kept on purpose: at 8192
            # pages a quarter fewer bytes were written per enqueue, but each checkpoint paused the
            # apply thread for longer and enqueue p99 went from 90-136 ms to 220-245 ms with no
            # gain in throughput (bench.queue enqueue, 2026-11-22).
        return conn

    def _init_schema(self) -> None:
        conn = self._conn
        conn.execute("CREATE TABLE IF NOT EXISTS _raft_meta (id INTEGER PRIMARY KEY, applied_index INTEGER NOT NULL)")
        conn.execute("INSERT OR IGNORE INTO _raft_meta (id, applied_index) VALUES (0, 0)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _sessions (client_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL,"
            " result BLOB NOT NULL, touched_index INTEGER NOT NULL)"
        )
        conn.execute("CREATE INDEX IF NOT EXISTS _sessions_touched ON _sessions (touched_index)")
        self.create_tables(conn)

    def _read_applied(self) -> int:
        row = self._conn.execute("SELECT applied_index FROM _raft_meta WHERE id = 0").fetchone()
        return int(row[0])

    def _apply_in_session(
        self,
        conn: sqlite3.Connection,
        now_ms: int,
        command: Command,
        sessions: dict[int, tuple[int, bytes]],
        touched: dict[int, tuple[int, int, bytes, int]],
        index: int,
    ) -> bytes:
        if command.client_id == 0:  # sessionless: caller accepts at-least-once
            return self.apply_command(conn, now_ms, command.data)
        last = sessions.get(command.client_id)
        if last is not None:
            last_seq, stored = last
            if command.seq == last_seq:
                return self.session_replay(conn, now_ms, stored)
            if command.seq < last_seq:
                return SESSION_RESULT_STALE
        result = self.apply_command(conn, now_ms, command.data)
        stored = self.session_record(command.data, result)
        sessions[command.client_id] = (command.seq, stored)
        touched[command.client_id] = (command.client_id, command.seq, stored, index)
        return result


def _load_sessions(conn: sqlite3.Connection, commands: Sequence[Command]) -> dict[int, tuple[int, bytes]]:
    """The sessions of every client in the entry, in one query per 500 clients."""
    ids = sorted({command.client_id for command in commands if command.client_id != 0})
    sessions: dict[int, tuple[int, bytes]] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for client_id, seq, result in conn.execute(
            f"SELECT client_id, seq, result FROM _sessions WHERE client_id IN ({marks})", chunk
        ):
            sessions[int(client_id)] = (int(seq), bytes(result))
    return sessions


def _evict_sessions(conn: sqlite3.Connection) -> None:
    (count,) = conn.execute("SELECT count(*) FROM _sessions").fetchone()
    if count > SESSIONS_MAX:
        conn.execute(
            "DELETE FROM _sessions WHERE client_id IN"
            " (SELECT client_id FROM _sessions ORDER BY touched_index, client_id LIMIT ?)",
            (count - SESSIONS_MAX,),
        )


class StoreCopy:
    """A read transaction pinned on a SQLite store, to be copied to a snapshot file once."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute("BEGIN")
            (index,) = self._conn.execute("SELECT applied_index FROM _raft_meta WHERE id = 0").fetchone()
        except BaseException:
            self._conn.close()
            raise
        self.index = int(index)

    def write(self, path: Path) -> int:
        """Copy the pinned state to `path` (replaced atomically); returns `index`."""
        copied = _copy_to(self._conn, path)
        assert copied == self.index, f"copy reflects {copied}, pinned {self.index}"
        return copied

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("COMMIT")
        self._conn.close()


def _copy_to(source: sqlite3.Connection, path: Path) -> int:
    """Back up `source` (in its current read transaction, if one is open) to `path`."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    if tmp.exists():
        tmp.unlink()
    private_file(tmp)
    target = sqlite3.connect(str(tmp))
    try:
        source.backup(target)
        (index,) = target.execute("SELECT applied_index FROM _raft_meta WHERE id = 0").fetchone()
    finally:
        target.close()
    os.replace(tmp, path)
    return int(index)
