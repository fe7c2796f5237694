"""What the queue benchmarks read from a cluster beside their own clocks: the leader's log shape,
whether the followers have applied what it committed, and the percentile every queue figure uses
(one set's and several sets' alike, so they compare)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster


async def log_shape(cluster: ProcessCluster, raft: RaftClient) -> tuple[int, int]:
    """(applied index, applied commands) of the leader: their ratio over a run is commands per entry."""
    for status in (await cluster.statuses(raft)).values():
        if status.get("role") == "leader":
            metrics: dict[str, Any] = status["metrics"]  # type: ignore[assignment]
            return int(str(status["applied"])), int(metrics["applied_commands"])
    return 0, 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def caught_up(cluster: ProcessCluster, raft: RaftClient, timeout_s: float = 30.0) -> None:
    """Wait until every node has applied what the leader had committed when called. A follower
    applies in the background (docs/raft.md), a few dozen entries behind at full load: the nodes'
    CPU read at the end of a window must wait for the applies its commits left on the followers,
    or it would leave part of their work out. It then also holds the applies of the entries the
    followers had left at the window's start (at 256 in flight up to a few dozen entries, some per
    cent of the nodes' CPU in a 10 s window): the figure errs high, never low."""
    started = time.monotonic()
    target: int | None = None
    while True:
        statuses = await cluster.statuses(raft)
        if target is None:
            target = next((int(str(s["commit"])) for s in statuses.values() if s.get("role") == "leader"), None)
        applied = [int(str(s["applied"])) for s in statuses.values()]
        if target is not None and len(applied) == cluster.size and min(applied) >= target:
            return
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"the nodes did not apply the leader's commit {target} within {timeout_s:.0f} s: {applied}")
        await asyncio.sleep(0.01)
