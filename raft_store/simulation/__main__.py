"""Replay or explore simulation seeds: `python -m raft_store.simulation --seed N [--nodes 5] [--bug X]`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from raft_store.simulation.runner import BUGS, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raft_store.simulation")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --first")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--membership", action="store_true")
    parser.add_argument("--bug", choices=sorted(BUGS), default=None)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
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
