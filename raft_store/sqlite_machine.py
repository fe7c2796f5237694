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

import os
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from raft_store.state_machine import Command

SESSION_RESULT_STALE = b"\x00stale-session"
"""Returned for a command whose seq is older than the session's last applied seq.

The client already got (or gave up on) that command's result; answering with a fresh
application would apply it twice, so the machine refuses instead."""

SESSIONS_MAX = 100_000
SESSION_EVICT_EVERY = 1024
"""Eviction runs on every 1024th log index: deterministic on every replica, off the hot path."""
"""Sessions are evicted oldest-first past this many; a client idle that long starts anew."""


class SqliteStateMachine:
    """Exactly-once, snapshot-able state machine over one SQLite file (or ":memory:")."""

    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        self._conn = self._connect(self._path)
        self._init_schema()
        self._applied = self._read_applied()

    # ---- subclass hooks -------------------------------------------------------------
    def create_tables(self, conn: sqlite3.Connection) -> None:
        """Create the subclass's tables (IF NOT EXISTS)."""

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        """Apply one command inside the open transaction and return its result."""
        raise NotImplementedError

    # ---- StateMachine -----------------------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command]) -> list[bytes]:
        assert index > self._applied, f"apply of {index} after {self._applied}"
        conn = self._conn
        results: list[bytes] = []
        conn.execute("BEGIN")
        try:
            for command in commands:
                results.append(self._apply_in_session(conn, now_ms, command))
            conn.execute("UPDATE _raft_meta SET applied_index = ? WHERE id = 0", (index,))
            if index % SESSION_EVICT_EVERY == 0:
                self._evict_sessions(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._applied = index
        return results

    def note_applied(self, index: int) -> None:
        assert index > self._applied
        self._conn.execute("UPDATE _raft_meta SET applied_index = ? WHERE id = 0", (index,))
        self._applied = index

    def write_snapshot(self, path: Path) -> int:
        """Online backup: a consistent copy even while the node keeps applying afterwards."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        if tmp.exists():
            tmp.unlink()
        target = sqlite3.connect(str(tmp))
        try:
            self._conn.backup(target)
        finally:
            target.close()
        os.replace(tmp, path)
        return self._applied

    def restore_snapshot(self, path: Path, index: int) -> None:
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
            shutil.copyfile(path, tmp)
            os.replace(tmp, self._path)
            self._conn = self._connect(self._path)
        self._init_schema()
        self._applied = self._read_applied()
        assert self._applied == index, f"snapshot says {self._applied}, expected {index}"

    def snapshot_bytes(self) -> bytes:
        """The whole state as one consistent image (sqlite3 serialize), for in-memory simulation.

        The deterministic simulator keeps disks in memory; this is the same state a file snapshot
        holds, without touching the file system."""
        return self._conn.serialize()

    def restore_bytes(self, image: bytes, index: int) -> None:
        """Replace the whole state by an image from `snapshot_bytes`, which reflects `index`."""
        if self._path != ":memory:":
            raise ValueError("restore_bytes is for in-memory machines")
        self._conn.deserialize(image)
        self._init_schema()
        self._applied = self._read_applied()
        assert self._applied == index, f"image says {self._applied}, expected {index}"

    def close(self) -> None:
        self._conn.close()

    # ---- internals ----------------------------------------------------------------
    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _init_schema(self) -> None:
        conn = self._conn
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _raft_meta (id INTEGER PRIMARY KEY, applied_index INTEGER NOT NULL)"
        )
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

    def _apply_in_session(self, conn: sqlite3.Connection, now_ms: int, command: Command) -> bytes:
        if command.client_id == 0:  # sessionless: caller accepts at-least-once
            return self.apply_command(conn, now_ms, command.data)
        row = conn.execute(
            "SELECT seq, result FROM _sessions WHERE client_id = ?", (command.client_id,)
        ).fetchone()
        if row is not None:
            last_seq, last_result = int(row[0]), bytes(row[1])
            if command.seq == last_seq:
                return last_result
            if command.seq < last_seq:
                return SESSION_RESULT_STALE
        result = self.apply_command(conn, now_ms, command.data)
        conn.execute(
            "INSERT INTO _sessions (client_id, seq, result, touched_index) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(client_id) DO UPDATE SET seq = excluded.seq, result = excluded.result,"
            " touched_index = excluded.touched_index",
            (command.client_id, command.seq, result, self._applied + 1),
        )
        return result

    @staticmethod
    def _evict_sessions(conn: sqlite3.Connection) -> None:
        (count,) = conn.execute("SELECT count(*) FROM _sessions").fetchone()
        if count > SESSIONS_MAX:
            conn.execute(
                "DELETE FROM _sessions WHERE client_id IN"
                " (SELECT client_id FROM _sessions ORDER BY touched_index, client_id LIMIT ?)",
                (count - SESSIONS_MAX,),
            )
