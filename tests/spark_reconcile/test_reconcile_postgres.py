"""The embedded PostgreSQL helper and the migration runner, against the real server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest

import outbox
from ledger import migrate, pg
from ledger.kinds import Kind
from ledger.states import OPEN_STATES, LedgerState


def test_migrations_apply_once_and_record_their_versions(pg_dsn: str) -> None:
    assert migrate.apply(pg_dsn) == []  # the template already ran them all
    versions = asyncio.run(_fetch(pg_dsn, "SELECT version FROM schema_migrations ORDER BY version"))
    assert versions == [m.version for m in migrate.discover()]


def test_an_edited_migration_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    for path in migrate.MIGRATIONS_DIR.glob("*.sql"):
        shutil.copy(path, tmp_path / path.name)
    first = sorted(tmp_path.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(migrate.MigrationError, match="changed after it was applied"):
        migrate.apply(pg_dsn, tmp_path)


def test_migration_files_must_not_have_gaps(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(migrate.MigrationError, match="without gaps"):
        migrate.discover(tmp_path)


def test_ledger_invariants_are_enforced_by_the_schema(pg_dsn: str) -> None:
    open_with_finish = """INSERT INTO compensation_requests
        (request_id, kind, idempotency_key, ref_key, amount_minor, currency, state, created_at, finished_at)
        VALUES (gen_random_uuid(), 'transfer', 'k', 'g', 1, 'CNY', 'PENDING', now(), now())"""
    with pytest.raises(asyncpg.CheckViolationError):
        asyncio.run(_fetch(pg_dsn, open_with_finish))


def test_the_schema_admits_exactly_the_ledger_states_finished_exactly_when_not_open(pg_dsn: str) -> None:
    for state in LedgerState:
        is_open = state in OPEN_STATES
        asyncio.run(_insert_request(pg_dsn, state.value, finished=not is_open))
        with pytest.raises(asyncpg.CheckViolationError):
            asyncio.run(_insert_request(pg_dsn, state.value, finished=is_open))
    with pytest.raises(asyncpg.CheckViolationError):
        asyncio.run(_insert_request(pg_dsn, "RESOLVED", finished=True))


def test_the_ledger_states_migration_stops_while_a_resolved_row_exists(
    postgres: pg.EmbeddedPostgres, tmp_path: Path
) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_fetch(postgres.dsn, f"CREATE DATABASE {name}"))
    dsn = postgres.dsn.rsplit("/", 1)[0] + f"/{name}"
    for path in sorted(migrate.MIGRATIONS_DIR.glob("*.sql"))[:2]:
        shutil.copy(path, tmp_path / path.name)
    assert migrate.apply(dsn, tmp_path) == [1, 2]
    resolved = asyncio.run(_insert_request(dsn, "RESOLVED", finished=True))
    with pytest.raises(asyncpg.exceptions.RaiseError, match="RESOLVED rows"):
        migrate.apply(dsn)
    asyncio.run(_fetch(dsn, f"UPDATE compensation_requests SET state = 'CANCELLED' WHERE request_id = '{resolved}'"))
    assert migrate.apply(dsn) == [3, 4, 5, 6]
    with pytest.raises(asyncpg.CheckViolationError):
        asyncio.run(_insert_request(dsn, "RESOLVED", finished=True))


def test_a_second_handle_reuses_the_running_server_and_does_not_stop_it(
    postgres: pg.EmbeddedPostgres,
) -> None:
    other = pg.EmbeddedPostgres(postgres.data_dir)
    assert other.start() == postgres.address
    other.stop()
    assert asyncio.run(_fetch(postgres.dsn, "SELECT 1")) == [1]


def test_a_configured_dsn_wins_over_the_embedded_server(tmp_path: Path) -> None:
    with pg.database(tmp_path / "never", {pg.DSN_ENV: "postgresql://u@db:5432/x"}) as dsn:
        assert dsn == "postgresql://u@db:5432/x"
    assert not (tmp_path / "never").exists()


async def _fetch(dsn: str, query: str) -> list[object]:
    connection = await asyncpg.connect(dsn)
    try:
        return [row[0] for row in await connection.fetch(query)]
    finally:
        await connection.close()


async def _insert_request(dsn: str, state: str, *, finished: bool) -> str:
    """One transfer request in ``state``; returns its id."""
    request_id = str(uuid.uuid4())
    created = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            """INSERT INTO compensation_requests (request_id, kind, idempotency_key, ref_key, amount_minor,
                   currency, state, created_at, finished_at)
               VALUES ($1::uuid, $2, $3, 'g-1', 500, 'CNY', $4, $5, $6)""",
            request_id,
            Kind.TRANSFER.value,
            f"{Kind.TRANSFER.value}:{request_id}",
            state,
            created,
            created + dt.timedelta(minutes=5) if finished else None,
        )
    finally:
        await connection.close()
    return request_id


def _new_database(postgres: pg.EmbeddedPostgres) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_fetch(postgres.dsn, f"CREATE DATABASE {name}"))
    return postgres.dsn.rsplit("/", 1)[0] + f"/{name}"


_OUTBOX_SHAPE = """SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns
                   WHERE table_name = 'compensator_outbox' ORDER BY ordinal_position"""
_OUTBOX_CONSTRAINTS = """SELECT pg_get_constraintdef(oid) AS c FROM pg_constraint
                         WHERE conrelid = 'compensator_outbox'::regclass ORDER BY 1"""


def test_the_outbox_migration_is_the_producers_table_and_keeps_every_old_row(
    postgres: pg.EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = _new_database(postgres)
    for path in sorted(migrate.MIGRATIONS_DIR.glob("*.sql"))[:3]:
        shutil.copy(path, tmp_path / path.name)
    assert migrate.apply(dsn, tmp_path) == [1, 2, 3]
    asyncio.run(
        _fetch(
            dsn,
            """INSERT INTO outbox (idempotency_key, kind, ref_key, payload, source, delivered_at,
                               response_status) VALUES ('recon-a', 'transfer', 'g-1', '{"amount_minor": 5}', 's',
                               now(), 201), ('recon-b', 'transfer', 'g-2', '{"amount_minor": 6}', 's', NULL, NULL)""",
        )
    )
    assert migrate.apply(dsn) == [4, 5, 6]
    moved = asyncio.run(
        _rows(dsn, "SELECT idempotency_key, body, state, response_status FROM compensator_outbox ORDER BY 1")
    )
    assert [(r["idempotency_key"], json.loads(r["body"]), r["state"], r["response_status"]) for r in moved] == [
        ("recon-a", {"kind": "transfer", "ref_key": "g-1", "payload": {"amount_minor": 5}}, "sent", 201),
        ("recon-b", {"kind": "transfer", "ref_key": "g-2", "payload": {"amount_minor": 6}}, "pending", None),
    ]
    installed = _new_database(postgres)
    asyncio.run(_install_outbox(installed))
    for query in (_OUTBOX_SHAPE, _OUTBOX_CONSTRAINTS):
        assert asyncio.run(_rows(dsn, query)) == asyncio.run(_rows(installed, query))


async def _rows(dsn: str, query: str) -> list[dict[str, object]]:
    connection = await asyncpg.connect(dsn)
    try:
        return [dict(row) for row in await connection.fetch(query)]
    finally:
        await connection.close()


async def _install_outbox(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await outbox.install(connection)
    finally:
        await connection.close()
