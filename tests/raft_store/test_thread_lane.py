"""The node's thread lane: jobs one at a time, in order, at the priority the node asks for.

A follower runs its applies at background priority (Linux's SCHED_IDLE) and a leader at normal
priority; a thread cannot raise its own priority back without privilege, so the lane keeps a
thread per priority and hands its queue from one to the other. These tests pin that a change of
priority keeps the lane's contract (order, one job at a time, every job run, shutdown ends every
thread), that changes start no threads beyond those two, and that a platform which refuses the
lower priority only costs a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import pytest

from raft_store import node_ports
from raft_store.node_ports import ThreadLane

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _policy() -> int:
    return os.sched_getscheduler(0)


def test_jobs_run_at_the_priority_asked_for_when_they_were_submitted() -> None:
    async def main() -> list[tuple[int, threading.Thread]]:
        lane = ThreadLane("test-lane")
        seen = [await lane.run(lambda: (_policy(), threading.current_thread()))]
        lane.set_background(True)
        seen.append(await lane.run(lambda: (_policy(), threading.current_thread())))
        seen.append(await lane.run(lambda: (_policy(), threading.current_thread())))
        lane.set_background(False)
        seen.append(await lane.run(lambda: (_policy(), threading.current_thread())))
        lane.shutdown()
        return seen

    seen = asyncio.run(main())
    assert [policy for policy, _ in seen] == [os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_IDLE, os.SCHED_OTHER]
    threads = [thread for _, thread in seen]
    assert threads[1] is threads[2], "no new thread without a change of priority"
    assert threads[0] is not threads[1], "a thread of each priority"
    assert threads[3] is threads[0], "kept: a change back takes up the thread of that priority again"


def test_switches_keep_the_order_and_one_job_at_a_time_and_shutdown_ends_every_thread() -> None:
    before = set(threading.enumerate())
    order: list[int] = []
    running = 0
    overlap = False
    lock = threading.Lock()

    def job(n: int) -> int:
        nonlocal running, overlap
        with lock:
            running += 1
            overlap = overlap or running > 1
        time.sleep(0.001)
        order.append(n)
        with lock:
            running -= 1
        return n

    threads: set[threading.Thread] = set()

    async def main() -> list[int]:
        lane = ThreadLane("test-lane")
        loop = asyncio.get_running_loop()
        futures = []
        for n in range(60):
            if n % 7 == 3:
                lane.set_background(n % 2 == 1)  # changes queued between jobs, some redundant
            future: asyncio.Future[int] = loop.create_future()
            lane.submit(lambda n=n: job(n), lambda result, f=future: f.set_result(result()))  # type: ignore[misc]
            futures.append(future)
            threads.update(t for t in threading.enumerate() if t.name.startswith("test-lane"))
        results = list(await asyncio.gather(*futures))
        lane.shutdown()
        return results

    assert asyncio.run(main()) == list(range(60))
    assert order == list(range(60)) and not overlap
    assert len(threads) == 2, "one thread per priority, whatever the number of changes"
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("test-lane")]


def test_a_platform_that_refuses_the_lower_priority_costs_a_warning_not_a_job(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(node_ports.os, "sched_setscheduler", refuse)
    monkeypatch.setattr(node_ports, "_WARNED", False)

    async def main() -> list[int]:
        lane = ThreadLane("test-lane")
        lane.set_background(True)
        results = [await lane.run(_policy)]
        lane.set_background(False)
        lane.set_background(True)
        results.append(await lane.run(_policy))
        lane.shutdown()
        return results

    with caplog.at_level(logging.WARNING, logger="raft_store.node"):
        assert asyncio.run(main()) == [os.SCHED_OTHER, os.SCHED_OTHER]
    warnings = [r for r in caplog.records if "background priority not available" in r.getMessage()]
    assert len(warnings) == 1, "warned once, not per thread"
