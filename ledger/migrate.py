"""Versioned SQL migrations for the service's PostgreSQL schema.

Owns: discovering ``ledger/migrations/NNNN_name.sql``, applying the ones not yet applied, each in
its own transaction, and recording version, name and checksum in ``schema_migrations``.

Must never: edit an applied migration silently (a checksum change is an error: write a new version),
or run concurrently with another runner (a transaction-level advisory lock serialises them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Final

import asyncpg

MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
_FILE_PATTERN: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_ID: Final = 0x636F6D70  # "comp": any constant shared by all runners of this schema

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """The database and the migration files disagree; a person has to look."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """All migrations in version order; gaps and duplicates are programmer errors."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_PATTERN.match(path.name)
        if match is None:
            raise MigrationError(f"migration file name must look like 0001_name.sql: {path.name}")
        found.append(Migration(version=int(match[1]), name=match[2], sql=path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, got {versions}")
    return found


async def apply_async(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply pending migrations; return the versions applied now (empty when up to date)."""
    migrations = discover(directory)
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():  # IF NOT EXISTS alone races another runner's create (pg_type)
            await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
            await connection.execute(_BOOKKEEPING)
        applied_now: list[int] = []
        for migration in migrations:
            async with connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
                recorded = await connection.fetchval(
                    "SELECT checksum FROM schema_migrations WHERE version = $1", migration.version
                )
                if recorded is not None:
                    if recorded != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version}_{migration.name} changed after it was applied"
                        )
                    continue
                await connection.execute(migration.sql)
                await connection.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
                applied_now.append(migration.version)
        return applied_now
    finally:
        await connection.close()


def apply(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Synchronous wrapper for callers without an event loop (CLI, Spark driver)."""
    return asyncio.run(apply_async(dsn, directory))
