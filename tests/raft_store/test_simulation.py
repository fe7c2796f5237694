"""Deterministic simulation of the production Raft core under faults (testing.md, layer L1).

CI runs a time budget of seeds (SIM_BUDGET_S, default 150 s split over the shapes); `make soak`
runs many more. A failure prints the one command that replays its seed; add it to
sim_regressions.txt once fixed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from raft_store.simulation.runner import read_regressions, run_seed

REGRESSIONS = Path(__file__).with_name("sim_regressions.txt")
BUDGET_S = float(os.environ.get("SIM_BUDGET_S", "240"))
SEEDS_MAX = int(os.environ.get("SIM_SEEDS", "100000"))
FIRST_SEED = int(os.environ.get("SIM_FIRST_SEED", "1000"))


@pytest.mark.parametrize(("seed", "nodes", "membership"), read_regressions(REGRESSIONS))
def test_pinned_regression_seeds(seed: int, nodes: int, membership: bool) -> None:
    outcome = run_seed(seed, nodes=nodes, membership=membership)
    assert outcome.failure is None, str(outcome.failure)


@pytest.mark.parametrize(
    ("nodes", "membership", "share"),
    [(3, False, 0.45), (5, False, 0.2), (5, True, 0.35)],
    ids=["3-nodes", "5-nodes", "5-nodes-membership"],
)
def test_seeds_within_budget(nodes: int, membership: bool, share: float) -> None:
    deadline = time.monotonic() + BUDGET_S * share
    totals = {"seeds": 0, "faults": 0, "acked": 0, "sim_ms": 0}
    seed = FIRST_SEED + nodes * 1_000_000 + (500_000 if membership else 0)
    while time.monotonic() < deadline and totals["seeds"] < SEEDS_MAX:
        outcome = run_seed(seed, nodes=nodes, membership=membership)
        assert outcome.failure is None, str(outcome.failure)
        totals["seeds"] += 1
        for key in ("faults", "acked", "sim_ms"):
            totals[key] += outcome.stats[key]
        seed += 1
    print(f"\nsimulation {nodes} nodes membership={membership}: {totals}")
    assert totals["seeds"] > 0 and totals["acked"] > 0


@pytest.mark.parametrize("bug", ["ack_before_fsync", "vote_without_fsync", "truncate_on_corruption"])
def test_planted_bug_is_caught(bug: str) -> None:
    """A checker that never fails proves nothing: each planted bug must be caught."""
    for seed in range(200):
        outcome = run_seed(seed, bug=bug)
        if outcome.failure is not None:
            print(f"\n{bug} caught on seed {seed}: {outcome.failure.reason}")
            return
    pytest.fail(f"planted bug {bug} survived 200 seeds: the checker is blind to it")


def test_same_seed_replays_identically() -> None:
    first = run_seed(7, nodes=3)
    second = run_seed(7, nodes=3)
    assert first.stats == second.stats
