"""Fixtures for the API tests (what they are built from is in api_support.py, which the tests
import by that name: a module named conftest is not unique across the suite)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from api_support import Api, running_api

from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


@pytest.fixture
async def api(store: StoreThread) -> AsyncIterator[Api]:
    async with running_api(store) as running:
        yield running
