"""bench.peers_queue's pure parts: the closed loop every system is driven by (bench.queue's), the
comparison with the best peer, and the command line. The peers themselves are started only by the
benchmark (their servers are Debian packages CI does not install)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.peers_queue import Settings, compare, ours_arguments, ours_level, parse, summarize
from bench.queue import closed_loop


def test_the_closed_loop_sends_new_keys_and_counts_only_the_window() -> None:
    sent: list[str] = []
    started: list[float] = []

    async def send(key: str) -> None:
        sent.append(key)
        await asyncio.sleep(0.002)

    async def at_start() -> None:
        started.append(time.perf_counter())

    async def run() -> tuple[list[float], float]:
        return await closed_loop(send, concurrency=4, seconds=0.2, warmup_s=0.1, key_prefix="x", at_start=at_start)

    latencies, elapsed = asyncio.run(run())
    assert len(sent) == len(set(sent)) and all(key.startswith("x") for key in sent)
    assert len(started) == 1
    assert 0.15 < elapsed < 5.0  # from the warm-up's end (it may overrun) until the last caller stopped
    # The warm-up's acknowledgements and the ones after the window are sent but not counted.
    assert 0 < len(latencies) < len(sent) - 4
    assert min(latencies) >= 0.002


def test_ours_is_compared_with_the_best_peer_at_each_concurrency() -> None:
    def level(rate: float) -> dict[str, float]:
        return {"acked_per_s": rate}

    systems = {
        "ours": {"levels": {"16": level(6000.0), "256": level(12000.0)}},
        "nats": {"levels": {"16": level(4000.0), "256": level(10000.0)}},
        "postgres": {"levels": {"16": level(5000.0), "256": level(4000.0)}},
        "rabbitmq": {"error": "RabbitMQ not found"},
    }
    found = compare(systems, (16, 256))
    assert found["16"]["best_peer"] == "postgres" and found["16"]["ratio_to_best"] == 1.2
    assert found["16"]["at_least_1.5"] is False
    assert found["256"]["best_peer"] == "nats" and found["256"]["ratio_to_best"] == 1.2
    assert compare({"nats": systems["nats"]}, (16,))["16"]["ratio_to_best"] is None


def test_the_command_line_refuses_unknown_systems_and_another_warm_up_for_ours(capsys: pytest.CaptureFixture[str]) -> None:
    settings, systems, _ = parse(["--concurrency", "16,256", "--systems", "ours,etcd"])
    assert settings.concurrency == (16, 256) and systems == ("ours", "etcd")
    for argv in (["--systems", "ours,kafka"], ["--warmup", "3"], ["--concurrency", "16,x"], ["--concurrency", "0"]):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2
    assert "unknown systems ['kafka']" in capsys.readouterr().err
    settings, systems, _ = parse(["--systems", "nats", "--warmup", "3"])
    assert settings.warmup_s == 3.0 and systems == ("nats",)


def test_rounds_are_summarized_by_their_medians_and_a_failure_in_any_round_is_the_systems_error() -> None:
    def run(rate: float, p99: float) -> dict[str, object]:
        figures = {"acked_per_s": rate, "p50_ms": 1.0, "p99_ms": p99, "server_cpu_us_per_msg": 100.0,
                   "client_cpu_us_per_msg": 10.0, "client": "c"}  # fmt: skip
        return {"about": {"nodes": 3}, "load_average_at_start": 2.0, "levels": {"16": figures}}

    rounds = [
        {"ours": run(5000.0, 10.0), "nats": run(4000.0, 8.0), "etcd": run(2000.0, 20.0)},
        {"etcd": {"error": "etcd not found"}, "nats": run(6000.0, 12.0), "ours": run(5400.0, 11.0)},
        {"ours": run(5200.0, 30.0), "nats": run(4500.0, 9.0), "etcd": run(2100.0, 21.0)},
    ]
    summary = summarize(rounds, (16,))
    assert summary["ours"]["levels"]["16"]["acked_per_s"] == 5200.0 and summary["ours"]["levels"]["16"]["p99_ms"] == 11.0
    assert summary["nats"]["levels"]["16"]["acked_per_s"] == 4500.0
    assert summary["etcd"] == {"error": "etcd not found"}
    assert summary["ours"]["load_average_at_start"] == [2.0, 2.0, 2.0]


@pytest.mark.slow
def test_ours_runs_bench_queue_enqueue_with_every_option_it_reads(tmp_path: Path) -> None:
    """Ours is `bench.queue`'s enqueue mode on a real cluster; its arguments come from bench.queue's
    own parser, so an option bench.queue adds cannot leave ours without it (it once did: `--preload`
    made every run of ours fail with an AttributeError)."""
    settings = Settings(concurrency=(4,), seconds=1.0, warmup_s=0.2, nats_server="", pg_pool_max=1)
    assert vars(ours_arguments(4, 1.0)).keys() >= {"concurrency", "seconds", "payload_bytes", "preload", "sets"}
    found = ours_level(tmp_path, 4, settings)
    assert found["acked"] > 0 and found["acked_per_s"] > 0 and found["server_cpu_us_per_msg"] > 0
