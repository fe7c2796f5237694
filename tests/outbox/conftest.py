"""Fixtures for the outbox tests (helpers in outbox_support.py, imported by that name)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from outbox_support import ApiServer, producer_database

from ledger import pg
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.EmbeddedPostgres]:
    with pg.temporary_server(prefix="outbox-tests-pg-") as server:
        pg.wait_until_accepting(server.address)
        yield server


@pytest.fixture
async def producer_dsn(postgres: pg.EmbeddedPostgres) -> str:
    return await producer_database(postgres)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


@pytest.fixture
async def api(store: StoreThread) -> AsyncIterator[ApiServer]:
    """The API, not yet serving: each test says when it is up."""
    server = ApiServer(store)
    try:
        yield server
    finally:
        await server.down()
