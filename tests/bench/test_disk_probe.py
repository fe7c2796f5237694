"""The disk probe beside `bench.queue lateness`: its figures, and that it leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.disk_probe import DiskProbe, summarize


def test_stalls_count_only_the_syncs_over_100_ms_and_add_up_their_excess() -> None:
    figures = summarize([1.0, 2.0, 100.0, 150.0, 430.5] + [1.5] * 95, seconds=5.0)
    assert figures["syncs"] == 100
    assert figures["stalls_over_100ms"] == 2  # 100.0 itself is not over
    assert figures["stalled_ms"] == 50.0 + 330.5
    assert figures["sync_max_ms"] == 430.5
    assert figures["sync_p50_ms"] == 1.5
    assert summarize([], seconds=0.0)["syncs"] == 0


def test_the_probe_syncs_on_the_given_disk_and_removes_its_file(tmp_path: Path) -> None:
    with DiskProbe(tmp_path, interval_s=0.01) as probe:
        deadline = time.monotonic() + 10
        while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p.name for p in tmp_path.iterdir()] == [f"disk-probe-{os.getpid()}"]
        while probe.summary()["syncs"] < 3 and time.monotonic() < deadline:  # a stalled disk is slow, not wrong
            time.sleep(0.01)
    figures = probe.summary()
    assert figures["syncs"] >= 3
    assert figures["sync_max_ms"] > 0
    assert "failure" not in figures
    assert probe.cpu_s > 0
    assert list(tmp_path.iterdir()) == []


def test_a_probe_that_cannot_write_says_why_instead_of_failing_its_benchmark(tmp_path: Path) -> None:
    with DiskProbe(tmp_path / "gone", interval_s=0.01) as probe:
        pass
    figures = probe.summary()
    assert figures["syncs"] == 0
    assert "No such file or directory" in figures["failure"]
