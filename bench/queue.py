"""Queue benchmark: the queue machine on a 3-node cluster of processes on loopback, fsync on.

    python -m bench.queue enqueue --concurrency 256 --seconds 10 --json
    python -m bench.queue enqueue --concurrency 256 --preload 1000000 --json
    python -m bench.queue drain --messages 100000 --json
    python -m bench.queue lateness --delayed 1000000 --json
    python -m bench.queue burst --messages 500000 --json
    python -m bench.queue backlog --messages 10000000 --json
    python -m bench.queue enqueue --sets 3 [--lose-set 2] --json    (bench/queue_sets.py)

Every mode starts its own cluster (`--machine queues.replicated:machine_factory`) in a temp dir
and talks to it through QueueClient, the way a service and its workers would.

- enqueue: `concurrency` callers each enqueue a unique 1 KiB message and wait for the commit
  before the next; concurrent calls are coalesced into shared frames and log entries. Reports
  acknowledged enqueues per second and the p50/p99 latency of each acknowledgement, with
  `disk_probe` (the disk's stalls meanwhile, as in lateness; its thread's CPU, about 0.4 ms a
  sync with the kernel's part, is taken out of the client's). `--preload N` first enqueues N
  delayed messages (UUID keys, due in a day, 256-byte payloads, as backlog does), so the window
  measures intake into a store that is not empty, as during an outage: each enqueue then lands on
  leaves of large random-keyed indexes, and the group commits that write them are long.
- drain: preload `messages` ready messages, then 4 workers lease 1000 at a time and ack each
  batch in one frame; reports acked messages per second.
- lateness: preload `delayed` messages whose due times are spread uniformly over a window
  (`--window-s`, an hour) that starts after the preload; then workers poll-lease (and ack)
  continuously through the window's first `--measure-s` seconds, with the rest of the backlog still
  delayed behind. Lateness of each grant is the leader's now_ms at the lease minus the message's
  due_ms (queues/lateness.py); messages that fell due while the preload still ran are left out.
  `disk_probe`: what the nodes' disk did meanwhile (bench/disk_probe.py: a light fdatasync probe
  beside the window; its stalls stall every node's WAL at once, and the grants due then).
- burst: preload `messages` messages all due within one second. `all_ready_s`: from the end of
  that second (every message due; or from the end of the preload if it overran the second) until a linearizable count shows all of them ready, i.e.
  leasable (the lease predicate: waiting, due, kind not paused), confirmed on 1000 ids read back;
  `all_leased_s`: from the start of the second until workers (1000 per lease, no ack) were granted
  every one: delivery throughput, which the workers and the log bound, not the due index.
- backlog: enqueue `messages` delayed (due in a day) messages in batches of 1000; samples each
  node's RSS and its heap part (RssAnon; the rest is mapped file pages) every second; compares
  enqueue throughput of the first and last 10%; then kills all three nodes (SIGKILL) and restarts
  them: restart_s is the time until a linearizable read and an enqueue succeed again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import queue_sets
from bench.disk_probe import DiskProbe
from bench.memory_limit import MemoryLimit
from bench.queue_args import parse
from bench.queue_figures import caught_up, log_shape, percentile
from queues.client import QueueClient
from queues.lateness import LatenessReport
from queues.model import Code, Enqueue, Grant
from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster

MACHINE = "queues.replicated:machine_factory"
DAY_MS = 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rss_mib(cluster: ProcessCluster, field: str = "VmRSS") -> dict[int, float]:
    """Each node's resident set (`VmRSS`), or one of its parts: `RssAnon` (the heap, what the
    process needs) or `RssFile` (pages of mapped files, e.g. the LMDB store's map: the kernel's
    page cache, shared and dropped under memory pressure)."""
    out: dict[int, float] = {}
    for node, proc in cluster.procs.items():
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    out[node] = int(line.split()[1]) / 1024
        except OSError:
            continue
    return out


async def connect(cluster: ProcessCluster) -> tuple[RaftClient, QueueClient]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=120.0)
    await cluster.wait_leader(raft)
    return raft, QueueClient(raft)


async def preload(
    queue: QueueClient, count: int, make: Callable[[int], Enqueue], *, batch: int = 1000, inflight: int = 3,
    on_batch: Callable[[int, float], None] | None = None,
) -> float:
    """Enqueue `count` messages, `batch` per frame (one log entry), `inflight` frames at once."""
    next_start = 0
    started = time.perf_counter()

    async def loader() -> None:
        nonlocal next_start
        while next_start < count:
            start = next_start
            end = next_start = min(count, start + batch)
            results = await queue.enqueue_many([make(i) for i in range(start, end)])
            assert all(r.code is Code.OK for r in results), results[0]
            if on_batch is not None:
                on_batch(end - start, time.perf_counter())

    await asyncio.gather(*(loader() for _ in range(inflight)))
    return time.perf_counter() - started


def payload_of(size: int) -> bytes:
    return os.urandom(size)


# ---- modes ---------------------------------------------------------------------------------------
async def closed_loop(
    send: Callable[[str], Awaitable[None]], *, concurrency: int, seconds: float, warmup_s: float = 1.0,
    key_prefix: str = "c", at_start: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[float], float]:
    """`concurrency` callers, each sending a new key and waiting for its acknowledgement before the
    next; `warmup_s` not measured, then `seconds` measured. Returns the latencies of the
    acknowledgements that arrived inside the window, and the time from its start until the last
    caller stopped (the rate is their ratio). `at_start` takes the window's first readings.
    bench.peers_queue drives the peers with it too, so both count alike."""
    latencies: list[float] = []
    measuring = False
    stop_at = time.perf_counter() + warmup_s + seconds
    counter = 0

    async def caller(worker: int) -> None:
        nonlocal counter
        while True:
            counter += 1
            key = f"{key_prefix}{worker}-{counter}"
            started = time.perf_counter()
            await send(key)
            done = time.perf_counter()
            if done >= stop_at:
                return
            if measuring:
                latencies.append(done - started)

    tasks = [asyncio.get_running_loop().create_task(caller(w)) for w in range(concurrency)]
    try:
        await asyncio.sleep(warmup_s)
        measuring = True
        t0 = time.perf_counter()
        if at_start is not None:
            await at_start()
        await asyncio.gather(*tasks)
        return latencies, time.perf_counter() - t0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def uuid_key(i: int) -> str:
    """The i-th caller's key as a UUID (random B-tree positions), the same in every run."""
    return str(uuid.UUID(int=random.Random(i).getrandbits(128), version=4))


def backlog_message(i: int, key: str, payload: bytes, start_ms: int) -> Enqueue:
    """The i-th message of a preloaded backlog: delayed a day past `start_ms`, one ms after the
    previous, so none falls due while the benchmark runs."""
    return Enqueue(kind="transfer", idempotency_key=key, ref_key=f"r{i}", payload=payload, due_ms=start_ms + DAY_MS + i)


async def enqueue_mode(cluster: ProcessCluster, args: argparse.Namespace) -> dict[str, Any]:
    raft, queue = await connect(cluster)
    payload = payload_of(args.payload_bytes)
    readings: dict[str, Any] = {}
    preload_s = 0.0
    if args.preload:
        backlog_payload, start_ms = payload_of(256), now_ms()
        preload_s = await preload(queue, args.preload, lambda i: backlog_message(i, uuid_key(i), backlog_payload, start_ms))

    async def send(key: str) -> None:
        result = await queue.enqueue("transfer", idempotency_key=key, ref_key=key, payload=payload)
        assert result.code is Code.OK

    probe = DiskProbe(cluster.root)

    async def at_start() -> None:
        readings.update(cpu0=cluster.cpu_seconds(), client0=time.process_time(), before=await log_shape(cluster, raft))
        probe.start()

    try:
        latencies, elapsed = await closed_loop(send, concurrency=args.concurrency, seconds=args.seconds,
                                               at_start=at_start)  # fmt: skip
    finally:
        probe.stop()
    await caught_up(cluster, raft)  # the followers' applies the window's commits left: theirs too
    node_cpu = cluster.cpu_seconds() - readings["cpu0"]
    client_cpu = time.process_time() - readings["client0"] - probe.cpu_s
    before = readings["before"]
    after = await log_shape(cluster, raft)
    await raft.close()
    return {
        "mode": "enqueue",
        "enqueued_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 3),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 3),
        "acked": len(latencies),
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 2),
        "payload_bytes": args.payload_bytes,
        "node_cpu_us_per_enqueue": round(1e6 * node_cpu / max(1, len(latencies)), 1),
        "client_cpu_us_per_enqueue": round(1e6 * client_cpu / max(1, len(latencies)), 1),
        "commands_per_entry": round((after[1] - before[1]) / max(1, after[0] - before[0]), 1),
        "client_retries": raft.retries,
        "preloaded": args.preload,
        "preload_per_s": round(args.preload / preload_s, 1) if preload_s else None,
        "disk_probe": probe.summary(),
    }


async def drain_workers(
    queue: QueueClient, total: int, *, workers: int, ack: bool, kinds: tuple[str, ...] = ("transfer",),
    lease_ms: int = 600_000, on_grants: Callable[[tuple[Grant, ...]], None] | None = None,
    deadline_s: float = 3600.0, idle_sleep_s: float = 0.005,
) -> int:
    """Lease (and ack) until `total` grants were received. Returns the number received."""
    received = 0
    give_up = time.perf_counter() + deadline_s

    async def worker(n: int) -> None:
        nonlocal received
        while received < total and time.perf_counter() < give_up:
            result = await queue.lease(f"bench-{n}", kinds=kinds, count_max=1000, lease_ms=lease_ms)
            if not result.grants:
                await asyncio.sleep(idle_sleep_s)
                continue
            received += len(result.grants)
            if on_grants is not None:
                on_grants(result.grants)
            if ack:
                outcomes = await queue.ack_many([(g.message_id, g.token) for g in result.grants])
                assert all(o.code is Code.OK for o in outcomes)

    await asyncio.gather(*(worker(n) for n in range(workers)))
    return received


async def drain_mode(cluster: ProcessCluster, args: argparse.Namespace) -> dict[str, Any]:
    raft, queue = await connect(cluster)
    payload = payload_of(args.payload_bytes)
    preload_s = await preload(
        queue, args.messages,
        lambda i: Enqueue(kind="transfer", idempotency_key=f"d{i}", ref_key=f"r{i}", payload=payload),
    )
    t0 = time.perf_counter()
    acked = await drain_workers(queue, args.messages, workers=args.workers, ack=True)
    elapsed = time.perf_counter() - t0
    counts = (await queue.counts()).value
    await raft.close()
    return {
        "mode": "drain",
        "acked_per_s": round(acked / elapsed, 1),
        "acked": acked,
        "seconds": round(elapsed, 2),
        "workers": args.workers,
        "lease_batch": 1000,
        "payload_bytes": args.payload_bytes,
        "preload_per_s": round(args.messages / preload_s, 1),
        "done_after": counts.get(("transfer", "done"), 0),
    }


async def lateness_mode(cluster: ProcessCluster, args: argparse.Namespace) -> dict[str, Any]:
    raft, queue = await connect(cluster)
    payload = payload_of(args.payload_bytes)
    count = args.delayed
    # Calibrate the preload rate on 2% (due in a day: they stay delayed backlog), then place the
    # due window after the estimated end of the preload.
    calib = max(1000, count // 50)
    calib_s = await preload(
        queue, calib,
        lambda i: Enqueue(kind="callback", idempotency_key=f"c{i}", ref_key=f"c{i}", payload=payload,
                          delay_ms=DAY_MS),
    )
    estimate_s = count / (calib / calib_s)
    # Twice the estimate: at 1.3x the preload sometimes overran the window's start, and messages
    # due during the preload then queued ahead of the measured ones (oldest due first), so the
    # figure measured the drain of that backlog, not the due index (p99 over a second).
    window_start = now_ms() + int(1000 * (estimate_s * 2 + 10))
    window_ms = int(1000 * args.window_s)
    rng = random.Random(7)
    due = [window_start + rng.randrange(window_ms) for _ in range(count)]
    preload_s = await preload(
        queue, count,
        lambda i: Enqueue(kind="transfer", idempotency_key=f"l{i}", ref_key=f"l{i}", payload=payload,
                          due_ms=due[i]),
    )
    preload_end = now_ms()
    report = LatenessReport()
    during_preload = 0
    measure_end = window_start + int(1000 * args.measure_s)
    expected = sum(1 for d in due if preload_end < d <= measure_end)
    due_by_end = sum(1 for d in due if d <= measure_end)

    def observe(grants: tuple[Grant, ...]) -> None:
        nonlocal during_preload
        fresh = tuple(g for g in grants if g.due_ms > preload_end)
        during_preload += len(grants) - len(fresh)
        report.observe(fresh, 600_000)

    await asyncio.sleep(max(0.0, (window_start - now_ms()) / 1000 - 1.0))
    t0 = time.perf_counter()
    # Poll-lease (and ack) through the first measure_s seconds of the window: everything due in
    # that stretch, with the rest of the backlog still delayed behind it.
    with DiskProbe(cluster.root) as probe:
        received = await drain_workers(queue, due_by_end, workers=args.workers, ack=True,
                                       on_grants=observe, deadline_s=args.measure_s + 60)
    elapsed = time.perf_counter() - t0
    counts = (await queue.counts()).value
    await raft.close()
    return {
        "mode": "lateness",
        **{k: v for k, v in report.summary().items() if k != "count"},
        "measured_grants": len(report),
        "expected_grants": expected,
        "received": received,
        "due_during_preload": during_preload,
        "window_overran_preload": preload_end > window_start,
        "delayed": count,
        "still_delayed_after": counts.get(("transfer", "delayed"), 0),
        "due_window_s": args.window_s,
        "measured_s": args.measure_s,
        "poll_s": round(elapsed, 2),
        "workers": args.workers,
        "preload_per_s": round(count / preload_s, 1),
        "backlog_extra_delayed": calib,
        "payload_bytes": args.payload_bytes,
        "lateness_from": "leader now_ms at lease - due_ms",
        "disk_probe": probe.summary(),
    }


async def burst_mode(cluster: ProcessCluster, args: argparse.Namespace) -> dict[str, Any]:
    raft, queue = await connect(cluster)
    payload = payload_of(args.payload_bytes)
    count = args.messages
    calib = max(1000, count // 50)
    calib_s = await preload(
        queue, calib,
        lambda i: Enqueue(kind="callback", idempotency_key=f"c{i}", ref_key=f"c{i}", payload=payload,
                          delay_ms=DAY_MS),
    )
    second_ms = (now_ms() + int(1000 * (count / (calib / calib_s) * 1.6 + 10))) // 1000 * 1000
    rng = random.Random(11)
    preload_s = await preload(
        queue, count,
        lambda i: Enqueue(kind="transfer", idempotency_key=f"b{i}", ref_key=f"b{i}", payload=payload,
                          due_ms=second_ms + rng.randrange(1000)),
    )
    preloaded_ms = now_ms()
    early = max(0.0, (second_ms - preloaded_ms) / 1000)
    # Every message is due at the end of the second; if the preload overran it (a slow machine),
    # readiness can only be asked of messages that exist, so the clock starts when the last exists.
    all_due_ms = max(second_ms + 999, preloaded_ms)
    await asyncio.sleep(max(0.0, (all_due_ms - now_ms()) / 1000))
    # Leasable: WAITING with due_ms <= now in an unpaused kind, the lease predicate itself. Counted
    # through a linearizable read, and confirmed on a sample of ids read back one by one.
    ready_read = None
    while ready_read is None:
        read = await queue.counts()
        counted = read.value
        if counted.get(("transfer", "ready"), 0) == count and counted.get(("transfer", "delayed"), 0) == 0:
            ready_read = read
        else:
            await asyncio.sleep(0.01)
    sample_keys = [f"b{i}" for i in rng.sample(range(count), min(1000, count))]
    sample = (await queue.by_idempotency_keys(sample_keys)).value
    sample_ready = sum(1 for view in sample if view.state.value == "ready")
    last_grant_ms = 0

    def observe(grants: tuple[Grant, ...]) -> None:
        nonlocal last_grant_ms
        last_grant_ms = max(last_grant_ms, max(g.deadline_ms - 600_000 for g in grants))

    started = now_ms()
    received = await drain_workers(queue, count, workers=args.workers, ack=False, on_grants=observe)
    await raft.close()
    return {
        "mode": "burst",
        "all_ready_s": round((ready_read.now_ms - all_due_ms) / 1000, 3),
        "ready_at_applied_index": ready_read.applied_index,
        "sample_ready": f"{sample_ready}/{len(sample_keys)}",
        "all_leased_s": round((last_grant_ms - second_ms) / 1000, 3),
        "messages": count,
        "received": received,
        "started_after_second_ms": started - second_ms,
        "leased_per_s": round(received / max(0.001, (last_grant_ms - second_ms) / 1000), 1),
        "preload_finished_before_second_s": round(early, 1),
        "preload_overran_second_s": round(max(0, preloaded_ms - second_ms - 999) / 1000, 1),
        "preload_per_s": round(count / preload_s, 1),
        "workers": args.workers,
        "lease_batch": 1000,
        "payload_bytes": args.payload_bytes,
        "backlog_extra_delayed": calib,
    }


async def backlog_mode(cluster: ProcessCluster, args: argparse.Namespace) -> dict[str, Any]:
    """With --memory-limit-mib each node runs in a memory cgroup of that size (bench/memory_limit.py)."""
    if not args.memory_limit_mib:
        return await _backlog(cluster, args, None)
    limit = MemoryLimit(f"bench-queue-{os.getpid()}", args.memory_limit_mib << 20)
    try:
        return await _backlog(cluster, args, limit)
    finally:
        cluster.stop_all()
        limit.remove()


async def _backlog(cluster: ProcessCluster, args: argparse.Namespace, limit: MemoryLimit | None) -> dict[str, Any]:
    raft, queue = await connect(cluster)
    payload = payload_of(args.payload_bytes)
    count = args.messages
    rss_max: dict[int, float] = {}
    anon_max: dict[int, float] = {}

    def key_of(i: int) -> str:
        """Callers' keys: UUIDs (random B-tree positions) with --random-keys, else k0, k1, ..."""
        return uuid_key(i) if args.random_keys else f"k{i}"

    marks: list[tuple[int, float]] = []
    done = 0

    def on_batch(n: int, at: float) -> None:
        nonlocal done
        done += n
        marks.append((done, at))

    async def sample() -> None:
        while True:
            for node, mib in rss_mib(cluster).items():
                rss_max[node] = max(rss_max.get(node, 0.0), mib)
            for node, mib in rss_mib(cluster, "RssAnon").items():
                anon_max[node] = max(anon_max.get(node, 0.0), mib)
            await asyncio.sleep(1.0)

    if limit is not None:
        for node, proc in cluster.procs.items():
            limit.add(node, proc.pid)
    sampler = asyncio.get_running_loop().create_task(sample())
    started_ms = now_ms()
    started = time.perf_counter()
    preload_s = await preload(
        queue, count,
        lambda i: backlog_message(i, key_of(i), payload, started_ms),
        on_batch=on_batch,
    )
    sampler.cancel()
    for node, mib in rss_mib(cluster).items():
        rss_max[node] = max(rss_max.get(node, 0.0), mib)
    for node, mib in rss_mib(cluster, "RssAnon").items():
        anon_max[node] = max(anon_max.get(node, 0.0), mib)

    def rate(lo: float, hi: float) -> float:
        picked = [(n, t) for n, t in marks if lo * count <= n <= hi * count]
        if len(picked) < 2:
            return 0.0
        return (picked[-1][0] - picked[0][0]) / max(1e-9, picked[-1][1] - picked[0][1])

    lease_t0 = time.perf_counter()
    nothing = await queue.lease("probe", kinds=("transfer",), count_max=1000, lease_ms=1000)
    lease_empty_ms = (time.perf_counter() - lease_t0) * 1000
    assert not nothing.grants
    await raft.close()
    data_mib = sum(f.stat().st_size for f in cluster.root.rglob("*") if f.is_file()) / (1 << 20) / cluster.size
    for node in cluster.ids:
        cluster.kill(node, signal.SIGKILL)
    t0 = time.perf_counter()
    cluster.start_all()
    if limit is not None:
        for node, proc in cluster.procs.items():
            limit.add(node, proc.pid)
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=5.0, deadline_s=600.0)
    queue = QueueClient(raft)
    await cluster.wait_leader(raft, timeout_s=600.0)
    counted = (await queue.by_idempotency_keys([key_of(count - 1)])).value
    after = await queue.enqueue("transfer", idempotency_key="after-restart", ref_key="x", payload=payload)
    restart_s = time.perf_counter() - t0
    assert counted and after.code is Code.OK
    rss_after = rss_mib(cluster)
    anon_after = rss_mib(cluster, "RssAnon")
    await raft.close()
    limited: dict[str, Any] = {}
    if limit is not None:
        limited = {"memory_limit_mib": args.memory_limit_mib, "cgroup": limit.figures()}
    return {
        **limited,
        "mode": "backlog",
        "messages": count,
        "rss_mib_max": {str(n): round(v, 1) for n, v in sorted(rss_max.items())},
        "rss_mib_after_restart": {str(n): round(v, 1) for n, v in sorted(rss_after.items())},
        "rss_anon_mib_max": {str(n): round(v, 1) for n, v in sorted(anon_max.items())},
        "rss_anon_mib_after_restart": {str(n): round(v, 1) for n, v in sorted(anon_after.items())},
        "enqueued_per_s_start": round(rate(0.0, 0.1), 1),
        "enqueued_per_s_end": round(rate(0.9, 1.0), 1),
        "enqueued_per_s_overall": round(count / preload_s, 1),
        "enqueued_per_s_by_decile": [round(rate(d / 10, (d + 1) / 10)) for d in range(10)],
        "first_batch_s": round(marks[0][1] - started, 2) if marks else None,
        "last_batch_s": round(marks[-1][1] - started, 2) if marks else None,
        "lease_with_full_backlog_ms": round(lease_empty_ms, 2),
        "restart_s": round(restart_s, 2),
        "data_dir_mib_per_node": round(data_mib, 1),
        "payload_bytes": args.payload_bytes,
        "random_keys": args.random_keys,
        "batch": 1000,
    }


MODES = {"enqueue": enqueue_mode, "drain": drain_mode, "lateness": lateness_mode, "burst": burst_mode,
         "backlog": backlog_mode}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.sets > 1:
        result = queue_sets.run(args)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
            cluster = ProcessCluster(Path(tmp), machine=MACHINE)
            cluster.start_all()
            try:
                result = asyncio.run(MODES[args.mode](cluster, args))
            finally:
                cluster.stop_all()
        result["nodes"] = cluster.size
    result["fsync"] = True
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    result["date"] = time.strftime("%Y-%m-%d")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
