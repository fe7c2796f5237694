"""Real node processes: followers apply at background priority, the leader at normal priority.

A follower's apply is off the commit path (it acknowledges an entry once it is durable), so the
node runs it (all but the smallest) on a thread at SCHED_IDLE, which takes a core only when
nothing else wants one; a
node that becomes leader answers its clients from its applies and runs them at normal priority
again. Checked from outside, by the scheduling policy of each process's threads and the node's
status (the apply thread also runs the machine's group commits, so on a follower it exists
whatever the sizes; which applies go to it is test_ready_runner.py's to check, and which thread
runs a job at which priority test_thread_lane.py's).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from raft_store.client import RaftClient
from raft_store.node import APPLY_BEHIND_BYTES_MAX, APPLY_BEHIND_MAX, applies_in_background
from raft_store.ready_runner import FOLLOWER_INLINE_APPLY_BYTES_MAX
from raft_store.testing.processes import ProcessCluster

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")]


def _idle_threads(pid: int) -> int:
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            count += os.sched_getscheduler(int(tid)) == os.SCHED_IDLE
        except OSError:  # the thread ended meanwhile
            continue
    return count


async def _until(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


PADDING = "x" * (FOLLOWER_INLINE_APPLY_BYTES_MAX + 1)
"""Each entry above a follower's inline limit: applies that go to the apply thread."""


async def _append(client: RaftClient, count: int, start: int = 0) -> None:
    for value in range(start, start + count):
        await client.propose(json.dumps({"op": "append", "key": "k", "value": f"{value}{PADDING}"}).encode())


async def test_followers_apply_in_the_background_and_a_new_leader_in_the_foreground(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, machine="kv", extra_args=["--volatile"])
    cluster.start_all()
    client = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20)
    try:
        leader = await cluster.wait_leader(client)
        await _append(client, 20)
        followers = [node for node in cluster.ids if node != leader]
        pids = {node: cluster.procs[node].pid for node in cluster.ids}
        await _until(lambda: all(_idle_threads(pids[node]) == 1 for node in followers),
                     f"each follower applies on one background thread: {[_idle_threads(pids[n]) for n in followers]}")
        assert _idle_threads(pids[leader]) == 0, "the leader applies at normal priority"
        statuses = {node: await client.status(cluster.address(node)) for node in cluster.ids}
        assert {node: s["apply"]["background"] for node, s in statuses.items()} == {n: n != leader for n in cluster.ids}

        async def all_applied() -> bool:
            statuses.update({node: await client.status(cluster.address(node)) for node in cluster.ids})
            return all(s["applied"] == s["commit"] for s in statuses.values())

        deadline = time.monotonic() + 10
        while not await all_applied():
            assert time.monotonic() < deadline, "the followers caught up"
            await asyncio.sleep(0.05)
        assert all(s["apply"]["unapplied_bytes"] == 0 for s in statuses.values()), "nothing left to apply"

        cluster.kill(leader, signal.SIGKILL)
        successor = await cluster.wait_leader(client, exclude=leader)
        await _append(client, 20, start=20)
        # The successor keeps its background thread, idle (a thread per priority, node_ports.py); its
        # applies now go to a thread of normal priority.
        status = await client.status(cluster.address(successor))
        assert status["role"] == "leader" and status["apply"]["background"] is False
        assert _idle_threads(pids[successor]) == 1, "no thread started per change of priority"
        (other,) = [node for node in followers if node != successor]
        assert _idle_threads(pids[other]) == 1
        assert (await client.status(cluster.address(other)))["apply"]["background"] is True

        answer, _ = await client.read(json.dumps({"key": "k"}).encode())
        assert json.loads(answer)["value"].split(",") == [f"{v}{PADDING}" for v in range(40)]
    finally:
        await client.close()
        cluster.stop_all()


B = APPLY_BEHIND_BYTES_MAX


@pytest.mark.parametrize(
    ("is_leader", "behind", "behind_bytes", "now", "expected"),
    [
        (True, 0, 0, True, False),  # a leader's applies are on the commit path
        (True, 0, 0, False, False),
        (False, 0, 0, False, True),  # a follower's go to the background
        (False, APPLY_BEHIND_MAX // 4, B // 4, False, True),
        (False, APPLY_BEHIND_MAX // 4 + 1, 0, False, False),  # between the bounds: as they are
        (False, 0, B // 4 + 1, False, False),
        (False, APPLY_BEHIND_MAX // 4 + 1, 0, True, True),
        (False, APPLY_BEHIND_MAX, B, True, True),
        (False, APPLY_BEHIND_MAX + 1, 0, True, False),  # too far behind: normal priority
        (False, 1, B + 1, True, False),  # a few entries of large commands: too far as well
    ],
)
def test_a_follower_too_far_behind_applies_at_normal_priority_until_nearly_caught_up(
    is_leader: bool, behind: int, behind_bytes: int, now: bool, expected: bool
) -> None:
    assert applies_in_background(is_leader, behind, behind_bytes, now=now) is expected
