"""Raft benchmark: a 3-node cluster of processes on loopback, fsync on, 1 KiB entries.

    python -m bench.raft --concurrency 256 --seconds 10 --json
    python -m bench.raft --failover --json

Throughput mode: `concurrency` proposers in one client process, each waiting for its command to
be committed (a quorum fsynced it) and applied on the leader before sending the next; prints
acknowledged commands per second and the p50/p99 latency of each acknowledgement.

Failover mode: 16 proposers append unique values under load, the leader is killed with SIGKILL,
and the time from the kill to the first command committed by the new leader is reported. At the
end every acknowledged value is read back (linearizably) and `lost` counts acknowledged values
that are missing; `duplicated` counts values applied twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.queue_figures import caught_up
from raft_store.client import RaftClient
from raft_store.testing.credentials import certificates
from raft_store.testing.processes import ProcessCluster


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def throughput(cluster: ProcessCluster, concurrency: int, seconds: float, payload_bytes: int) -> dict[str, Any]:
    client = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=30)
    leader = await cluster.wait_leader(client)
    payload = os.urandom(payload_bytes)
    latencies: list[float] = []
    stop_at = 0.0
    measuring = False

    async def proposer() -> None:
        while True:
            started = time.perf_counter()
            await client.propose(payload)
            done = time.perf_counter()
            if done >= stop_at:
                return
            if measuring:
                latencies.append(done - started)

    loop = asyncio.get_running_loop()
    stop_at = time.perf_counter() + 1.0 + seconds
    tasks = [loop.create_task(proposer()) for _ in range(concurrency)]
    await asyncio.sleep(1.0)  # warm-up: connections, leader discovery, JIT-free steady state
    measuring = True
    t0 = time.perf_counter()
    cpu0 = cluster.cpu_seconds()
    self_cpu0 = time.process_time()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    await caught_up(cluster, client)  # the followers' applies the window's commits left: theirs too
    node_cpu = cluster.cpu_seconds() - cpu0
    client_cpu = time.process_time() - self_cpu0
    status = await client.status(cluster.address(leader))
    await client.close()
    metrics = status["metrics"]
    return {
        "entries_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 3),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 3),
        "mean_ms": round(1000 * statistics.fmean(latencies), 3) if latencies else 0.0,
        "acked": len(latencies),
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "payload_bytes": payload_bytes,
        "fsync": True,
        "nodes": cluster.size,
        "leader_fsyncs": metrics["fsyncs"],
        "leader_fsync_ms_avg": metrics["fsync_ms_avg"],
        "leader_commands_per_fsync": round(metrics["proposed_commands"] / max(1, metrics["fsyncs"]), 1),
        "client_retries": client.retries,
        # CPU per acknowledged command, all three nodes and the client: robust to a noisy machine.
        "node_cpu_us_per_entry": round(1e6 * node_cpu / max(1, len(latencies)), 1),
        "client_cpu_us_per_entry": round(1e6 * client_cpu / max(1, len(latencies)), 1),
    }


async def failover(cluster: ProcessCluster, workers: int = 16) -> dict[str, Any]:
    client = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=30, attempt_timeout_s=1.0)
    leader = await cluster.wait_leader(client)
    acked: dict[int, list[int]] = {w: [] for w in range(workers)}
    first_new_commit: list[float] = []
    killed_at = 0.0
    stop = False

    async def worker(w: int) -> None:
        value = 0
        while not stop:
            value += 1
            sent = time.perf_counter()
            await client.propose(json.dumps({"op": "append", "key": f"w{w}", "value": str(value)}).encode())
            now = time.perf_counter()
            acked[w].append(value)
            if killed_at and sent >= killed_at and client._leader != cluster.address(leader):
                first_new_commit.append(now)

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(worker(w)) for w in range(workers)]
    await asyncio.sleep(3.0)
    killed_at = time.perf_counter()
    cluster.kill(leader, signal.SIGKILL)
    deadline = time.perf_counter() + 15
    while not first_new_commit and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(2.0)
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    new_leader = await cluster.wait_leader(client, exclude=leader)
    cluster.start(leader)  # the old leader comes back and must catch up
    lost = duplicated = 0
    for w, values in acked.items():
        answer, _ = await client.read(json.dumps({"key": f"w{w}"}).encode())
        stored = json.loads(answer)["value"] or ""
        applied = [int(v) for v in stored.split(",") if v]
        lost += len(set(values) - set(applied))
        duplicated += len(applied) - len(set(applied))
    await asyncio.sleep(2.0)
    statuses = await cluster.statuses(client)
    await client.close()
    applied_indexes = {node: s["applied"] for node, s in statuses.items()}
    return {
        "failover_ms": round(1000 * (min(first_new_commit) - killed_at), 1) if first_new_commit else None,
        "lost": lost,
        "duplicated": duplicated,
        "acked": sum(len(v) for v in acked.values()),
        "old_leader": leader,
        "new_leader": new_leader,
        "applied_after_restart": applied_indexes,
        "fsync": True,
        "nodes": cluster.size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--failover", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--tls", action="store_true", help="client and peer traffic over mutual TLS (openssl makes the certificates)")
    args = parser.parse_args(argv)
    if args.concurrency <= 0 or args.seconds <= 0:
        parser.error("--concurrency and --seconds must be positive")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="bench-raft-") as tmp:
        tls = certificates(Path(tmp) / "tls") if args.tls else None
        cluster = ProcessCluster(Path(tmp), machine="kv" if args.failover else "counter", tls=tls)
        cluster.start_all()
        try:
            if args.failover:
                result = asyncio.run(failover(cluster))
            else:
                result = asyncio.run(throughput(cluster, args.concurrency, args.seconds, args.payload_bytes))
        finally:
            cluster.stop_all()
    result["tls"] = args.tls
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    result["date"] = time.strftime("%Y-%m-%d")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result.get("lost", 0) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
