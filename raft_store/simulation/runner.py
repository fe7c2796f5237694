"""Run one seed with a given shape and planted bug; used by tests, soak and the replay CLI."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
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


def replay_command(
    seed: int, nodes: int, membership: bool, bug: str | None, module: str = "raft_store.simulation"
) -> str:
    parts = [f"python -m {module} --seed {seed} --nodes {nodes}"]
    if membership:
        parts.append("--membership")
    if bug:
        parts.append(f"--bug {bug}")
    return " ".join(parts)


def run_seed(
    seed: int,
    *,
    nodes: int = 3,
    membership: bool = False,
    bug: str | None = None,
    chaos_ms: int = 8000,
    heal_ms: int = 6000,
) -> Outcome:
    cluster = Cluster(
        seed,
        nodes,
        bugs=BUGS[bug] if bug else None,
        membership=membership,
        replay=replay_command(seed, nodes, membership, bug),
    )
    try:
        stats = cluster.run(chaos_ms=chaos_ms, heal_ms=heal_ms)
    except SimulationFailure as failure:
        return Outcome(seed, dict(cluster.stats), failure)
    stats["sim_ms"] = chaos_ms + heal_ms
    stats["reads_checked"] = cluster.checker.reads_checked
    return Outcome(seed, stats)


def seed_parser(prog: str, bugs: Iterable[str]) -> argparse.ArgumentParser:
    """The replay/explore command line shared by every simulation built on this cluster."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--seed", type=int, default=None, help="replay one seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --first")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--membership", action="store_true")
    parser.add_argument("--bug", choices=sorted(bugs), default=None)
    parser.add_argument("--verbose", action="store_true")
    return parser


def selected_seeds(args: argparse.Namespace) -> list[int]:
    return [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))


def read_regressions(path: Path) -> list[tuple[int, int, bool]]:
    """Pinned seeds, one per line: `seed nodes membership(yes/no) why it failed once`."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seed, nodes, membership = line.split()[:3]
            rows.append((int(seed), int(nodes), membership == "yes"))
    return rows
