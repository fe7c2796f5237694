"""One clock, on real processes: a node whose wall clock is 30 s off (libfaketime) leads a set of
three, and what is due, ready and expired still follows the log's clock (docs/queue.md).

- 30 s slow and leading: a request enqueued now is ready at once on the leader's reads (it used to
  read as delayed for 30 s, and workers, which lease only what reads call ready, waited), and a
  retry due in 1 s becomes leasable about 1 s later, not 31 s;
- 30 s fast and taking over: no open lease expires on the takeover (16 of 16 did in one second);
- each node reports its wall clock's offset from the log's clock (the alert's metric).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from delay.policy import RetryPolicy
from queues.client import QueueClient
from queues.model import BatchResult, Code, ExpireLeases, State
from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster, skewed_clock_env

pytestmark = pytest.mark.slow

MACHINE = "queues.replicated:machine_factory"
SKEWED = 3
POLICY = RetryPolicy(tiers_ms=(1000,), tier_jitter_ratio=0.0, attempts_max=5)


def faketime(offset_s: int) -> dict[str, str]:
    """The environment of a process whose wall clock is `offset_s` off (its monotonic clock untouched)."""
    env = skewed_clock_env(offset_s)
    if env is None:  # a missing system package is a set-up error, not a skip
        pytest.fail("libfaketime is needed to skew a process's clock: apt-get install faketime"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    return env


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    nodes = ProcessCluster(tmp_path, machine=MACHINE, extra_args=["--volatile"])
    tmp_path.mkdir(parents=True, exist_ok=True)
    try:
        yield nodes
    finally:
        nodes.stop_all()


@pytest.fixture
async def queue(cluster: ProcessCluster) -> AsyncIterator[QueueClient]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        yield QueueClient(raft)
    finally:
        await raft.close()


async def lead(cluster: ProcessCluster, raft: RaftClient, node: int, timeout_s: float = 20.0) -> None:
    """Move leadership to `node` (a leader transfer, as an operator does it) and wait for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = await cluster.wait_leader(raft)
        if leader == node:
            return
        await raft.admin("transfer", node)
        await asyncio.sleep(0.5)
    raise AssertionError(f"n{node} did not take the lead")


async def start(cluster: ProcessCluster, queue: QueueClient, skew_s: int) -> None:
    for node in cluster.ids:
        cluster.start(node, env=faketime(skew_s) if node == SKEWED else None)
    await cluster.wait_leader(queue.raft)
    await queue.set_policy("test", POLICY, actor="test")


async def test_a_node_30_s_slow_that_leads_calls_due_work_ready_and_retries_on_time(
    cluster: ProcessCluster, queue: QueueClient
) -> None:
    await start(cluster, queue, -30)
    await lead(cluster, queue.raft, SKEWED)
    clock = (await queue.raft.status(cluster.address(SKEWED)))["clock"]
    assert -31_000 < clock["offset_ms"] < -29_000, clock  # its wall clock, against the log's
    assert abs(clock["log_ms"] - wall_ms()) < 1000, clock  # the log's clock is true time

    enqueued = await queue.enqueue("test", idempotency_key="slow-leader", ref_key="r", payload=b"p")
    assert enqueued.code is Code.OK and enqueued.state is State.READY
    due = (await queue.work_due(["test"])).value  # a worker's stale read of the (slow) leader
    assert "test" in due.ready, due
    assert abs(due.now_ms - wall_ms()) < 1000, due

    (grant,) = (await queue.lease("w", kinds=["test"], count_max=1)).grants
    failed = await queue.fail(grant.message_id, grant.token, "timeout")
    assert failed.state is State.DELAYED and failed.due_ms is not None
    started = time.monotonic()
    while not (await queue.lease("w", kinds=["test"], count_max=1)).grants:
        assert time.monotonic() - started < 10, "the retry due in 1 s was not leasable within 10 s"
        await asyncio.sleep(0.05)
    waited_s = time.monotonic() - started
    print(f"\nretry due in 1 s leased after {waited_s:.2f} s with a leader 30 s slow")
    assert waited_s >= 0.9  # not early either: due on the log's clock


async def test_a_node_30_s_fast_taking_over_expires_no_open_lease(cluster: ProcessCluster, queue: QueueClient) -> None:
    await start(cluster, queue, +30)
    first = await cluster.wait_leader(queue.raft)
    if first == SKEWED:
        await lead(cluster, queue.raft, 1)
    for number in range(16):
        await queue.enqueue("test", idempotency_key=f"held-{number}", ref_key="r", payload=b"p")
    grants = (await queue.lease("w", kinds=["test"], count_max=16, lease_ms=20_000)).grants
    assert len(grants) == 16
    await lead(cluster, queue.raft, SKEWED)
    clock = (await queue.raft.status(cluster.address(SKEWED)))["clock"]
    assert 29_000 < clock["offset_ms"] < 31_000, clock
    assert abs(clock["log_ms"] - wall_ms()) < 1000, clock  # its clock did not become the log's
    expired = await queue.submit(ExpireLeases(limit=1000))  # what the maintenance driver proposes
    assert isinstance(expired, BatchResult) and expired.ids == (), expired
    views = (await queue.get_many([g.message_id for g in grants])).value
    assert [v.state for v in views] == [State.LEASED] * 16
    acked = await queue.ack_many([(g.message_id, g.token) for g in grants])
    assert [o.code for o in acked] == [Code.OK] * 16
