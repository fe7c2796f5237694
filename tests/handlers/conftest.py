"""Fixtures of the handler tests: one embedded PostgreSQL and database for the session, emptied
before each test, and a fresh set of stand-ins per test (their faults, counters and ledgers start
empty, and they create their tables, as they would in a new database)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from handlers_support import SECRETS, Standins, emptied, fresh_database, handler_settings, running_standins

from handlers.registry import Registry, build_registry
from ledger import pg


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.EmbeddedPostgres]:
    with pg.temporary_server(prefix="handlers-tests-pg-") as server:
        pg.wait_until_accepting(server.address)
        yield server


@pytest.fixture(scope="session")
def session_database(postgres: pg.EmbeddedPostgres) -> str:
    return fresh_database(postgres, f"h_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def database(session_database: str) -> str:
    """The session's database, emptied: no stand-in table survives from another test."""
    return emptied(session_database)


@pytest.fixture
def standins(database: str) -> Iterator[Standins]:
    with running_standins(database) as running:
        yield running


@pytest.fixture
async def registry(standins: Standins) -> AsyncIterator[Registry]:
    """The three handlers over the stand-ins, as a worker would hold them."""
    async with build_registry(handler_settings(standins), secrets=SECRETS) as built:
        yield built
