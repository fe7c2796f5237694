"""Replay or explore simulation seeds: `python -m raft_store.simulation --seed N [--nodes 5] [--bug X]`."""

from __future__ import annotations

import json
import sys
import time

from raft_store.simulation.runner import BUGS, run_seed, seed_parser, selected_seeds


def main(argv: list[str] | None = None) -> int:
    args = seed_parser("python -m raft_store.simulation", BUGS).parse_args(argv)
    seeds = selected_seeds(args)
    failures = 0
    started = time.monotonic()
    for seed in seeds:
        outcome = run_seed(seed, nodes=args.nodes, membership=args.membership, bug=args.bug)
        if outcome.failure is not None:
            failures += 1
            print(outcome.failure, file=sys.stderr)
        elif args.verbose:
            print(json.dumps({"seed": seed, **outcome.stats}))
    print(json.dumps({"seeds": len(seeds), "failures": failures, "seconds": round(time.monotonic() - started, 1)}))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
