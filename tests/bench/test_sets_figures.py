"""The sets benchmarks' figures: bench.e2e's per set counts and its `--compare-sets` verdict, the
lost set's figures of bench.queue, and one short real run of `bench.queue enqueue --sets 2`
(6 node processes, about 6 s): routed by key over both sets, one set's fields plus `per_set`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import e2e_sets
from bench.e2e_load import MIX_DEFAULT, submission
from bench.queue_sets import Call, Calls, lose_figures
from ledger.request_ids import RequestId
from queues import State
from tests.bench.test_e2e_figures import _view

ROOT = Path(__file__).resolve().parents[2]
ONE_SET_FIELDS = {"mode", "enqueued_per_s", "p50_ms", "p99_ms", "acked", "concurrency", "seconds", "payload_bytes",
                  "node_cpu_us_per_enqueue", "commands_per_entry", "client_retries", "nodes", "fsync", "machine", "date"}  # fmt: skip


def test_per_set_counts_requests_and_done_by_the_set_their_id_names() -> None:
    planned = [submission(i, nonce="n", mix=MIX_DEFAULT, callback_target="m") for i in range(4)]
    ids = [RequestId(1, 1), RequestId(2, 1), RequestId(2, 2), RequestId(3, 1)]
    acknowledged = dict(zip(ids, planned, strict=True))
    views = {
        RequestId(1, 1): _view(1, state=State.DONE, created_ms=0, leased_ms=(1,), terminal_ms=2),
        RequestId(2, 1): _view(1, state=State.DONE, created_ms=0, leased_ms=(1,), terminal_ms=2),
        RequestId(2, 2): _view(2, state=State.READY, created_ms=0, leased_ms=(), terminal_ms=None),
    }
    assert e2e_sets.per_set(acknowledged, views) == {
        "1": {"requests": 1, "share": 0.25, "done": 1},
        "2": {"requests": 2, "share": 0.5, "done": 1},
        "3": {"requests": 1, "share": 0.25, "done": 0},
    }
    leaders = {1: {"entries": 3.0, "stale_reads": 1.0}, 2: {"entries": 1.0, "stale_reads": 4.0}, 3: {"entries": 2.0}}
    by_set = e2e_sets.per_set(acknowledged, views, leaders)
    assert by_set["1"]["store_per_done"] == {"leader_entries": 3.0, "leader_stale_reads": 1.0}
    assert by_set["2"]["store_per_done"] == {"leader_entries": 1.0, "leader_stale_reads": 4.0}
    assert "store_per_done" not in by_set["3"]  # nothing done there: no ratio


@pytest.mark.parametrize(("text", "parsed"), [("1,3", (1, 3)), ("3, 1", (3, 1)), ("1", None), ("1,9", None),
                                              ("0,3", None), ("a,b", None), ("1,2,3", None)])  # fmt: skip
def test_compare_sets_takes_two_set_counts(text: str, parsed: tuple[int, int] | None) -> None:
    assert e2e_sets.parse_compare(text) == parsed


def _compare(
    totals: dict[int, float], errors: dict[int, list[str]], capsys: pytest.CaptureFixture[str], order: str = "1,3",
    rounds: int = 1, drift: float = 0.0,
) -> tuple[int, Any, list[int]]:  # fmt: skip
    """`drift`: every run costs that much more per done than the one before (a machine slowing down)."""
    from bench.e2e import parse_settings

    settings, args = parse_settings(["--compare-sets", order, "--compare-rounds", str(rounds), "--json"])
    seen: list[int] = []

    def run_one(given: Any, _args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        total = totals[given.sets] * (1 + drift * len(seen))
        seen.append(given.sets)
        return ({"cpu_us_per_request": {"total": total, "nodes": total / 4}, "lost": 0, "double_paid": 0, "done_per_s": 400.0},
                errors.get(given.sets, []))  # fmt: skip

    code = e2e_sets.compare(settings, args, run_one)
    return code, json.loads(capsys.readouterr().out), seen


def test_compare_sets_runs_both_and_reads_the_ratio_of_cpu_per_done(capsys: pytest.CaptureFixture[str]) -> None:
    code, found, seen = _compare({1: 4000.0, 3: 4400.0}, {}, capsys)
    assert code == 0 and found["cpu_us_per_done_ratio"] == 1.1 and found["within_15_percent"] is True
    assert seen == [1, 3] and found["runs"]["3"]["cpu_us_per_request"]["total"] == 4400.0
    code, found, _ = _compare({1: 4000.0, 3: 4800.0}, {}, capsys)
    assert code == 0 and found["cpu_us_per_done_ratio"] == 1.2 and found["within_15_percent"] is False
    code, found, seen = _compare({1: 4000.0, 3: 4800.0}, {}, capsys, order="3,1")  # always more sets over fewer
    assert seen == [3, 1] and found["cpu_us_per_done_ratio"] == 1.2 and found["within_15_percent"] is False


def test_compare_rounds_alternate_the_order_so_a_drift_is_not_charged_to_one_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Both counts cost the same; the machine gets 10 % slower with every run.
    code, found, _ = _compare({1: 4000.0, 3: 4000.0}, {}, capsys, drift=0.10)
    assert code == 0 and found["cpu_us_per_done_ratio"] == 1.1  # one round: the drift reads as the sets' cost
    code, found, seen = _compare({1: 4000.0, 3: 4000.0}, {}, capsys, rounds=2, drift=0.10)
    assert seen == [1, 3, 3, 1] and code == 0
    assert [r["order"] for r in found["rounds"]] == [[1, 3], [3, 1]]
    assert [r["cpu_us_per_done_ratio"] for r in found["rounds"]] == [1.1, 0.923]
    assert found["cpu_us_per_done_ratio"] == 1.0 and found["within_15_percent"] is True  # ABBA cancels it
    assert found["cpu_us_per_done"] == {"1": 4600.0, "3": 4600.0} and len(found["runs"]["3"]) == 2
    assert found["cpu_us_per_done_by_process"]["1"]["nodes"] == 1150.0 and found["done_per_s"]["3"] == 400.0


def test_compare_rounds_give_no_ratio_when_any_run_failed(capsys: pytest.CaptureFixture[str]) -> None:
    code, found, _ = _compare({1: 4000.0, 3: 4000.0}, {3: ["1 lost"]}, capsys, rounds=2)
    assert code == 1 and found["cpu_us_per_done_ratio"] is None and found["within_15_percent"] is False
    assert found["errors"] == ["round 1, --sets 3: 1 lost", "round 2, --sets 3: 1 lost"]


@pytest.mark.parametrize("argv", [["--compare-rounds", "2"], ["--compare-sets", "1,3", "--compare-rounds", "0"],
                                  ["--compare-sets", "1,3", "--compare-rounds", "11"]])  # fmt: skip
def test_compare_rounds_refuses_what_it_cannot_do(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bench.e2e import parse_settings

    with pytest.raises(SystemExit) as exit_:
        parse_settings(argv)
    assert exit_.value.code == 2 and "--compare-rounds" in capsys.readouterr().err


def test_compare_sets_gives_no_ratio_when_a_run_failed(capsys: pytest.CaptureFixture[str]) -> None:
    code, found, _ = _compare({1: 4000.0, 3: 4000.0}, {3: ["1 acknowledged requests are not done"]}, capsys)
    assert code == 1 and found["cpu_us_per_done_ratio"] is None and found["within_15_percent"] is False
    assert found["errors"] == ["--sets 3: 1 acknowledged requests are not done"]


def test_the_lost_sets_figures_split_the_other_sets_rate_at_the_kill() -> None:
    calls = Calls()
    for second in range(10):  # sets 1 and 3: 10 a second before the kill at 5 s, 20 after; set 2 fails after
        for n in range(10 if second < 5 else 20):
            at = second + n / 20
            calls.records += [Call(1, at - 0.01, at, True), Call(3, at - 0.01, at, True)]
        if second < 5:
            calls.records.append(Call(2, second, second + 0.01, True))
    calls.records += [Call(2, 5.0, 10.2, False, "Unavailable"), Call(2, 5.1, 10.1, False, "OutcomeUnknown")]
    found = lose_figures(calls, [1, 2, 3], 2, [1, 2], t0=0.0, kill_at=5.0, end=10.0, deadline_s=5.0, attempt_s=1.0,
                         misrouted=0)  # fmt: skip
    assert found["others_enqueued_per_s_before"] == 20.0 and found["others_enqueued_per_s_after"] == 40.0
    assert found["others_after_over_before"] == 2.0
    assert found["enqueued_per_s_before"]["2"] == 1.0 and found["enqueued_per_s_after"]["2"] == 0.0
    assert found["lost_set_failed"] == 2 and found["lost_set_failed_by"] == {"Unavailable": 1, "OutcomeUnknown": 1}
    assert found["lost_set_failure_s_max"] == 5.2 and found["lost_set_ok_after_kill"] == 0


def test_queue_enqueue_over_two_sets_routes_by_key_and_reports_each_set() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "bench.queue", "enqueue", "--sets", "2", "--seconds", "1", "--concurrency", "16", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr[-2000:]
    found = json.loads(answer.stdout)
    assert found.keys() >= ONE_SET_FIELDS and found["sets"] == 2 and found["nodes"] == 6
    per_set = found["per_set"]
    assert set(per_set) == {"1", "2"} and sum(s["enqueued"] for s in per_set.values()) == found["acked"] > 0
    assert all(0.35 < s["share"] < 0.65 and s["node_cpu_us_per_enqueue"] > 0 for s in per_set.values()), per_set


def test_the_queue_benchmark_refuses_a_lost_set_it_does_not_start(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.queue import main

    for argv in (["enqueue", "--sets", "2", "--lose-set", "3"], ["enqueue", "--lose-set", "1"], ["drain", "--sets", "2"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "--" in capsys.readouterr().err
