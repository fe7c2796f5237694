"""Fixtures for the Kafka tests (their parts are in kafka_support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kafka_support import FAST, Broker, running_tansu

from queues import QueueClient, RaftClient
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with running_tansu(tmp_path / "tansu") as running:
        yield running


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


@pytest.fixture
async def queue(store: StoreThread) -> AsyncIterator[QueueClient]:
    client = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    for kind in ("transfer", "list_update", "callback"):
        await client.set_policy(kind, FAST, actor="test")
    yield client
    await client.raft.close()
