"""What idle sets cost: N sets of three nodes (and the control set) with no client at all, their CPU
over a few seconds; the nodes hosted by three processes as `compensator run --sets N` runs them, or
one process each (`--process-per-replica`). The standing cost each set adds is this, whatever the load
(docs/benchmarks.md, "where an idle node's CPU goes"); bench.e2e's `nodes_idle` measures the same
with the service's workers and API polling on top.

    python -m bench.idle_sets --sets 3 --control --json
    python -m bench.idle_sets --sets 3 --control --process-per-replica --json
    python -m bench.idle_sets --sets 3 --control --control-tick-ms 30 --json   # the control set at the data sets' clock

`cores` is the nodes' utime + stime from /proc (what bench.e2e reads); `cores_sched` the
scheduler's exact run time of every thread (/proc/PID/task/*/schedstat), which tick-based
accounting can misattribute for processes that run for microseconds at a time.

Must never: leave a node running after it returned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.sets_cluster import CONTROL_TICK_MS, SetProcesses


def sched_seconds(pids: list[int]) -> float:
    """Run time of every thread of `pids` so far (threads that ended meanwhile are not counted)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


async def measure(
    sets: int, control: bool, seconds: float, settle_s: float, hosted: bool = True, control_tick_ms: int = CONTROL_TICK_MS
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="idle-sets-") as tmp:
        processes = SetProcesses(Path(tmp), sets, control=control, hosted=hosted, control_tick_ms=control_tick_ms)
        processes.start_all()
        try:
            await processes.wait_leaders()
            await asyncio.sleep(settle_s)  # past the elections' writes and the first snapshots
            pids = processes.pids()
            cpu0, sched0, started = processes.total_cpu_seconds(), sched_seconds(pids), time.monotonic()
            await asyncio.sleep(seconds)
            cpu1, sched1 = processes.total_cpu_seconds(), sched_seconds(pids)
            elapsed = time.monotonic() - started
        finally:
            processes.stop_all()
    groups = len(processes.clusters)
    cores = (cpu1 - cpu0) / elapsed
    return {
        "sets": sets,
        "control": control,
        "control_tick_ms": control_tick_ms if control else None,
        "nodes": processes.nodes,
        "processes": len(pids),
        "seconds": round(elapsed, 2),
        "cores": round(cores, 4),
        "cores_sched": round((sched1 - sched0) / elapsed, 4),
        "cores_per_group": round(cores / groups, 4),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_sets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=3, help="data sets of three nodes (1-5)")
    parser.add_argument("--control", action="store_true", help="also the control set (as the service runs)")
    parser.add_argument("--process-per-replica", action="store_true", help="a process per node, not three hosts")
    parser.add_argument("--control-tick-ms", type=int, default=CONTROL_TICK_MS,
                        help=f"the control set's tick (default {CONTROL_TICK_MS}, as run --sets starts it; the data sets': 30)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to measure")
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after the leaders are elected")
    parser.add_argument("--json", action="store_true", help="print JSON (the default prints the same)")
    args = parser.parse_args(argv)
    if not 1 <= args.sets <= 5 or args.seconds <= 0 or args.settle_s < 0 or not 1 <= args.control_tick_ms <= 10_000:
        print("bench.idle_sets: --sets must be 1-5, --seconds positive, --settle-s not negative,"
              " --control-tick-ms 1-10000", file=sys.stderr)  # fmt: skip
        return 2
    result = asyncio.run(measure(args.sets, args.control, args.seconds, args.settle_s, not args.process_per_replica,
                                 args.control_tick_ms))  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
