"""The port's tables in SQLite: the simulator's store, and the port's second implementation.

Each port table is a `(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID` table; BLOBs compare with
memcmp, so key order is the port's. In memory (":memory:") the whole state is one byte image
(`image` / `load_image`: SQLite's serialize), which is what the deterministic simulator takes at
every simulated fsync; on a file it is a complete store (WAL mode, a group of applies per
transaction, `sync` for durability), slower than LMDB and kept for the conformance suite and the
simulator, not for the nodes.

Must never: commit an entry's half.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

from queues.core.port import KvRead, KvWrite, Table
from queues.stores import StoreError

T = TypeVar("T")

COMMIT_EVERY_CHANGES: Final = 16_384
_FETCH: Final = 64


class _Tx:
    """The port over the store's connection (inside its open transaction, or between them)."""

    __slots__ = ("_conn", "changes")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.changes = 0

    def get(self, table: Table, key: bytes) -> bytes | None:
        row = self._conn.execute(f"SELECT v FROM t{table.value} WHERE k = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        where, params = "k >= ?", [start]
        if stop is not None:
            where, params = "k >= ? AND k < ?", [start, stop]
        order = "DESC" if reverse else "ASC"
        cursor = self._conn.execute(f"SELECT k, v FROM t{table.value} WHERE {where} ORDER BY k {order}", params)
        while rows := cursor.fetchmany(_FETCH):
            for key, value in rows:
                yield bytes(key), bytes(value)

    def count(self, table: Table) -> int:
        return int(self._conn.execute(f"SELECT count(*) FROM t{table.value}").fetchone()[0])

    def put(self, table: Table, key: bytes, value: bytes, *, append: bool = False) -> None:
        if append:
            last = self._conn.execute(f"SELECT max(k) FROM t{table.value}").fetchone()[0]
            if last is not None and bytes(last) >= key:
                raise StoreError(f"{table.name}: an append of {key.hex()} is not above the table's last key")
        self._conn.execute(f"INSERT OR REPLACE INTO t{table.value} (k, v) VALUES (?, ?)", (key, value))
        self.changes += 1

    def delete(self, table: Table, key: bytes) -> bool:
        found = self._conn.execute(f"DELETE FROM t{table.value} WHERE k = ?", (key,)).rowcount > 0
        self.changes += found
        return found

    def claim(self, table: Table, key: bytes, value: bytes) -> bytes | None:
        if self._conn.execute(f"INSERT OR IGNORE INTO t{table.value} (k, v) VALUES (?, ?)", (key, value)).rowcount:
            self.changes += 1
            return None
        return self.get(table, key)


class SqlitePinned:
    """A read transaction pinned on a file store, on a connection of its own."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("BEGIN")
        self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the read snapshot starts here

    def read(self) -> KvRead:
        return _Tx(self._conn)

    def write(self, path: Path) -> None:
        _backup(self._conn, path)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("COMMIT")
        self._conn.close()


class SqliteStore:
    """The port's tables in one SQLite database (see the module docstring)."""

    def __init__(self, path: str | Path = ":memory:", *, commit_every: int = COMMIT_EVERY_CHANGES) -> None:
        self.path = str(path)
        self.durable = self.path != ":memory:"
        self.commit_every = commit_every
        self._open = False
        self._changes = 0
        self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.durable:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA temp_store=MEMORY")
        for table in Table:
            conn.execute(f"CREATE TABLE IF NOT EXISTS t{table.value} (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        return conn

    def call(self, fn: Callable[..., T], *args: object) -> T:
        result = fn(*args)
        if self._changes >= self.commit_every:
            self.commit()
        return result

    @contextlib.contextmanager
    def write(self) -> Iterator[KvWrite]:
        conn = self._conn
        if not self._open:
            conn.execute("BEGIN")
            self._open = True
        conn.execute("SAVEPOINT entry")
        tx = _Tx(conn)
        try:
            yield tx
        except BaseException:
            conn.execute("ROLLBACK TO entry")
            conn.execute("RELEASE entry")
            raise
        conn.execute("RELEASE entry")
        self._changes += tx.changes

    def read(self) -> KvRead:
        return _Tx(self._conn)

    @property
    def uncommitted(self) -> bool:
        return self._open

    def commit(self) -> None:
        if self._open:
            self._conn.execute("COMMIT")
            self._open = False
            self._changes = 0

    def sync(self) -> bool:
        self.commit()
        if not self.durable:
            return False
        self._conn.execute("PRAGMA wal_checkpoint(FULL)").fetchall()
        for name in (self.path, self.path + "-wal"):
            with contextlib.suppress(FileNotFoundError):
                _fsync(name)
        _fsync(os.path.dirname(os.path.abspath(self.path)))
        return True

    def checkpoint(self, index_of: Callable[[KvRead], int]) -> int:
        return index_of(self.read()) if self.sync() else 0

    def pin(self) -> SqlitePinned | None:
        self.commit()
        return SqlitePinned(self.path) if self.durable else None

    def copy_to(self, path: Path) -> None:
        self.commit()
        _backup(self._conn, path)

    def restore(self, path: Path) -> None:
        self.discard()
        self._conn.close()
        if self.durable:
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path + suffix)
            tmp = self.path + ".restore"
            shutil.copyfile(path, tmp)
            os.replace(tmp, self.path)
            self._conn = self._connect()
        else:
            self._conn = self._connect()
            source = sqlite3.connect(str(path))
            try:
                source.backup(self._conn)
            finally:
                source.close()

    def image(self) -> bytes:
        """The whole state as one byte image (an in-memory store's snapshot, for the simulator)."""
        self.commit()
        return self._conn.serialize()

    def load_image(self, image: bytes) -> None:
        """Replace the whole state by an image from `image`."""
        if self.durable:
            raise StoreError("load_image is for a store in memory")
        self.discard()
        self._conn.deserialize(image)

    def discard(self) -> None:
        """Undo every write since the last commit."""
        if self._open:
            self._conn.execute("ROLLBACK")
            self._open = False
            self._changes = 0

    def close(self) -> None:
        self.commit()
        self._conn.close()

    def abandon(self) -> None:
        """Close without committing: what was not committed is gone, as after a crash."""
        with contextlib.suppress(sqlite3.Error):
            self.discard()
        self._conn.close()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _backup(source: sqlite3.Connection, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    target = sqlite3.connect(str(tmp))
    try:
        source.backup(target)
    finally:
        target.close()
    os.replace(tmp, path)
