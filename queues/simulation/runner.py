"""Run one seed of the queue simulation with a shape and a planted bug; used by tests and the CLI."""

from __future__ import annotations

from queues.simulation.cluster import ClockBugs, QueueCluster
from queues.simulation.downstream import AppBugs
from raft_store.simulation import runner as raft_runner
from raft_store.simulation.cluster import Bugs, SimulationFailure
from raft_store.simulation.runner import Outcome

__all__ = ["BUGS", "Outcome", "replay_command", "run_seed"]

BUGS: dict[str, tuple[Bugs, AppBugs, ClockBugs]] = {
    "ack_before_fsync": (Bugs(ack_before_fsync=True), AppBugs(), ClockBugs()),
    "lease_without_fencing": (Bugs(), AppBugs(no_fencing=True), ClockBugs()),
    "effect_without_dedup": (Bugs(), AppBugs(no_dedup=True), ClockBugs()),
    "stamp_wall_clock": (Bugs(), AppBugs(), ClockBugs(stamp_wall_clock=True)),
    "read_wall_clock": (Bugs(), AppBugs(), ClockBugs(read_wall_clock=True)),
}


def replay_command(seed: int, nodes: int, membership: bool, bug: str | None) -> str:
    return raft_runner.replay_command(seed, nodes, membership, bug, module="queues.simulation")


def run_seed(seed: int, *, nodes: int = 3, membership: bool = False, bug: str | None = None,
             chaos_ms: int = 8000) -> Outcome:
    bugs, app_bugs, clock_bugs = BUGS[bug] if bug else (Bugs(), AppBugs(), ClockBugs())
    cluster = QueueCluster(
        seed, nodes, bugs=bugs, app_bugs=app_bugs, clock_bugs=clock_bugs, membership=membership,
        replay=replay_command(seed, nodes, membership, bug),
    )
    try:
        stats = cluster.run(chaos_ms=chaos_ms)
    except SimulationFailure as failure:
        return Outcome(seed, cluster.summary(), failure)
    return Outcome(seed, stats)
