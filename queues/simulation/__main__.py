"""Replay or explore queue simulation seeds: `python -m queues.simulation --seed N [--nodes 5] [--bug X]`."""

from __future__ import annotations

import json
import sys
import time

from queues.simulation.runner import BUGS, run_seed
from queues.simulation.totals import Totals
from raft_store.simulation.runner import seed_parser, selected_seeds


def main(argv: list[str] | None = None) -> int:
    args = seed_parser("python -m queues.simulation", BUGS).parse_args(argv)
    seeds = selected_seeds(args)
    totals = Totals()
    started = time.monotonic()
    for seed in seeds:
        outcome = run_seed(seed, nodes=args.nodes, membership=args.membership, bug=args.bug)
        if outcome.failure is not None:
            totals.failures += 1
            print(outcome.failure, file=sys.stderr)
        else:
            totals.add(outcome.stats)
            if args.verbose:
                print(json.dumps({"seed": seed, **outcome.stats}))
    print(totals.sentence())
    print(json.dumps({"seeds": len(seeds), "failures": totals.failures, "seconds": round(time.monotonic() - started, 1)}))
    return 1 if totals.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
