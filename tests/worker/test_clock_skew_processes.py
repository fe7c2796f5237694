"""Skewed clocks around real workers (libfaketime), from outside: the issue's two checks.

1. A worker whose clock is 30 s slow retries no rate-limited request before its Retry-After: the
   delay travels as a duration and the store adds its own time (it used to send its own clock
   plus the delay, 30 s in the past, and all 32 requests came back after 0.33 s).
2. A store node 30 s slow that leads keeps payments flowing: every transfer is paid, none waits
   anywhere near the skew, and the time from the store's acknowledgement (the API's 201) to the
   payment call is reported (p50, p99), as a figure, not as a timed assertion.

Shares the stand-ins, workers and workload of test_worker_processes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from test_worker_processes import (  # type: ignore[import-not-found]
    MACHINE,
    ROOT,
    ProcessCluster,
    Standins,
    Workers,
    Workload,
    python_path,
    set_policies,
    standins,
    store_queue,
    until_terminal,
    views,
    worker_env,
)

from delay.policy import RetryPolicy
from queues import ClientError, QueueClient, State
from raft_store.testing.processes import skewed_clock_env

pytestmark = pytest.mark.slow
__all__ = ["standins"]  # the module's stand-ins fixture, shared with test_worker_processes

SKEWED: Final = 3
RETRY_AFTER_S: Final = 3
THROTTLED: Final = 32
TRANSFERS: Final = 60
FAST_TIER: Final = RetryPolicy(tiers_ms=(200,), tier_jitter_ratio=0.0, attempts_max=20, retry_after_max_ms=60_000)
"""Without the Retry-After a retry would come 200 ms later."""


def faketime(offset_s: int) -> dict[str, str]:
    """The environment of a process whose wall clock is `offset_s` off (its monotonic clock untouched)."""
    env = skewed_clock_env(offset_s)
    if env is None:  # a missing system package is a set-up error, not a skip
        pytest.fail("libfaketime is needed to skew a process's clock: apt-get install faketime"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    return env


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[[int], ProcessCluster]]:
    """Three store nodes, node 3's clock `skew_s` off. Ticks of 100 ms (elections after 1-2 s
    without a heartbeat), so that a stall of this shared machine does not move the lead away from
    the node the test forced to lead."""
    started: list[ProcessCluster] = []

    def start(skew_s: int) -> ProcessCluster:
        cluster = ProcessCluster(tmp_path / "store", machine=MACHINE, extra_args=["--volatile", "--tick-ms", "100"])
        (tmp_path / "store").mkdir(exist_ok=True)
        for node in cluster.ids:
            cluster.start(node, env=faketime(skew_s) if node == SKEWED and skew_s else None)
        started.append(cluster)
        return cluster

    with pytest.MonkeyPatch.context() as patch:  # the nodes run this checkout, as in test_worker_processes
        patch.setenv("PYTHONPATH", python_path())
        patch.chdir(ROOT)
        try:
            yield start
        finally:
            for cluster in started:
                cluster.stop_all()


@dataclass(slots=True)
class SkewedWorkers(Workers):
    """Workers whose ids start with "slow" run 30 s slow."""

    def extra_env(self, worker_id: str) -> dict[str, str]:
        return faketime(-30) if worker_id.startswith("slow") else {}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Workers]]:
    made: list[Workers] = []
    try:
        yield made
    finally:
        for group in made:
            group.stop_all()


async def keep_leading(cluster: ProcessCluster, queue: QueueClient, led: list[tuple[float, bool]]) -> None:
    """Force the skewed node to lead (a leader transfer whenever it does not), noting every 0.2 s
    (wall clock) whether it did: an election on this shared machine (a leader stalled past the
    election timeout under load) must not leave the measure to another node."""
    while True:
        statuses = await cluster.statuses(queue.raft)
        leading = statuses.get(SKEWED, {}).get("role") == "leader"
        led.append((time.time(), leading))
        if not leading:
            with contextlib.suppress(ClientError):
                await queue.raft.admin("transfer", SKEWED)
        await asyncio.sleep(0.2)


def quantiles(waits_s: list[float]) -> str:
    if not waits_s:
        return "none"
    p99 = waits_s[min(len(waits_s) - 1, round(0.99 * len(waits_s)))]
    return f"p50 {statistics.median(waits_s):.3f} s, p99 {p99:.3f} s, max {waits_s[-1]:.3f} s"


async def rate_limited(queue: QueueClient, workload: Workload) -> int:
    found = await views(queue, sorted(workload.ids.values()))
    return sum(1 for v in found if any(a.error_class == "rate_limited" for a in v.history))


async def test_a_worker_30_s_slow_retries_no_rate_limited_request_before_its_retry_after(
    standins: Standins, nodes: Callable[[int], ProcessCluster], workers: list[Workers], tmp_path: Path
) -> None:
    cluster = nodes(0)
    await standins.healthy()
    await standins.faults("payment", throttle_rate=1.0, retry_after_s=RETRY_AFTER_S)
    async with store_queue(cluster) as queue:
        await set_policies(queue, FAST_TIER)
        group = SkewedWorkers(tmp_path, worker_env(cluster, standins, read_timeout_s=2.0, attempt_timeout_s=3.0))
        workers.append(group)
        worker = group.start("slow")
        await group.wait_running(worker)
        before = (await standins.stats())["payment"]
        workload = Workload(f"ra{time.time_ns() % 10**9}")
        await workload.submit(queue, [workload.transfer(number) for number in range(THROTTLED)])
        deadline = time.monotonic() + 60
        while await rate_limited(queue, workload) < THROTTLED:
            if time.monotonic() > deadline:
                seen = [(v.state.value, [(a.outcome, a.error_class) for a in v.history])
                        for v in await views(queue, sorted(workload.ids.values()))]  # fmt: skip
                raise AssertionError(f"not every transfer met the 429 within 60 s: {seen[:5]}; {worker.tail()}")
            await asyncio.sleep(0.1)
        await standins.faults("payment")  # the payment system takes requests again
        await until_terminal(queue, workload, timeout_s=60)
        after = (await standins.stats())["payment"]
        found = await views(queue, sorted(workload.ids.values()))
    gaps_ms = []
    for view in found:
        assert view.state is State.DONE, view
        first, second = view.history[0], view.history[1]
        assert first.error_class == "rate_limited" and first.ended_ms is not None
        gaps_ms.append(second.leased_ms - first.ended_ms)
    throttled = after["by_outcome"].get("rate_limited", 0) - before["by_outcome"].get("rate_limited", 0)
    print(f"\n{THROTTLED} transfers rate-limited (Retry-After {RETRY_AFTER_S} s) by a worker 30 s slow: retried"
          f" {min(gaps_ms)}-{max(gaps_ms)} ms after the 429 (the store's clock); the payment system answered"
          f" {throttled} requests with 429")  # fmt: skip
    assert min(gaps_ms) >= RETRY_AFTER_S * 1000  # the store's own time plus the Retry-After, exactly
    assert throttled == THROTTLED  # none came back early to be told again


async def test_a_store_node_30_s_slow_that_leads_keeps_payments_flowing(
    standins: Standins, nodes: Callable[[int], ProcessCluster], workers: list[Workers], tmp_path: Path
) -> None:
    cluster = nodes(-30)
    await standins.healthy()
    async with store_queue(cluster) as queue:
        await set_policies(queue, FAST_TIER)
        led: list[tuple[float, bool]] = []
        keeper = asyncio.create_task(keep_leading(cluster, queue, led))
        while not led or not led[-1][1]:
            await asyncio.sleep(0.1)
        group = Workers(tmp_path, worker_env(cluster, standins, read_timeout_s=2.0, attempt_timeout_s=3.0))
        workers.append(group)
        started = [group.start(f"w{number}") for number in range(2)]
        await group.wait_running(*started)
        workload = Workload(f"sl{time.time_ns() % 10**9}")
        acknowledged: dict[str, float] = {}
        for number in range(TRANSFERS):  # one at a time, as producers call the API
            item = workload.transfer(number)
            await workload.submit(queue, [item])
            acknowledged[workload.transfers[item.idempotency_key].transfer_id] = time.time()
            await asyncio.sleep(0.05)
        await until_terminal(queue, workload, timeout_s=60)
        keeper.cancel()
    share = sum(leading for _, leading in led) / len(led)
    assert share >= 0.5, f"the slow node led {share:.0%} of the run: not what was measured"
    paid = await standins.rows("SELECT transfer_id, created_at FROM payment_transfers WHERE transfer_id = ANY($1)",
                               list(acknowledged))  # fmt: skip
    assert len(paid) == TRANSFERS
    spans = [(acknowledged[row["transfer_id"]], row["created_at"].timestamp()) for row in paid]
    waits_s = sorted(end - start for start, end in spans)
    # The waits during which the slow node led throughout (no election inside them on this machine).
    steady = sorted(end - start for start, end in spans
                    if all(leading for at, leading in led if start - 0.2 <= at <= end + 0.2))  # fmt: skip
    print(f"\nstore leader 30 s slow ({share:.0%} of the run): acknowledged -> payment call {quantiles(waits_s)}"
          f" over {TRANSFERS} transfers; {quantiles(steady)} over the {len(steady)} with no leader change")  # fmt: skip
    # While it led, no delivery waited for the skew (before this, none came while it led: p50 20 s).
    # A delivery across a leader change may wait for its lease to end (30 s), skew or not.
    assert len(steady) >= TRANSFERS // 3 and steady[-1] < 15, steady
