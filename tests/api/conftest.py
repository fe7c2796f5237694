"""Fixtures for the API tests (what they are built from is in api_support.py, which the tests
import by that name: a module named conftest is not unique across the suite)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from api_support import Api, queue_store, running_api

from raft_store.testing.inprocess import StoreThread


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    thread = queue_store(tmp_path / "store")
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
async def api(store: StoreThread) -> AsyncIterator[Api]:
    async with running_api(store) as running:
        yield running
