"""How often the disk itself stalls an fsync: the context a tail-latency figure needs.

    python -m bench.disk_probe --seconds 60 --json

A lease is a Raft command, so it is answered only once a majority of the nodes has fdatasynced
it; here the three nodes share one virtual disk, and when that disk stalls every writer waits at
once (measured 2026-11-27: the three nodes' WAL syncs stalled for the same 100-600 ms at the same
instant, and a probe with no node running stalled too). A lateness p99 taken in a minute with such
stalls measures the disk as much as the queue. So `bench.queue lateness` runs this probe beside its
measured window and prints what the disk did, and so does `bench.queue enqueue` for its p99; run
alone, it measures the idle disk.

The probe is light on purpose (one 512-byte write and fdatasync every `interval_s`, 20 a second by
default, against the hundreds a second of the nodes) so that it observes the stalls without
making them. A sync counts as stalled over `STALL_MS`; `stalled_ms` adds up each stalled sync's
time beyond that threshold, which is roughly how long grants due at that moment wait beyond it.

Must never: leave its file behind.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from bench.harness import code_revision
from bench.queue_figures import percentile

STALL_MS: Final = 100.0
RECORD: Final = b"p" * 512


def summarize(durations_ms: list[float], seconds: float) -> dict[str, Any]:
    """The probe's syncs, as the figures `bench.queue lateness` prints beside its own."""
    stalls = [d for d in durations_ms if d > STALL_MS]
    return {
        "syncs": len(durations_ms),
        "seconds": round(seconds, 1),
        "sync_p50_ms": round(percentile(durations_ms, 0.50), 1),
        "sync_p99_ms": round(percentile(durations_ms, 0.99), 1),
        "sync_max_ms": round(max(durations_ms, default=0.0), 1),
        "stalls_over_100ms": len(stalls),
        "stalled_ms": round(sum(d - STALL_MS for d in stalls), 1),
    }


class DiskProbe:
    """A thread that writes and fdatasyncs a small file in `directory` until stopped."""

    def __init__(self, directory: Path, interval_s: float = 0.05) -> None:
        self._path = directory / f"disk-probe-{os.getpid()}"
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._durations_ms: list[float] = []
        self._started = 0.0
        self._stopped = 0.0
        self.cpu_s = 0.0
        """The probe thread's own CPU (a benchmark that reports its process's CPU takes it out)."""
        self.failure: str | None = None
        """Why the probe stopped early (the disk full, the directory gone): printed with its figures."""
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Idempotent, and a no-op for a probe never started (a run that failed before its window)."""
        if self._started and not self._stopped:
            self._stop.set()
            self._thread.join()
            self._stopped = time.monotonic()

    def __enter__(self) -> DiskProbe:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        figures = summarize(self._durations_ms, (self._stopped or time.monotonic()) - self._started)
        return figures if self.failure is None else {**figures, "failure": self.failure}

    def _run(self) -> None:
        try:
            self._probe()
        except OSError as error:
            self.failure = f"{self._path}: {error.strerror or error}"
        finally:
            self.cpu_s = time.thread_time()

    def _probe(self) -> None:
        fd = os.open(self._path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            # Preallocated and synced first: each probe write then changes no metadata, like the
            # nodes' preallocated WAL segments, so a slow sync is the disk's and not the journal's.
            size = 1 << 20
            os.pwrite(fd, bytes(size), 0)
            os.fsync(fd)
            offset = 0
            while not self._stop.wait(self._interval_s):
                os.pwrite(fd, RECORD, offset)
                offset = (offset + len(RECORD)) % size
                began = time.perf_counter()
                os.fdatasync(fd)
                self._durations_ms.append((time.perf_counter() - began) * 1000)
        finally:
            os.close(fd)
            os.unlink(self._path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval-s", type=float, default=0.05)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="a directory on the disk the nodes use (default: the temp directory)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.seconds <= 0 or args.interval_s <= 0:
        parser.error("--seconds and --interval-s must be above 0")
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: not a directory")
    with DiskProbe(args.dir, args.interval_s) as probe:
        time.sleep(args.seconds)
    figures = {"mode": "disk_probe", **probe.summary(), "interval_s": args.interval_s, "revision": code_revision(),
               "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    print(json.dumps(figures) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
