"""What the queue benchmarks read from a cluster beside their own clocks: the leader's log shape,
and the percentile every queue figure uses (one set's and several sets' alike, so they compare)."""

from __future__ import annotations

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
