"""Sets side by side, each run by the code of a checkout of its own, idle and then under the same
steady load: the node CPU of each in the same run.

    python -m bench.sets_ab --checkout main=/tmp/base --checkout branch=. --json

Why: on this shared 2-core machine runs made minutes apart differ by more than a change to the
nodes' standing cost (bench.e2e's rate swings 1.5x between runs). Sets of both versions running
at once under the same load see the same machine, so their ratio is the change's. Each set is
three `raft_store run` processes with the queue machine whose PYTHONPATH is its checkout (the
clients are this checkout's: the nodes' wire protocol must be the same); the load is single
enqueues at a fixed rate per set, as a set sees at bench.e2e's rates (~70 log entries a second).
CPU is the scheduler's run time of every node thread (/proc/PID/task/*/schedstat), as
bench.idle_sets reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.idle_sets import sched_seconds
from queues import QueueClient, RaftClient
from raft_store.testing.processes import ProcessCluster

MACHINE = "queues.replicated:machine_factory"


async def _load(queue: QueueClient, name: str, rate: float, until: float) -> int:
    """Single enqueues at `rate` a second (on a fixed schedule: a slow answer does not slow it)."""
    sent, start = 0, time.monotonic()
    pending: set[asyncio.Task[Any]] = set()
    while time.monotonic() < until:
        key = f"{name}-{sent}"
        task = asyncio.create_task(queue.enqueue("transfer", idempotency_key=key, ref_key=key, payload=b"x" * 200))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
        await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    if pending:
        await asyncio.gather(*pending)
    return sent


async def measure(checkouts: dict[str, Path], rate: float, seconds: float, idle_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sets-ab-") as tmp:
        clusters: dict[str, ProcessCluster] = {}
        for name, path in checkouts.items():
            folder = Path(tmp) / name
            folder.mkdir()
            cluster = clusters[name] = ProcessCluster(folder, machine=MACHINE)
            for node in cluster.ids:
                cluster.start(node, env={"PYTHONPATH": str(path)})
        queues: dict[str, QueueClient] = {}
        try:
            for name, cluster in clusters.items():
                raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=60.0)
                await cluster.wait_leader(raft, timeout_s=60)
                queues[name] = QueueClient(raft)
            await asyncio.sleep(2.0)  # past the elections' writes
            pids = {name: [p.pid for p in c.procs.values()] for name, c in clusters.items()}
            idle0, t0 = {n: sched_seconds(p) for n, p in pids.items()}, time.monotonic()
            await asyncio.sleep(idle_seconds)
            idle1, t1 = {n: sched_seconds(p) for n, p in pids.items()}, time.monotonic()
            until = time.monotonic() + seconds
            sent = await asyncio.gather(*(_load(q, n, rate, until) for n, q in queues.items()))
            load1, t2 = {n: sched_seconds(p) for n, p in pids.items()}, time.monotonic()
            alive = all(p.poll() is None for c in clusters.values() for p in c.procs.values())
        finally:
            for queue in queues.values():
                await queue.raft.close()
            for cluster in clusters.values():
                cluster.stop_all()
    names = list(checkouts)
    out: dict[str, Any] = {"rate_per_set": rate, "seconds": round(t2 - t1, 2), "idle_seconds": round(t1 - t0, 2)}
    for name, count in zip(names, sent, strict=True):
        out[name] = {
            "idle_cores": round((idle1[name] - idle0[name]) / (t1 - t0), 4),
            "load_cores": round((load1[name] - idle1[name]) / (t2 - t1), 4),
            "enqueues": count,
            "load_us_per_enqueue": round(1e6 * (load1[name] - idle1[name]) / count, 1),
        }
    if len(names) == 2:
        a, b = names
        out[f"{b}_over_{a}"] = {
            "idle": round(out[b]["idle_cores"] / out[a]["idle_cores"], 3),
            "load": round(out[b]["load_cores"] / out[a]["load_cores"], 3),
        }
    out["nodes_alive"] = alive
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sets_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH",
                        help="a set run by the code at PATH (repeat; default: this checkout alone)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=70.0, help="enqueues a second per set (default 70)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the load runs")
    parser.add_argument("--idle-seconds", type=float, default=8.0, help="how long idle is measured first")
    parser.add_argument("--json", action="store_true", help="print JSON (the default prints the same)")
    args = parser.parse_args(argv)
    checkouts: dict[str, Path] = {}
    for item in args.checkout or [f"this={Path.cwd()}"]:
        name, sep, path = item.partition("=")
        if not sep or not name or not (Path(path) / "raft_store").is_dir():
            parser.error(f"--checkout {item!r}: want NAME=PATH of a checkout (PATH/raft_store must exist)")
        checkouts[name] = Path(path).resolve()
    if args.rate <= 0 or args.seconds <= 0 or args.idle_seconds <= 0:
        parser.error("--rate, --seconds and --idle-seconds must be positive")
    print(json.dumps(asyncio.run(measure(checkouts, args.rate, args.seconds, args.idle_seconds)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
