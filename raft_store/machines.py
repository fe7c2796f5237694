"""Two small state machines: a key-value store (tests, examples) and a counter (benchmarks).

The queue machine (queues/machine.py) is the real one; these exist so raft_store can be tested
and measured on its own, through the same StateMachine contract.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Sequence
from pathlib import Path

from raft_store.files import private_file
from raft_store.sqlite_machine import SqliteStateMachine
from raft_store.state_machine import Command

_APPLIED = struct.Struct(">QQ")


class KvMachine(SqliteStateMachine):
    """Commands are JSON {"op": "put", "key": k, "value": v} or {"op": "append", ...}; reads
    are JSON {"key": k}. Results echo the applied index so tests can check exactly-once."""

    def create_tables(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        try:
            command = json.loads(data)
            op, key, value = command["op"], str(command["key"]), str(command.get("value", ""))
        except (ValueError, KeyError, TypeError):
            return b'{"error":"bad command"}'
        if op == "put":
            conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))
        elif op == "append":
            conn.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value || ',' || excluded.value",
                (key, value),
            )
        else:
            return b'{"error":"unknown op"}'
        return json.dumps({"ok": True, "index": self.applied_index() + 1}).encode()

    def query(self, data: bytes) -> bytes:
        try:
            key = str(json.loads(data)["key"])
        except (ValueError, KeyError, TypeError):
            return b'{"error":"bad query"}'
        row = self._conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return json.dumps({"key": key, "value": row[0] if row else None}).encode()


class CounterMachine:
    """Counts commands and remembers nothing else: the cost of the log, not of a state store.

    Its applied index lives in memory and in its snapshot, so a restart replays the log tail
    after the last snapshot, which is exactly the contract."""

    def __init__(self) -> None:
        self._applied = 0
        self._count = 0

    def applied_index(self) -> int:
        return self._applied

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True) -> list[bytes]:
        self._applied = index
        self._count += len(commands)
        return [b""] * len(commands)

    def note_applied(self, index: int) -> None:
        self._applied = index

    def write_snapshot(self, path: Path) -> int:
        private_file(path)
        path.write_bytes(_APPLIED.pack(self._applied, self._count))
        return self._applied

    def restore_snapshot(self, path: Path, index: int) -> None:
        self._applied, self._count = _APPLIED.unpack(path.read_bytes())
        assert self._applied == index

    def query(self, data: bytes) -> bytes:
        return json.dumps({"count": self._count, "applied": self._applied}).encode()

    def close(self) -> None:
        pass
