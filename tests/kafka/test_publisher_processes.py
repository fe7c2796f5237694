"""`compensator events-publish` as real processes: the active publisher killed with -9 mid-stream,
two standbys, one of which takes over from the saved cursor; and a store leader killed while
publishing (three node processes). After dropping repeated sequence numbers, every event is on
the topic exactly once, as the store has it, in order per ref key."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kafka_support import FAST, ROOT, Broker, kafka_env, read_topic, spawn, stop_process, until
from publisher_support import TOPIC, check_topic, deduplicated, enqueue, last_seq, lease_body, publishing

from queues import QueueClient, RaftClient
from raft_store.testing.inprocess import StoreThread
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow


def publisher_env(broker: Broker, store: StoreThread) -> dict[str, str]:
    return kafka_env(broker.bootstrap, store, events_topic=TOPIC, publisher_batch_max=10, publisher_poll_ms=50,
                     publisher_lease_ms=1500, partitions=3)  # fmt: skip


async def test_a_publisher_killed_mid_stream_is_replaced_by_one_standby_without_a_gap(
    queue: QueueClient, store: StoreThread, broker: Broker, tmp_path: Path
) -> None:
    await enqueue(queue, 0, 300)
    env = publisher_env(broker, store)
    first = spawn("events-publish", env, tmp_path / "a.log", "--holder", "a")
    try:
        await until(lambda: _published(broker, 60), what="a published some events")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert (await lease_body(queue)).holder == "a"  # killed: it never released its claim
    standbys = {name: spawn("events-publish", env, tmp_path / f"{name}.log", "--holder", name) for name in ("b", "c")}
    try:
        await enqueue(queue, 300, 200)
        target = await last_seq(queue)
        await until(lambda: _published(broker, target, distinct=True), timeout_s=90, what="every event published")
        holder = (await lease_body(queue)).holder
        active = [name for name in standbys if "is the active publisher" in (tmp_path / f"{name}.log").read_text()]
        assert active == [holder], f"one standby takes over, the other stays a standby: {active}, holder {holder}"
    finally:
        for process in standbys.values():
            stop_process(process)
    for name, process in standbys.items():
        assert process.returncode == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    await check_topic(queue, await read_topic(broker.bootstrap, TOPIC), target)


# ---- a store leader change: three node processes -------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        patch.chdir(ROOT)
        nodes = ProcessCluster(
            tmp_path / "nodes", machine="queues.replicated:machine_factory", extra_args=["--volatile"]
        )
        nodes.start_all()
        try:
            yield nodes
        finally:
            nodes.stop_all()


@pytest.fixture
async def cluster_queue(cluster: ProcessCluster) -> AsyncIterator[QueueClient]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        await cluster.wait_leader(raft, timeout_s=30.0)
        queue = QueueClient(raft)
        await queue.set_policy("transfer", FAST, actor="test")
        yield queue
    finally:
        await raft.close()


async def test_events_published_across_a_store_leader_change_are_each_there_once_in_order(
    cluster: ProcessCluster, cluster_queue: QueueClient, broker: Broker
) -> None:
    queue = cluster_queue
    await enqueue(queue, 0, 100)
    async with publishing(queue, broker, "p1", batch_max=10) as (publisher, _):
        await until(lambda: _acked(publisher, 30), what="publishing began")
        leader = await cluster.wait_leader(queue.raft)
        writer = asyncio.create_task(_keep_enqueueing(queue, 100, 200))
        cluster.kill(leader)
        await cluster.wait_leader(queue.raft, timeout_s=30.0, exclude=leader)
        await writer
        cluster.start(leader)
        target = await last_seq(queue)
        await until(lambda: _acked(publisher, target), timeout_s=90, what="the publisher caught up")
    await check_topic(queue, await read_topic(broker.bootstrap, TOPIC), target)


async def _keep_enqueueing(queue: QueueClient, start: int, count: int) -> None:
    for batch in range(start, start + count, 10):
        while True:
            try:
                await enqueue(queue, batch, 10)  # the same keys again after a lost answer: no duplicates
                break
            except Exception:
                await asyncio.sleep(0.2)


async def _acked(publisher: object, seq: int) -> bool:
    return int(publisher.acked) >= seq  # type: ignore[attr-defined]


async def _published(broker: Broker, count: int, *, distinct: bool = False) -> bool:
    records = await read_topic(broker.bootstrap, TOPIC, timeout_s=5)
    return (len(deduplicated(records)) if distinct else len(records)) >= count
