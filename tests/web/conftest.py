"""Fixtures for the review pages' in-process tests: a real store on a thread (as tests/api has),
and the API tests' support module, importable here by its name too."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))  # api_support, shared with tests/api

from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread
