"""Redrive jobs on a real 3-process Raft cluster, driven by the maintenance driver: 10,000 dead
letters, a job cancelled halfway (the rest stay dead, reported not redriven) and one run to
completion; two drivers stepping one job keep its rate, and a finished job leaves the set quiet.

The cluster fixture and helpers are test_replicated.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from test_replicated import _connect, _converged, cluster  # noqa: F401  (the fixture)

from queues.client import QueueClient
from queues.maintenance import MaintenanceConfig, MaintenanceDriver
from queues.model import Code, DeadLetterFilter, Enqueue, ItemResult, JobAction, JobState, JobView, RedriveJob, State
from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow

DRIVER = MaintenanceConfig(expire_every_s=0.1, purge_every_s=60.0, job_limit=500)


async def _dead_letters(queue: QueueClient, count: int) -> list[int]:
    """`count` dead letters of kind "test", dead-lettered by permanent failures, in id order."""
    ids: list[int] = []
    for start in range(0, count, 2000):
        batch = [Enqueue(kind="test", idempotency_key=f"d{i}", ref_key=f"r{i}", payload=b'{"amount_minor": 1}')
                 for i in range(start, min(count, start + 2000))]  # fmt: skip
        ids += [r.message_id for r in await queue.enqueue_many(batch)]
    while True:
        grants = (await queue.lease("w", kinds=("test",), count_max=1000, lease_ms=60_000)).grants
        if not grants:
            break
        outcomes = await asyncio.gather(*(queue.fail(g.message_id, g.token, "insufficient_funds", permanent=True)
                                          for g in grants))  # fmt: skip
        assert all(o.code is Code.OK and o.state is State.DEAD for o in outcomes)
    summary = (await queue.dead_letter_summary(DeadLetterFilter(kind="test"))).value
    assert summary.count == count and summary.by_currency == () and summary.without_amount == count
    return ids


async def _job(queue: QueueClient, job_id: int) -> JobView:
    (view,) = (await queue.jobs(ids=[job_id])).value
    return view


async def _until(queue: QueueClient, job_id: int, done: object, timeout_s: float) -> JobView:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = await _job(queue, job_id)
        if done(view):  # type: ignore[operator]
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not get there in {timeout_s} s: {await _job(queue, job_id)}")


async def _done_ms(queue: QueueClient, job_id: int) -> list[int]:
    """The leader time at which each redriven item of the job was redriven."""
    stamps: list[int] = []
    after = 0
    while page := (await queue.job_items(job_id, after_message_id=after, limit=1000, result=ItemResult.REDRIVEN)).value:
        stamps += [item.done_ms for item in page if item.done_ms is not None]
        after = page[-1].message_id
    return stamps


async def _items(queue: QueueClient, job_id: int, result: ItemResult) -> list[int]:
    found: list[int] = []
    after = 0
    while True:
        page = (await queue.job_items(job_id, after_message_id=after, limit=1000, result=result)).value
        if not page:
            return found
        found += [item.message_id for item in page]
        after = page[-1].message_id


@pytest.fixture
async def drivers(cluster: ProcessCluster) -> AsyncIterator[tuple[ProcessCluster, QueueClient, list[MaintenanceDriver]]]:  # noqa: F811
    raft, queue = await _connect(cluster)
    started: list[MaintenanceDriver] = []
    try:
        yield cluster, queue, started
    finally:
        for driver in started:
            await driver.stop()
            await driver.queue.raft.close()
        await raft.close()


def _driver(nodes: ProcessCluster, started: list[MaintenanceDriver]) -> MaintenanceDriver:
    driver = MaintenanceDriver(QueueClient(RaftClient(nodes.addresses(), auth=nodes.auth, attempt_timeout_s=1.0, deadline_s=20.0),
                                           coalesce=False), DRIVER)  # fmt: skip
    started.append(driver)
    driver.start()
    return driver


async def test_ten_thousand_dead_letters_a_job_cancelled_halfway_and_one_run_to_completion(
    drivers: tuple[ProcessCluster, QueueClient, list[MaintenanceDriver]],
) -> None:
    nodes, queue, started = drivers
    ids = await _dead_letters(queue, 10_000)
    first = await queue.start_job(RedriveJob(actor="alice", reason="funds back", ids=tuple(ids), rate_per_s=2000))
    assert first.code is Code.OK and first.job_id is not None and first.refused == ()
    _driver(nodes, started)
    halfway = await _until(queue, first.job_id, lambda v: v.redriven >= 3000, timeout_s=30)
    cancelled = await queue.control_job(first.job_id, JobAction.CANCEL, actor="carol", reason="wrong batch")
    assert cancelled.code is Code.OK
    view = await _job(queue, first.job_id)
    assert view.state is JobState.CANCELLED and view.pending == 0 and view.refused == 0
    assert view.redriven >= halfway.redriven and view.redriven + view.not_redriven == 10_000 and view.not_redriven > 0
    redriven = await _items(queue, first.job_id, ItemResult.REDRIVEN)
    rest = await _items(queue, first.job_id, ItemResult.NOT_REDRIVEN)
    assert redriven == ids[: view.redriven] and rest == ids[view.redriven :]  # in id order, never both
    still_dead = (await queue.dead_letter_summary(DeadLetterFilter(kind="test"))).value
    assert still_dead.count == len(rest) and still_dead.oldest_id is not None
    sample = (await queue.get_many(rest[:: max(1, len(rest) // 50)], with_history=False)).value
    assert all(m.state is State.DEAD for m in sample)
    assert (await queue.control_job(first.job_id, JobAction.RESUME, actor="carol", reason="no")).code is Code.ILLEGAL_STATE

    began = time.monotonic()
    second = await queue.start_job(RedriveJob(actor="alice", reason="the rest", ids=tuple(ids), rate_per_s=10_000))
    assert second.job_id is not None and {i for i, _ in second.refused} == set(redriven)  # no longer dead
    done = await _until(queue, second.job_id, lambda v: v.state is JobState.DONE, timeout_s=60)
    elapsed = time.monotonic() - began
    assert (done.redriven, done.refused, done.not_redriven, done.pending) == (len(rest), len(redriven), 0, 0)
    assert (await queue.dead_letter_summary(DeadLetterFilter(kind="test"))).value.count == 0
    audit = (await queue.message_audit(rest[:500])).value
    assert [e.action for e in audit] == ["redriven"] * 500 and all(f'"job":{second.job_id}' in e.after for e in audit)
    await _converged(nodes, queue.raft)
    print(f"\n{len(rest)} items redriven by the driver in {elapsed:.1f} s; driver {started[0].stats}")


async def test_two_drivers_keep_the_rate_and_a_finished_job_leaves_the_set_quiet(
    drivers: tuple[ProcessCluster, QueueClient, list[MaintenanceDriver]],
) -> None:
    nodes, queue, started = drivers
    ids = await _dead_letters(queue, 150)
    job = await queue.start_job(RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=100))
    assert job.job_id is not None
    first, second = _driver(nodes, started), _driver(nodes, started)
    eager: list[int] = []

    async def step_without_looking() -> None:  # a third stepper that ignores the rate altogether
        assert job.job_id is not None
        while True:
            result = await queue.step_job(job.job_id, 1000)
            eager.append(len(result.redriven))
            if result.state is not JobState.RUNNING:
                return
            await asyncio.sleep(0.02)

    await step_without_looking()
    done = await _until(queue, job.job_id, lambda v: v.state is JobState.DONE, timeout_s=30)
    assert done.redriven == 150 and done.finished_ms is not None
    assert done.finished_ms - done.created_ms >= 1500  # 150 items at 100 a second, by the leader's time
    assert first.stats.job_items + second.stats.job_items + sum(eager) == 150  # each item once, whoever stepped it
    assert max(eager) <= 100  # the eager stepper never got past the burst
    # The rule itself, by the leader's time and whatever the machine's load: by any moment t, at most
    # rate x (t - created) items were redriven (the bucket starts empty), whoever stepped them.
    stamps = sorted(await _done_ms(queue, job.job_id))
    assert len(stamps) == 150
    over = [(n, at) for n, at in enumerate(stamps, 1) if n * 1000 > 100 * (at - done.created_ms)]
    assert over == [], f"items redriven ahead of the rate (count, leader ms): {over[:5]}"
    audit = (await queue.message_audit(ids)).value
    assert sorted(e.target for e in audit) == sorted(f"message:{i}" for i in ids)  # one redrive each
    settled = await _converged(nodes, queue.raft)
    await asyncio.sleep(0.5)  # both drivers keep reading: a finished job writes nothing more
    assert await _converged(nodes, queue.raft) == settled
