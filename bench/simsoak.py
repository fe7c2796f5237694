"""Simulation soak: the production Raft core under seeded faults for a fixed wall-clock time.

    python -m bench.simsoak --seconds 1500 --json

Cycles through the shapes (3 nodes, 5 nodes, 5 nodes with membership churn) from seed
`--first`, and prints the totals: seeds, simulated time, injected faults, acknowledged proposals,
snapshots, membership changes, reads checked, and every failing seed with its replay command.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from raft_store.simulation.runner import replay_command, run_seed

SHAPES = ((3, False), (5, False), (5, True))
COUNTED = ("faults", "crashes", "partitions", "drops", "acked", "sim_ms", "snapshots", "conf_changes", "reads_checked")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simsoak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--first", type=int, default=20_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    totals: dict[str, Any] = {key: 0 for key in COUNTED}
    totals["seeds"] = 0
    failures: list[str] = []
    deadline = time.monotonic() + args.seconds
    seed = args.first
    while time.monotonic() < deadline:
        for nodes, membership in SHAPES:
            outcome = run_seed(seed, nodes=nodes, membership=membership)
            totals["seeds"] += 1
            if outcome.failure is not None:
                failures.append(f"{outcome.failure.reason} | {replay_command(seed, nodes, membership, None)}")
                continue
            for key in COUNTED:
                totals[key] += outcome.stats.get(key, 0)
        seed += 1
    totals["simulated_hours"] = round(totals["sim_ms"] / 3_600_000, 2)
    totals["failures"] = failures
    print(json.dumps(totals) if args.json else json.dumps(totals, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
