"""The outbox table a producer adds to its own database, and the one check of its name.

Owns: the DDL (:func:`ddl`, applied by :func:`install` or by the producer's own migration tool),
and which table names are accepted (a plain SQL identifier, since it is spliced into statements).

The shape: one row per request, unique by idempotency key; ``state`` is ``pending`` until the API
answered, then ``sent`` (201 created, or 200 a replay of the same key and body) or ``rejected``
(the API refused the request itself; the problem it answered is kept in ``problem``). A pending
row's ``next_attempt_at`` is when a relay may try it again; the partial index keeps claiming due
rows cheap however many sent rows accumulate.

Must never: drop or rewrite a producer's rows.
"""

from __future__ import annotations

import re
from typing import Any, Final

DEFAULT_TABLE: Final = "compensator_outbox"
_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")
STATES: Final = ("pending", "sent", "rejected")


def check_table(table: str) -> str:
    """``table`` when it is a lower-case SQL identifier of at most 48 characters; ValueError otherwise."""
    if _IDENTIFIER.fullmatch(table) is None:
        raise ValueError(f"an outbox table name is a lower-case SQL identifier (a-z, 0-9, _), got {table!r}")
    return table


def ddl(table: str = DEFAULT_TABLE) -> str:
    """CREATE statements for the outbox table (idempotent: IF NOT EXISTS)."""
    check_table(table)
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    id               bigserial   PRIMARY KEY,
    idempotency_key  text        NOT NULL UNIQUE,
    body             jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'rejected')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    response_status  integer,
    request_id       text,
    problem          jsonb,
    last_error       text,
    CHECK ((state = 'pending') = (finished_at IS NULL))
);
CREATE INDEX IF NOT EXISTS {table}_due ON {table} (next_attempt_at, id) WHERE state = 'pending';
"""


async def install(connection: Any, table: str = DEFAULT_TABLE) -> None:
    """Create the outbox table and its index when missing (an asyncpg connection). Several relays
    started with --install-table at once would collide (IF NOT EXISTS is not safe against a
    concurrent create in PostgreSQL), so the create runs under a transaction lock of the table's name."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"compensator outbox {table}")
        await connection.execute(ddl(table))


async def exists(connection: Any, table: str = DEFAULT_TABLE) -> bool:
    return bool(await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", check_table(table)))
