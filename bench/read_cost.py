"""What one client read costs a set's three nodes, by kind: a linearizable read (a ReadIndex round
with the followers), a stale read (the node that got it answers), and a long poll answered at an
apply. The clients' reads of every set are a standing cost of each set (docs/benchmarks.md, "the
control set's clock and the clients' reads of idle sets"); this says which reads are worth cutting.

    python -m bench.read_cost --json

One set of three `raft_store run` processes with the queue machine, idle, a few messages stored;
then, one mode after another, reads of `EventsAfter` (the projector's) at a fixed rate from one
client, and the nodes' CPU by the scheduler's run time of every thread (as bench.idle_sets), minus
the idle set's over the same time. `waiting`: long polls, each answered by an enqueue at the same
rate (its cost includes the enqueue's; `enqueue` alone is measured to subtract it).

Must never: leave a node running after it returned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.idle_sets import sched_seconds
from bench.sets_cluster import SetProcesses
from queues import LongPoll, QueueClient, RaftClient

MODES = ("idle", "linearizable", "stale", "enqueue", "waiting")


async def _paced(rate: float, seconds: float, call: Callable[[int], Awaitable[object]]) -> int:
    """`call(i)` at `rate` a second for `seconds`, one at a time (a late answer delays the next)."""
    start, count = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        await call(count)
        count += 1
        await asyncio.sleep(max(0.0, start + count / rate - time.monotonic()))
    return count


async def measure(rate: float, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="read-cost-") as tmp:
        processes = SetProcesses(Path(tmp), 1)
        processes.start_all()
        try:
            await processes.wait_leaders()
            cluster = processes.clusters[1]
            queue = QueueClient(RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=30.0))
            pids = [p.pid for p in cluster.procs.values()]
            applied = [0]

            async def enqueue(i: int) -> None:
                await queue.enqueue("transfer", idempotency_key=f"k{i}-{time.monotonic_ns()}", ref_key="r", payload=b"x" * 200)

            async def poll_and_enqueue(i: int) -> None:
                poll = asyncio.ensure_future(queue.events_after(0, limit=1, wait=LongPoll(applied[0], 5.0)))
                await asyncio.sleep(0.001)
                await enqueue(i)
                applied[0] = (await poll).applied_index

            calls: dict[str, Callable[[int], Awaitable[object]]] = {
                "linearizable": lambda _i: queue.events_after(0, limit=1),
                "stale": lambda _i: queue.events_after(0, limit=1, stale_ok=True),
                "enqueue": enqueue,
                "waiting": poll_and_enqueue,
            }
            for i in range(20):
                await enqueue(i)
            applied[0] = (await queue.events_after(0, limit=1)).applied_index
            await asyncio.sleep(2.0)
            found: dict[str, Any] = {}
            for mode in MODES:
                before, started = sched_seconds(pids), time.monotonic()
                if mode == "idle":
                    await asyncio.sleep(seconds)
                    count = 0
                else:
                    count = await _paced(rate, seconds, calls[mode])
                elapsed = time.monotonic() - started
                found[mode] = {"calls": count, "cores": (sched_seconds(pids) - before) / elapsed, "seconds": elapsed}
            await queue.raft.close()
        finally:
            processes.stop_all()
    idle = found["idle"]["cores"]
    for mode in MODES[1:]:
        entry = found[mode]
        entry["node_us_per_call"] = round((entry["cores"] - idle) * entry["seconds"] / max(1, entry["calls"]) * 1e6, 1)
    found["waiting"]["node_us_per_poll_without_enqueue"] = round(
        found["waiting"]["node_us_per_call"] - found["enqueue"]["node_us_per_call"], 1
    )
    for entry in found.values():
        entry["cores"] = round(entry["cores"], 4)
        entry["seconds"] = round(entry["seconds"], 2)
    return {"rate_per_s": rate, "modes": found, "load_average_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="calls a second in each mode")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each mode runs")
    parser.add_argument("--json", action="store_true", help="print JSON (the default prints the same)")
    args = parser.parse_args(argv)
    if not 0 < args.rate <= 2000 or args.seconds <= 0:
        print("bench.read_cost: --rate must be in (0, 2000], --seconds positive", file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(measure(args.rate, args.seconds))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
