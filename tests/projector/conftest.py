"""Fixtures of the projector tests: a real one-node store in this process, and a real embedded
PostgreSQL (one server for the session, a fresh migrated database per test)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from projector_support import FAST, KINDS, Traffic, execute, short_event_retention

from ledger import migrate, pg
from queues import QueueClient, RaftClient
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.EmbeddedPostgres]:
    with pg.temporary_server(prefix="projector-tests-pg-") as server:
        pg.wait_until_accepting(server.address)
        yield server


@pytest.fixture(scope="session")
def migrated_template(postgres: pg.EmbeddedPostgres) -> str:
    asyncio.run(execute(postgres.dsn, "CREATE DATABASE projector_template"))
    migrate.apply(postgres.dsn.rsplit("/", 1)[0] + "/projector_template")
    return "projector_template"


@pytest.fixture()
def pg_dsn(postgres: pg.EmbeddedPostgres, migrated_template: str) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(execute(postgres.dsn, f"CREATE DATABASE {name} TEMPLATE {migrated_template}"))
    return postgres.dsn.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


@pytest.fixture
async def queue(store: StoreThread) -> AsyncIterator[QueueClient]:
    client = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    for kind in KINDS:
        await client.set_policy(kind, FAST)
    yield client
    await client.raft.close()


@pytest.fixture
async def gapped(tmp_path: Path) -> AsyncIterator[tuple[StoreThread, QueueClient]]:
    """A store whose event log lost its first events (set_policy x3, enqueue x3) to a 200 ms
    event retention, and a client of it."""

    with running_store(tmp_path / "gapped", short_event_retention) as store:
        client = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
        try:
            for kind in KINDS:
                await client.set_policy(kind, FAST)
            await Traffic(client, seed=5).enqueue(3)
            await asyncio.sleep(0.3)
            assert (await client.purge()).events_purged == 6
            yield store, client
        finally:
            await client.raft.close()
