"""Who may call the service: API tokens with their role and intake quota, as replicated state.

Why in the store, and not in PostgreSQL or a file: every API process must see a revocation within
seconds, and the intake path must not depend on anything the store does not already need. The
tokens table is small (at most TOKENS_MAX rows), so an API process keeps all of it in memory and
polls `access_version` (one stale read of one integer per refresh interval) to learn that something
changed. A token survives the loss of any one node, like every request it lets in, and each change
is an event in the same log that records everything else an operator does.

Only the SHA-256 of a token's secret is stored: the secret is 256 random bits, so a fast hash is
as good as a slow one against guessing, and a stolen store holds nothing that authenticates.

Owns: the `tokens` table, the `PutToken`, `RevokeToken` and `SetQuota` commands' effects, and the
reads the API's token cache makes. Must never: read a clock, or put a secret (or its hash) in an
event.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, Final

from queues.model import (
    TOKENS_MAX,
    Code,
    EventType,
    EventValue,
    PutToken,
    QueueResult,
    RevokeToken,
    Role,
    SetQuota,
    TokenResult,
    TokenView,
)

Emit = Callable[[EventType, int, str, dict[str, EventValue]], None]

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS tokens (
        name TEXT PRIMARY KEY, role TEXT NOT NULL, secret_hash BLOB NOT NULL UNIQUE,
        created_ms INTEGER NOT NULL, created_by TEXT NOT NULL, revoked_ms INTEGER,
        rate_per_s INTEGER, burst INTEGER) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS access_meta (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO access_meta VALUES (0, 0)",
)

_COLUMNS: Final = "name, role, secret_hash, created_ms, created_by, revoked_ms, rate_per_s, burst"


def create_tables(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


def version(conn: sqlite3.Connection) -> int:
    """Bumped by every change to the tokens table: a cache that saw this version is current."""
    return int(conn.execute("SELECT version FROM access_meta WHERE id = 0").fetchone()[0])


def _bump(conn: sqlite3.Connection) -> int:
    conn.execute("UPDATE access_meta SET version = version + 1 WHERE id = 0")
    return version(conn)


def _view(row: Any) -> TokenView:
    name, role, secret_hash, created_ms, created_by, revoked_ms, rate_per_s, burst = row
    return TokenView(
        name=name, role=Role(role), secret_hash=bytes(secret_hash), created_ms=created_ms, created_by=created_by,
        revoked_ms=revoked_ms, rate_per_s=rate_per_s, burst=burst,
    )  # fmt: skip


def token(conn: sqlite3.Connection, name: str) -> TokenView | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM tokens WHERE name = ?", (name,)).fetchone()
    return None if row is None else _view(row)


def tokens(conn: sqlite3.Connection) -> list[TokenView]:
    """Every token, revoked ones included (a cache must learn that a token it holds is revoked)."""
    return [_view(row) for row in conn.execute(f"SELECT {_COLUMNS} FROM tokens ORDER BY name LIMIT ?", (TOKENS_MAX,))]


def _result(conn: sqlite3.Connection, name: str, current_version: int) -> TokenResult:
    view = token(conn, name)
    assert view is not None
    return TokenResult(
        code=Code.OK, name=name, role=view.role, revoked=view.revoked_ms is not None, version=current_version
    )


def put_token(conn: sqlite3.Connection, now_ms: int, command: PutToken, emit: Emit) -> QueueResult:
    holder = conn.execute("SELECT name FROM tokens WHERE secret_hash = ?", (command.secret_hash,)).fetchone()
    if holder is not None and holder[0] != command.name:
        return TokenResult(code=Code.CONFLICT, name=command.name, version=version(conn))
    existing = token(conn, command.name)
    if existing is None:
        (count,) = conn.execute("SELECT count(*) FROM tokens").fetchone()
        if count >= TOKENS_MAX:
            return TokenResult(code=Code.INVALID, name=command.name, version=version(conn))
        conn.execute(
            "INSERT INTO tokens (name, role, secret_hash, created_ms, created_by) VALUES (?, ?, ?, ?, ?)",
            (command.name, command.role.value, command.secret_hash, now_ms, command.actor),
        )
    else:
        conn.execute(
            "UPDATE tokens SET role = ?, secret_hash = ?, created_ms = ?, created_by = ?, revoked_ms = NULL"
            " WHERE name = ?",
            (command.role.value, command.secret_hash, now_ms, command.actor, command.name),
        )
    emit(
        EventType.TOKEN_PUT, 0, "",
        {"name": command.name, "role": command.role.value, "actor": command.actor, "reason": command.reason,
         "rotated": existing is not None, "role_before": None if existing is None else existing.role.value},
    )  # fmt: skip
    return _result(conn, command.name, _bump(conn))


def revoke_token(conn: sqlite3.Connection, now_ms: int, command: RevokeToken, emit: Emit) -> QueueResult:
    existing = token(conn, command.name)
    if existing is None:
        return TokenResult(code=Code.NOT_FOUND, name=command.name, version=version(conn))
    if existing.revoked_ms is not None:  # a repeat changes nothing and records nothing
        return _result(conn, command.name, version(conn))
    conn.execute("UPDATE tokens SET revoked_ms = ? WHERE name = ?", (now_ms, command.name))
    emit(
        EventType.TOKEN_REVOKED, 0, "",
        {"name": command.name, "role": existing.role.value, "actor": command.actor, "reason": command.reason},
    )  # fmt: skip
    return _result(conn, command.name, _bump(conn))


def set_quota(conn: sqlite3.Connection, command: SetQuota, emit: Emit) -> QueueResult:
    existing = token(conn, command.name)
    if existing is None:
        return TokenResult(code=Code.NOT_FOUND, name=command.name, version=version(conn))
    conn.execute(
        "UPDATE tokens SET rate_per_s = ?, burst = ? WHERE name = ?", (command.rate_per_s, command.burst, command.name)
    )
    emit(
        EventType.QUOTA_SET, 0, "",
        {"name": command.name, "actor": command.actor, "rate_per_s": command.rate_per_s, "burst": command.burst,
         "rate_per_s_before": existing.rate_per_s, "burst_before": existing.burst},
    )  # fmt: skip
    return _result(conn, command.name, _bump(conn))
