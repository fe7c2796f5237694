"""Fixtures of the handler tests: one embedded PostgreSQL for the session, a fresh database and a
fresh set of stand-ins per test (their faults, counters and ledgers start empty)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from handlers_support import Standins, fresh_database, running_standins

from ledger import pg


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.EmbeddedPostgres]:
    with pg.temporary_server(prefix="handlers-tests-pg-") as server:
        pg.wait_until_accepting(server.address)
        yield server


@pytest.fixture
def database(postgres: pg.EmbeddedPostgres) -> str:
    return fresh_database(postgres, f"h_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def standins(database: str) -> Iterator[Standins]:
    with running_standins(database) as running:
        yield running
