"""Run one seed with a given shape and planted bug; used by tests, soak and the replay CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raft_store.simulation.cluster import Bugs, Cluster, SimulationFailure

BUGS = {
    "ack_before_fsync": Bugs(ack_before_fsync=True),
    "vote_without_fsync": Bugs(vote_without_fsync=True),
    "truncate_on_corruption": Bugs(truncate_on_corruption=True),
}


@dataclass(slots=True)
class Outcome:
    seed: int
    stats: dict[str, Any] = field(default_factory=dict)
    failure: SimulationFailure | None = None


def replay_command(seed: int, nodes: int, membership: bool, bug: str | None) -> str:
    parts = [f"python -m raft_store.simulation --seed {seed} --nodes {nodes}"]
    if membership:
        parts.append("--membership")
    if bug:
        parts.append(f"--bug {bug}")
    return " ".join(parts)


def run_seed(seed: int, *, nodes: int = 3, membership: bool = False, bug: str | None = None,
             chaos_ms: int = 8000, heal_ms: int = 6000) -> Outcome:
    cluster = Cluster(
        seed, nodes, bugs=BUGS[bug] if bug else None, membership=membership,
        replay=replay_command(seed, nodes, membership, bug),
    )
    try:
        stats = cluster.run(chaos_ms=chaos_ms, heal_ms=heal_ms)
    except SimulationFailure as failure:
        return Outcome(seed, dict(cluster.stats), failure)
    stats["sim_ms"] = chaos_ms + heal_ms
    stats["reads_checked"] = cluster.checker.reads_checked
    return Outcome(seed, stats)
