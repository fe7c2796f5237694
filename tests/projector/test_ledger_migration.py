"""Migration 0004 on a ledger that already has rows: uuid ids become text and keep their attempts,
and an idempotency key may come back as a second request (the store reuses a key once it purged
the first request's tombstone)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest
from projector_support import execute

from ledger import migrate, pg

_REQUEST = """INSERT INTO compensation_requests (request_id, kind, idempotency_key, ref_key, amount_minor, currency,
    state, created_at) VALUES ($1, 'transfer', 'k-1', 'r', 100, 'CNY', 'PENDING', now())"""


async def test_existing_rows_keep_their_ids_as_text_and_a_key_may_return(
    postgres: pg.EmbeddedPostgres, tmp_path: Path
) -> None:
    name = f"m_{uuid.uuid4().hex[:12]}"
    await execute(postgres.dsn, f"CREATE DATABASE {name}")
    dsn = postgres.dsn.rsplit("/", 1)[0] + f"/{name}"
    for path in sorted(migrate.MIGRATIONS_DIR.glob("*.sql"))[:3]:
        shutil.copy(path, tmp_path / path.name)
    assert await migrate.apply_async(dsn, tmp_path) == [1, 2, 3]
    old = str(uuid.uuid4())
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(_REQUEST, uuid.UUID(old))
        await connection.execute(
            "INSERT INTO compensation_attempts (request_id, attempt_number, started_at, outcome)"
            " VALUES ($1, 1, now(), 'IN_PROGRESS')", uuid.UUID(old),
        )  # fmt: skip
        assert await migrate.apply_async(dsn) == [4, 5, 6]  # 0005 (the producers' outbox) and 0006 ride along
        await connection.close()
        connection = await asyncpg.connect(dsn)  # its statements were prepared for a uuid column
        assert await connection.fetchval("SELECT request_id FROM compensation_attempts") == old
        await connection.execute(_REQUEST, "1-2")  # the same key, a later request
        assert (
            await connection.fetchval("SELECT count(*) FROM compensation_requests WHERE idempotency_key = 'k-1'") == 2
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute(
                "INSERT INTO compensation_attempts (request_id, attempt_number, started_at, outcome)"
                " VALUES ('1-2', 1, now(), 'NOT_AN_OUTCOME')"
            )
        await connection.execute("DELETE FROM compensation_requests WHERE request_id = $1", old)
        assert await connection.fetchval("SELECT count(*) FROM compensation_attempts") == 0, "attempts cascade"
    finally:
        await connection.close()


async def test_runners_started_at_once_on_a_new_database_all_succeed(postgres: pg.EmbeddedPostgres) -> None:
    """Projectors started at once (a standby beside the active one, processes restarted together)
    each migrate the one ledger.
    `CREATE TABLE IF NOT EXISTS` is not safe against itself in PostgreSQL (two creators collide on
    pg_type's unique index), so the bookkeeping table is created under the runners' lock too."""
    import asyncio

    for _ in range(3):  # the collision needs the creates to overlap: a few fresh databases
        name = f"m_{uuid.uuid4().hex[:12]}"
        await execute(postgres.dsn, f"CREATE DATABASE {name}")
        dsn = postgres.dsn.rsplit("/", 1)[0] + f"/{name}"
        applied = await asyncio.gather(*(migrate.apply_async(dsn) for _ in range(6)))
        versions = sorted(version for found in applied for version in found)
        assert versions == [m.version for m in migrate.discover()], "each migration applied once, by one runner"
