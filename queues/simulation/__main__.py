"""Replay or explore queue simulation seeds: `python -m queues.simulation --seed N [--nodes 5] [--bug X]`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from queues.simulation.runner import BUGS, run_seed
from queues.simulation.sets import SETS_BUGS, run_sets_seed, sentence
from queues.simulation.totals import Totals
from raft_store.simulation.runner import seed_parser, selected_seeds


def main(argv: list[str] | None = None) -> int:
    parser = seed_parser("python -m queues.simulation", [*BUGS, *SETS_BUGS])
    parser.add_argument("--sets", type=int, default=0, help="the multi-set mode: N sets (the last added mid-run) and a control set")
    args = parser.parse_args(argv)
    seeds = selected_seeds(args)
    if args.sets:
        return _sets(args, seeds)
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


def _sets(args: argparse.Namespace, seeds: list[int]) -> int:
    started = time.monotonic()
    outcomes = []
    for seed in seeds:
        outcome = run_sets_seed(seed, sets=args.sets, bug=args.bug)
        outcomes.append(outcome)
        if outcome.failure is not None:
            print(outcome.failure, file=sys.stderr)
        elif args.verbose:
            print(json.dumps({"seed": seed, **outcome.stats}))
    failures = sum(1 for o in outcomes if o.failure is not None)
    print(sentence(outcomes))
    print(json.dumps({"seeds": len(seeds), "failures": failures, "seconds": round(time.monotonic() - started, 1)}))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
