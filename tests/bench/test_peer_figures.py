"""bench.peer_procrastinate's pure parts: the peer's figures from its jobs and the ledgers, and the
side-by-side comparison with bench.e2e's."""

from __future__ import annotations

from typing import Any

from bench.e2e_figures import Ledgers
from bench.e2e_load import MIX_DEFAULT, submission
from bench.peer_procrastinate import Jobs, Settings, Window, checks, compare, summarize
from ledger.kinds import Kind

SETTINGS = Settings(requests=10, batch_size=10, in_flight=1, rate_per_s=0.0, error_rate=0.2, retry_ms=200,
                    attempts_max=20, workers=2, concurrency=4, stall_timeout_s=30.0, seed=1, standby=True)  # fmt: skip


def _run(*, failed: set[int], paid_twice: set[int]) -> tuple[dict[str, Any], Window]:
    planned = {job_id: submission(job_id - 1, nonce="n0", mix=MIX_DEFAULT, callback_target="m") for job_id in range(1, 11)}
    window = Window(acknowledged=planned, first_post_ms=1_000, settled=True, cpu_wall_s=2.0,
                    cpu_s={"intake": 0.01, "workers": 0.02, "queue_primary": 0.03, "queue_standby": 0.01,
                           "standins": 0.05, "machine_busy": 0.5})  # fmt: skip
    status = {job_id: "failed" if job_id in failed else "succeeded" for job_id in planned}
    jobs = Jobs(status=status, attempts={job_id: 1 if job_id % 2 else 3 for job_id in planned},
                deferred_ms={job_id: 1_000.0 + job_id for job_id in planned},
                succeeded_ms={job_id: 1_100.0 + 10 * job_id for job_id in planned if job_id not in failed})  # fmt: skip
    done = [p for job_id, p in planned.items() if job_id not in failed]
    ledgers = Ledgers(
        payment_transfers={p.effect: 2 if p.index + 1 in paid_twice else 1 for p in done if p.kind is Kind.TRANSFER},
        red_packet_versions={p.effect: 1 for p in done if p.kind is Kind.LIST_UPDATE},
        callback_deliveries={p.effect: 1 for p in done if p.kind is Kind.CALLBACK},
    )  # fmt: skip
    return summarize(window, jobs, ledgers, SETTINGS), window


def test_a_clean_run_counts_done_jobs_their_times_and_the_peers_own_cpu() -> None:
    result, window = _run(failed=set(), paid_twice=set())
    assert result["done"] == 10 and result["lost"] == 0 and result["double_paid"] == 0
    assert result["done_per_s"] == 50.0  # 10 done between the first POST (1,000 ms) and the last success (1,200 ms)
    assert result["time_to_done_first_try"]["count"] == 5 and result["time_to_done_retried"]["count"] == 5
    assert result["peer_total_cpu_us_per_request"] == 7000.0  # intake, workers and both servers: not the stand-ins
    assert checks(result, window) == []


def test_a_failed_job_is_lost_and_a_transfer_paid_twice_is_counted() -> None:
    result, window = _run(failed={4}, paid_twice={1})
    assert result["lost"] == 1 and result["not_done_by_status"] == {"failed": 1}
    assert result["double_paid"] == 1
    problems = checks(result, window)
    assert any("did not succeed" in p for p in problems) and any("paid twice" in p for p in problems)


def test_the_comparison_is_ours_over_the_peers_done_per_second_and_cpu() -> None:
    peer = {"done_per_s": 90.0, "peer_total_cpu_us_per_request": 7200.0, "double_paid": 0, "lost": 0}
    ours = {"done_per_s": 380.0, "cpu_us_per_request": {"api": 50.0, "nodes": 1100.0, "workers": 650.0, "standins": 900.0},
            "double_paid": 0, "lost": 0}  # fmt: skip
    found = compare(peer, ours)
    assert found["done_per_s"]["ratio"] == 4.22 and found["target_done_per_s_ratio_at_least_4"] is True
    assert found["cpu_us_per_done"] == {"ours": 1800.0, "peer": 7200.0, "ratio_peer_to_ours": 4.0}
