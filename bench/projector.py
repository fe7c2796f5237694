"""How fast the ledger projector writes the compensation ledger, and how far behind it runs.

    python -m bench.projector [--requests 10000] [--rate 300] [--seconds 20] [--json]

Three store nodes as processes (real fsyncs), a throw-away embedded PostgreSQL with the ledger's
migrations, and the projector as `compensator project` builds it (compensator/wiring/projector.py), in
this process:

- catch-up: `--requests` requests each enqueued, leased and acked (three events each) before the
  projector starts; events per second until its cursor reaches the store's last event;
- under load: `--rate` requests per second go through the same life for `--seconds` while the
  projector follows; the per-event lag (its ledger commit minus its time in the store) comes from
  the projector's own histogram (`compensator_projector_event_lag_seconds`), p50 and p99
  interpolated within buckets as Prometheus does, and the events-behind gauge is sampled.

Everything shares two cores: read the figures as what this machine sustains, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.e2e_figures import histogram_quantile
from bench.harness import MACHINE, code_revision
from compensator import config as configuration
from compensator.wiring.projector import projector as build_projector
from ledger import migrate, pg
from queues import QueueClient, RaftClient
from queues.model import Enqueue
from raft_store.testing.processes import ProcessCluster
from services.projector.runner import Projector

BATCH = 500


async def lifecycle(queue: QueueClient, start: int, count: int) -> None:
    """`count` transfers, each enqueued, leased and acked: three events per request."""
    payload = b'{"amount_minor":100,"currency":"CNY","payee":"b","payer":"a","transfer_id":"t"}'
    items = [Enqueue(kind="transfer", idempotency_key=f"bench:{i}", ref_key=f"rp-{i}", payload=payload)
             for i in range(start, start + count)]  # fmt: skip
    await queue.enqueue_many(items)
    left = count
    while left > 0:
        grants = (await queue.lease("bench", count_max=min(left, 1000), lease_ms=60_000)).grants
        if not grants:
            await asyncio.sleep(0.01)
            continue
        await queue.ack_many([(g.message_id, g.token) for g in grants])
        left -= len(grants)


async def last_seq(queue: QueueClient) -> int:
    return (await queue.events_digest(0, 0)).value.last_seq


def lag_buckets(built: Projector) -> list[tuple[float, float]]:
    found = []
    for metric in built.metrics.registry.collect():
        if metric.name == "compensator_projector_event_lag_seconds":
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    found.append((float(sample.labels["le"]), sample.value))
    return sorted(found)


async def measure(cluster: ProcessCluster, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    config = configuration.load(None, {**cluster.service_settings(),
                                       "COMPENSATOR_STORE__DEADLINE_S": "30"})  # fmt: skip
    queue = QueueClient(RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=30))
    try:
        await cluster.wait_leader(queue.raft)
        for start in range(0, args.requests, BATCH):
            await lifecycle(queue, start, min(BATCH, args.requests - start))
        preloaded = await last_seq(queue)
        async with build_projector(config, dsn, name="bench") as built:
            stop = asyncio.Event()
            started = time.perf_counter()
            task = asyncio.create_task(built.run(stop))
            while (built.cursor or 0) < preloaded:
                await asyncio.sleep(0.01)
            catch_up_s = time.perf_counter() - started
            before = lag_buckets(built)
            behind: list[int] = []
            next_index, load_started = args.requests, time.perf_counter()
            per_tick = max(1, round(args.rate / 10))
            while time.perf_counter() - load_started < args.seconds:
                tick = time.perf_counter()
                await lifecycle(queue, next_index, per_tick)
                next_index += per_tick
                behind.append(await last_seq(queue) - (built.cursor or 0))
                await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - tick)))
            offered_s = time.perf_counter() - load_started
            final = await last_seq(queue)
            while (built.cursor or 0) < final:
                await asyncio.sleep(0.01)
            stop.set()
            await task
            after = lag_buckets(built)
    finally:
        await queue.raft.close()
    under_load = [(bound, count - dict(before).get(bound, 0.0)) for bound, count in after]
    return {
        "catch_up": {"events": preloaded, "seconds": round(catch_up_s, 2), "events_per_s": round(preloaded / catch_up_s)},
        "under_load": {
            "requests_per_s": round((next_index - args.requests) / offered_s),
            "events": final - preloaded,
            "lag_p50_s": histogram_quantile(under_load, 0.5),
            "lag_p99_s": histogram_quantile(under_load, 0.99),
            "behind_events_max": max(behind, default=0),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.projector", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests before the projector starts")
    parser.add_argument("--rate", type=int, default=300, help="requests per second while it follows")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-projector-"))
    cluster = ProcessCluster(root / "store", machine=MACHINE)
    try:
        with pg.temporary_server("bench-projector-pg-") as server:
            migrate.apply(server.dsn)
            cluster.start_all()
            figures = asyncio.run(measure(cluster, server.dsn, args))
    finally:
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    report = {"bench": "projector", "revision": code_revision(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "settings": vars(args), **figures}  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
