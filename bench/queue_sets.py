"""`python -m bench.queue enqueue --sets N [--lose-set K]`: the enqueue load over N sets of three
node processes, routed by key through the store's facade (`SetsClient`, the API's own routing).

The same load as one set's enqueue mode (`concurrency` callers, each a unique 1 KiB message and
the wait for its commit before the next; concurrent calls coalesced per set), and the same
fields, summed over the sets, plus `per_set`: each set's acknowledged enqueues, its share, its
rate, latency, log shape and its nodes' CPU per enqueue. On a 2-core machine more sets cannot add
cores: the figure to compare with one set is the node CPU per enqueue (in the same run).

`--lose-set K`: callers are bound to sets (concurrency / N each; a caller draws keys from the
shared sequence and keeps those the table routes to its set, then posts them through the facade,
which must place them there), because a closed-loop caller waiting out a dead set's deadline would
otherwise stop posting other sets' keys, which says nothing about the store. After `seconds`
measured, the leader of set K and one more of its nodes are killed (SIGKILL): the other sets'
rate over the next `seconds` beside the one before, and how fast K's keys failed (the store's
deadline, `store.deadline_s`, bounds each; the service's settings are used for that run).

No control set: the facade is given the table `compensator run --sets N` writes (epoch 1 = every
set), so the control set's three processes do not take CPU from the sets measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.queue_figures import caught_up, log_shape, percentile
from bench.sets_cluster import SetProcesses
from compensator.config import StoreConfig
from queues import RaftClient
from queues.model import Code, Enqueue, EnqueueResult
from queues.sets import routing

BENCH_ATTEMPT_TIMEOUT_S = 10.0
BENCH_DEADLINE_S = 120.0
"""One set's enqueue mode's client settings (bench/queue.py connect), kept for the comparison."""


@dataclass
class Call:
    set_id: int
    started: float
    done: float
    ok: bool
    error: str = ""


@dataclass
class Calls:
    records: list[Call] = field(default_factory=list)

    def window(self, lo: float, hi: float, *, ok: bool = True) -> list[Call]:
        return [c for c in self.records if lo <= c.done < hi and c.ok is ok]


async def enqueue_sets(processes: SetProcesses, args: argparse.Namespace) -> dict[str, Any]:
    lose: int | None = args.lose_set
    store = StoreConfig()
    attempt_s, deadline_s = (store.attempt_timeout_s, store.deadline_s) if lose else (BENCH_ATTEMPT_TIMEOUT_S, BENCH_DEADLINE_S)
    await processes.wait_leaders()
    sets = processes.facade(attempt_timeout_s=attempt_s, deadline_s=deadline_s)
    ids = sorted(processes.sets)
    epoch = sets.table.newest_active()
    probes = {k: RaftClient(c.addresses(), auth=c.auth, attempt_timeout_s=10.0, deadline_s=60.0)
              for k, c in processes.sets.items()}  # fmt: skip
    payload = os.urandom(args.payload_bytes)
    calls = Calls()
    warm_up_s = 1.0
    t_start = time.perf_counter()
    t0 = t_start + warm_up_s
    kill_at = t0 + args.seconds
    stop_at = kill_at + (args.seconds if lose else 0.0)
    counter = 0
    misrouted: Counter[int] = Counter()

    async def caller(worker: int) -> None:
        nonlocal counter
        own = ids[worker % len(ids)] if lose else None
        while True:
            counter += 1
            key = f"c{worker}-{counter}"
            if own is not None and routing.candidate(key, epoch) != own:
                continue
            started = time.perf_counter()
            [(set_id, result)] = await sets.enqueue_many(
                [Enqueue(kind="transfer", idempotency_key=key, ref_key=key, payload=payload)])  # fmt: skip
            done = time.perf_counter()
            if own is not None and set_id != own:
                misrouted[own] += 1
            ok = isinstance(result, EnqueueResult) and result.code is Code.OK
            if not ok and set_id != lose:
                raise RuntimeError(f"set {set_id} did not take an enqueue: {result!r}")
            calls.records.append(Call(set_id, started, done, ok, "" if ok else type(result).__name__))
            if done >= stop_at:
                return

    tasks = [asyncio.get_running_loop().create_task(caller(w)) for w in range(args.concurrency)]
    await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
    cpu0 = processes.cpu_seconds()
    before = {k: await log_shape(processes.sets[k], probes[k]) for k in ids}
    killed: list[int] = []
    if lose:
        await asyncio.sleep(max(0.0, kill_at - time.perf_counter()))
        cpu_kill = processes.cpu_seconds()
        after_shape = {k: await log_shape(processes.sets[k], probes[k]) for k in ids}
        lost = processes.sets[lose]
        leader = await lost.wait_leader(probes[lose])
        killed = [leader, next(n for n in lost.ids if n != leader)]
        for node in killed:
            lost.kill(node)
        killed_at = time.perf_counter()
    await asyncio.gather(*tasks)
    end = time.perf_counter()
    if not lose:
        for k in ids:  # the followers' applies the window's commits left: theirs too (as `bench.queue enqueue`)
            await caught_up(processes.sets[k], probes[k])
        cpu_kill = processes.cpu_seconds()
        after_shape = {k: await log_shape(processes.sets[k], probes[k]) for k in ids}
        killed_at = end
    for probe in probes.values():
        await probe.close()
    retries = sum(c.raft.retries for c in sets.clients.values())
    await sets.close()

    measured_end = min(kill_at, end) if lose else end
    elapsed = measured_end - t0
    measured = calls.window(t0, measured_end)
    node_cpu = {k: cpu_kill[k] - cpu0[k] for k in ids}
    per_set: dict[str, dict[str, Any]] = {}
    for k in ids:
        mine = [c for c in measured if c.set_id == k]
        latencies = [c.done - c.started for c in mine]
        shape = (after_shape[k][1] - before[k][1], after_shape[k][0] - before[k][0])
        per_set[str(k)] = {
            "enqueued": len(mine),
            "share": round(len(mine) / max(1, len(measured)), 4),
            "enqueued_per_s": round(len(mine) / elapsed, 1),
            "p50_ms": round(1000 * percentile(latencies, 0.50), 3),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 3),
            "node_cpu_us_per_enqueue": round(1e6 * node_cpu[k] / max(1, len(mine)), 1),
            "commands_per_entry": round(shape[0] / max(1, shape[1]), 1),
        }
    latencies = [c.done - c.started for c in measured]
    commands = sum(after_shape[k][1] - before[k][1] for k in ids)
    entries = sum(after_shape[k][0] - before[k][0] for k in ids)
    shares = [v["share"] for v in per_set.values()]
    result: dict[str, Any] = {
        "mode": "enqueue",
        "enqueued_per_s": round(len(measured) / elapsed, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 3),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 3),
        "acked": len(measured),
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 2),
        "payload_bytes": args.payload_bytes,
        "node_cpu_us_per_enqueue": round(1e6 * sum(node_cpu.values()) / max(1, len(measured)), 1),
        "commands_per_entry": round(commands / max(1, entries), 1),
        "client_retries": retries,
        "sets": len(ids),
        "routing": "SetsClient by key, table epoch 1 = " + str(list(epoch.sets)),
        "callers": "bound to a set each (--lose-set)" if lose else "shared key sequence, routed by key",
        "share_max_deviation": round(max(abs(s * len(ids) - 1) for s in shares), 4),
        "per_set": per_set,
    }
    if lose:
        result["lose_set"] = lose_figures(calls, ids, lose, killed, t0=t0, kill_at=killed_at, end=min(end, stop_at),
                                          deadline_s=deadline_s, attempt_s=attempt_s, misrouted=sum(misrouted.values()))  # fmt: skip
    return result


def lose_figures(
    calls: Calls, ids: list[int], lose: int, killed: list[int], *, t0: float, kill_at: float, end: float,
    deadline_s: float, attempt_s: float, misrouted: int,
) -> dict[str, Any]:
    """The other sets' rate before and after set `lose` lost its majority (until the callers stop
    posting: `end`), and how its keys failed (every failure, however late it ended)."""
    others = [k for k in ids if k != lose]
    before_s, after_s = kill_at - t0, end - kill_at

    def rates(lo: float, hi: float) -> dict[str, float]:
        done = calls.window(lo, hi)
        return {str(k): round(sum(1 for c in done if c.set_id == k) / max(1e-9, hi - lo), 1) for k in ids}

    before, after = rates(t0, kill_at), rates(kill_at, end)
    others_before = sum(before[str(k)] for k in others)
    others_after = sum(after[str(k)] for k in others)
    failed = [c for c in calls.records if c.set_id == lose and not c.ok]
    waits = [c.done - c.started for c in failed]
    return {
        "set": lose,
        "killed_nodes": killed,
        "store_attempt_timeout_s": attempt_s,
        "store_deadline_s": deadline_s,
        "seconds_before": round(before_s, 2),
        "seconds_after": round(after_s, 2),
        "enqueued_per_s_before": before,
        "enqueued_per_s_after": after,
        "others_enqueued_per_s_before": round(others_before, 1),
        "others_enqueued_per_s_after": round(others_after, 1),
        "others_after_over_before": round(others_after / max(1e-9, others_before), 3),
        "lost_set_failed": len(failed),
        "lost_set_failed_by": dict(Counter(c.error for c in failed)),
        "lost_set_failure_s_p50": round(percentile(waits, 0.50), 3),
        "lost_set_failure_s_max": round(max(waits, default=0.0), 3),
        "lost_set_ok_after_kill": sum(1 for c in calls.records if c.set_id == lose and c.ok and c.done >= kill_at),
        "misrouted": misrouted,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-queue-sets-") as tmp:
        processes = SetProcesses(Path(tmp), args.sets, hosted=False)  # its figures are per set's processes
        processes.start_all()
        try:
            result = asyncio.run(enqueue_sets(processes, args))
        finally:
            processes.stop_all()
    result["nodes"] = processes.nodes
    return result
