"""The maintenance driver reads before it writes: an idle set gets no log entries from it, and a
lease past its deadline is still expired within a period."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from queues import QueueClient, RaftClient, State
from queues.maintenance import MaintenanceConfig, MaintenanceDriver
from queues.model import Enqueue
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


async def test_an_idle_driver_writes_nothing_and_a_due_expiry_is_proposed(store: StoreThread) -> None:
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    driver = MaintenanceDriver(queue, MaintenanceConfig(expire_every_s=0.05, purge_every_s=0.1))
    try:
        await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="k", ref_key="r", payload=b"p")])
        (grant,) = (await queue.lease("w", count_max=1, lease_ms=400)).grants
        commit = int((await queue.raft.status(store.address))["commit"])
        driver.start()
        await asyncio.sleep(0.25)  # the lease is live: reads only
        assert int((await queue.raft.status(store.address))["commit"]) == commit
        assert driver.stats.reads >= 3 and driver.stats.expire_commands == 0 and driver.stats.purge_commands == 0
        await asyncio.sleep(0.5)  # now it is past its deadline
        view = (await queue.get(grant.message_id)).value
        assert view is not None and view.state in (State.DELAYED, State.READY) and view.attempts == 1
        assert driver.stats.expire_commands >= 1 and driver.stats.expired == 1
        settled = int((await queue.raft.status(store.address))["commit"])
        await asyncio.sleep(0.3)
        assert int((await queue.raft.status(store.address))["commit"]) == settled  # idle again: no writes
    finally:
        await driver.stop()
        await queue.raft.close()


async def test_an_idle_set_is_read_once_per_idle_period_and_a_known_deadline_is_kept(store: StoreThread) -> None:
    """With `idle_every_s` (the service's drivers: 1 s) an idle set costs a read per idle period,
    not one per `expire_every_s`; a lease deadline the driver has read ends the idle wait, so the
    lease is expired at its deadline, not up to a period later."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    driver = MaintenanceDriver(queue, MaintenanceConfig(expire_every_s=0.05, idle_every_s=0.6, purge_every_s=60))
    try:
        driver.start()
        await asyncio.sleep(1.3)  # nothing to do: reads at 0, 0.6 and 1.2 s (not 26 at 0.05 s)
        assert 2 <= driver.stats.reads // 2 <= 3, driver.stats  # two reads a period: what is due, the jobs
        await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="k", ref_key="r", payload=b"p")])
        (grant,) = (await queue.lease("w", count_max=1, lease_ms=2000)).grants
        await asyncio.sleep(0.7)  # the next idle read finds the deadline ~1.3-1.9 s ahead
        reads = driver.stats.reads
        loop = asyncio.get_running_loop()
        started = loop.time()
        while driver.stats.expired == 0 and loop.time() - started < 3:
            await asyncio.sleep(0.02)
        assert driver.stats.expired == 1  # within 2.1 s of the lease (its deadline, then one period at most)
        assert loop.time() - started < 1.6
        assert driver.stats.reads - reads <= 8  # it waited for the deadline, not polling every 0.05 s
        view = (await queue.get(grant.message_id)).value
        assert view is not None and view.state in (State.DELAYED, State.READY)
    finally:
        await driver.stop()
        await queue.raft.close()
