"""The due-time index: which waiting messages are due at `now_ms`, over SQLite.

Owns: the partial indexes on a message table and the range scans over them. The table is the
caller's (queues/machine.py); this module only assumes the columns
`id INTEGER PRIMARY KEY, kind TEXT, phase INTEGER, due_ms INTEGER, lease_deadline_ms INTEGER`.

Design: there is no promotion pass. A waiting message (phase PHASE_WAITING) is *delayed* while
`due_ms > now_ms` and *ready* once `due_ms <= now_ms`; the passage of time is the promotion. The
partial index `(kind, due_ms, id) WHERE phase = PHASE_WAITING` is covering for the lease scan, so
"the n oldest due messages of kind k" is one B-tree descent plus n steps: O(log N + n), independent
of how many messages are delayed (1 or 10,000,000) and of how many became due in the same second
(a burst of 500,000 is drained batch by batch, each batch O(batch)). Lateness is `now_ms - due_ms`
of a granted message, and the oldest due message's lateness per kind is one index probe.

Must never: read a clock (time is the `now_ms` argument), or scan the table without an index.
"""

from __future__ import annotations

import sqlite3
from typing import Final

PHASE_WAITING: Final = 1
"""Delayed or ready: decided by due_ms against now_ms, never stored."""
PHASE_LEASED: Final = 2

SCAN_LIMIT_MAX: Final = 10_000


def create_indexes(conn: sqlite3.Connection, table: str) -> None:
    assert table.isidentifier()
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {table}_due ON {table} (kind, due_ms, id) WHERE phase = {PHASE_WAITING}"
    )
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {table}_lease_deadline ON {table} (lease_deadline_ms, id)"
        f" WHERE phase = {PHASE_LEASED}"
    )


def due_cursor(conn: sqlite3.Connection, table: str, *, kind: str, now_ms: int, limit: int) -> sqlite3.Cursor:
    """A lazy cursor over (id, due_ms) of the `limit` oldest due messages of `kind`, oldest first."""
    assert 0 < limit <= SCAN_LIMIT_MAX
    return conn.execute(
        f"SELECT id, due_ms FROM {table} INDEXED BY {table}_due"
        f" WHERE kind = ? AND phase = {PHASE_WAITING} AND due_ms <= ? ORDER BY due_ms, id LIMIT ?",
        (kind, now_ms, limit),
    )


def oldest_due_ms(conn: sqlite3.Connection, table: str, *, kind: str, now_ms: int) -> int | None:
    """The due time of the oldest ready message of `kind` (None when nothing is due): one probe."""
    row = conn.execute(
        f"SELECT min(due_ms) FROM {table} INDEXED BY {table}_due WHERE kind = ? AND phase = {PHASE_WAITING}"
        " AND due_ms <= ?",
        (kind, now_ms),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def next_due_ms(conn: sqlite3.Connection, table: str, *, kind: str, now_ms: int) -> int | None:
    """When the next delayed message of `kind` becomes ready (for long-poll wake-ups): one probe."""
    row = conn.execute(
        f"SELECT min(due_ms) FROM {table} INDEXED BY {table}_due WHERE kind = ? AND phase = {PHASE_WAITING}"
        " AND due_ms > ?",
        (kind, now_ms),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def count_ready(conn: sqlite3.Connection, table: str, *, kind: str, now_ms: int) -> int:
    """Ready (waiting and due) messages of `kind` at now_ms: one index range count, O(ready)."""
    row = conn.execute(
        f"SELECT count(*) FROM {table} INDEXED BY {table}_due WHERE kind = ? AND phase = {PHASE_WAITING}"
        " AND due_ms <= ?",
        (kind, now_ms),
    ).fetchone()
    return int(row[0])


def expired_lease_ids(conn: sqlite3.Connection, table: str, *, now_ms: int, limit: int) -> list[int]:
    """Ids of leased messages whose deadline is at or before now_ms, earliest deadline first."""
    assert 0 < limit <= SCAN_LIMIT_MAX
    rows = conn.execute(
        f"SELECT id FROM {table} INDEXED BY {table}_lease_deadline"
        f" WHERE phase = {PHASE_LEASED} AND lease_deadline_ms <= ? ORDER BY lease_deadline_ms, id LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    return [int(row[0]) for row in rows]
