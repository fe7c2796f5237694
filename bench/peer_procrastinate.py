"""Side by side from outside: bench.e2e's load against procrastinate on PostgreSQL with a synchronous standby.

    python -m bench.peer_procrastinate --json                 # the peer alone, bench.e2e's load
    python -m bench.peer_procrastinate --side-by-side --json  # then `python -m bench.e2e --no-reconcile` and the ratios

The peer (bench/peer_app.py): a FastAPI intake deferring one procrastinate job per item, and
`--workers` procrastinate worker processes (`--concurrency` jobs each) calling the same stand-ins
our workers call, with the same retry policy. Its queue is an embedded PostgreSQL 18 with fsync on
and a second one streaming from it as a synchronous standby (`synchronous_standby_names`,
`synchronous_commit=on`): an acknowledged job is flushed on two machines' worth of disk, as our
majority of three has fsynced an acknowledged request. The stand-ins and their own PostgreSQL are
started exactly as bench.e2e starts them (same seed, same 503 rate, payment dedup on).

The load is bench.e2e's: `--requests` items (seven transfers, two receive-list updates, one callback
in every ten, the same bodies), POSTed in batches of `--batch-size`, `--in-flight` at a time.
The window runs from the first POST until no job is todo or doing (or none ended for
`--stall-timeout-s`). Figures, named as bench.e2e names them: done_per_s (succeeded jobs / first
POST to the last success), time to done for first-try successes (the job's deferred event to its
succeeded event), lost (acknowledged jobs that did not succeed), double_paid, done_without_effect,
and CPU per done request by process group; `peer_total` is the peer's own processes (intake,
workers, both PostgreSQL servers), the counterpart of bench.e2e's API + nodes + workers.

Exits 1 when a job is lost, a transfer is paid twice, a done job left no effect, or the run could
not finish. Every process and the directory are removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx
import msgspec

from bench import e2e
from bench import e2e_figures as figures
from bench import e2e_load as load
from bench.harness import (
    BenchError,
    Server,
    child_environment,
    code_revision,
    machine_busy_cpu_s,
    run_in_directory,
    trees_cpu_s,
)
from bench.peer_app import READY_LINE
from ledger import pg
from raft_store.testing.processes import free_ports

STANDBY_NAME: Final = "peer_standby"
DURABLE: Final = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
PENDING: Final = ("todo", "doing")
PEER_GROUPS: Final = ("intake", "workers", "queue_primary", "queue_standby")
OURS_GROUPS: Final = ("api", "nodes", "workers")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    requests: int
    batch_size: int
    in_flight: int
    rate_per_s: float
    error_rate: float
    retry_ms: int
    attempts_max: int
    workers: int
    concurrency: int
    stall_timeout_s: float
    seed: int
    standby: bool

    def e2e_settings(self) -> e2e.Settings:
        """bench.e2e's settings for the same load (its stand-ins are started from them)."""
        return e2e.Settings(
            requests=self.requests, batch_size=self.batch_size, in_flight=self.in_flight, rate_per_s=self.rate_per_s,
            error_rate=self.error_rate, retry_ms=self.retry_ms, attempts_max=self.attempts_max, workers=self.workers,
            api_workers=1, stall_timeout_s=self.stall_timeout_s, seed=self.seed, profile_dir=None,
            profile_format="raw", profile_process="worker", breaker="shipped", reconcile=False,
        )  # fmt: skip


# ---- the processes ---------------------------------------------------------------------------------
@dataclass
class PeerStack:
    """The stand-ins (bench.e2e's `Stack`), the peer's two PostgreSQL servers, its intake and workers."""

    base: e2e.Stack
    primary: pg.EmbeddedPostgres | None = None
    standby: pg.EmbeddedPostgres | None = None
    intake: Server | None = None
    workers: list[Server] = field(default_factory=list)
    intake_url: str = ""

    def start(self, settings: Settings) -> None:
        base, root = self.base, self.base.root
        base.start_postgres()
        secrets_file = base.write_secrets()
        base.start_standins(settings.e2e_settings(), secrets_file)
        for name in ("queue", "standby"):
            (root / name).mkdir()  # a folder of its own: as root, PostgreSQL runs as another user
        durable = {**DURABLE, **({"synchronous_standby_names": STANDBY_NAME} if settings.standby else {})}
        primary = self.primary = pg.EmbeddedPostgres(root / "queue" / "data", settings=durable)
        base.cleanups.append(primary.stop)
        pg.wait_until_accepting(primary.start())
        if settings.standby:
            standby = self.standby = pg.EmbeddedPostgres(root / "standby" / "data", settings=DURABLE,
                                                         standby_of=primary.address, application_name=STANDBY_NAME)  # fmt: skip
            base.cleanups.append(standby.stop)
            pg.wait_until_accepting(standby.start())
        asyncio.run(apply_schema(primary.dsn, synchronous=settings.standby))
        env = child_environment(
            PEER_DSN=primary.dsn, PEER_PAYMENT_URL=base.standin_urls["payment"],
            PEER_RED_PACKET_URL=base.standin_urls["red_packet"],
            PEER_CALLBACK_URL=base.standin_urls["callback"],
            PEER_CALLBACK_SECRETS_FILE=str(secrets_file), PEER_CALLBACK_TARGET=e2e.CALLBACK_TARGET,
            PEER_RETRY_MS=str(settings.retry_ms), PEER_ATTEMPTS_MAX=str(settings.attempts_max),
        )  # fmt: skip
        for number in range(1, settings.workers + 1):
            command = [sys.executable, "-m", "bench.peer_app", "worker", "--concurrency", str(settings.concurrency)]
            worker = Server(f"peer worker {number}", command, env, root / f"peer-worker{number}.log")
            base.cleanups.append(worker.stop)
            self.workers.append(worker)
            worker.start()
        for worker in self.workers:
            worker.wait_line(READY_LINE)
        (port,) = free_ports(1)
        intake = self.intake = Server("peer intake", [sys.executable, "-m", "bench.peer_app", "intake", "--port", str(port)],
                                      env, root / "peer-intake.log")  # fmt: skip
        base.cleanups.append(intake.stop)
        intake.start()
        self.intake_url = f"http://127.0.0.1:{port}"
        intake.wait_ready(f"{self.intake_url}/readyz")

    def cpu_s(self) -> dict[str, float]:
        assert self.intake is not None and self.primary is not None and self.base.standins is not None
        roots = {"intake": [self.intake.pid], "workers": [w.pid for w in self.workers],
                 "queue_primary": [_postmaster(self.primary)], "standins": [self.base.standins.pid],
                 "standins_postgres": [self.base.postmaster_pid()]}  # fmt: skip
        if self.standby is not None:
            roots["queue_standby"] = [_postmaster(self.standby)]
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {**trees_cpu_s(roots), "bench_client": own.ru_utime + own.ru_stime, "machine_busy": machine_busy_cpu_s()}


def _postmaster(server: pg.EmbeddedPostgres) -> int:
    pid = server.running_pid()
    if pid is None:
        raise BenchError(f"PostgreSQL in {server.data_dir} is not running")
    return pid


async def apply_schema(dsn: str, *, synchronous: bool) -> None:
    """procrastinate's schema (its own SQL file, as `procrastinate schema --apply` runs it)."""
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    if synchronous:
        connection = await asyncpg.connect(dsn)
        try:
            rows = await connection.fetch("SELECT application_name, sync_state FROM pg_stat_replication")
        finally:
            await connection.close()
        if not any(r["application_name"] == STANDBY_NAME and r["sync_state"] == "sync" for r in rows):
            raise BenchError(f"the standby is not synchronous: {[dict(r) for r in rows]}")


# ---- the window ------------------------------------------------------------------------------------
@dataclass
class Window:
    acknowledged: dict[int, load.Planned] = field(default_factory=dict)
    """By job id."""
    refused: int = 0
    first_refusal: str = ""
    first_post_ms: int = 0
    batch_latencies_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    cpu_wall_s: float = 0.0
    settled: bool = False
    counts: dict[str, int] = field(default_factory=dict)


async def measure(stack: PeerStack, settings: Settings, planned: list[load.Planned]) -> Window:
    assert stack.primary is not None
    batches = load.batch_bodies(planned, settings.batch_size)
    window = Window()
    limits = httpx.Limits(max_connections=settings.in_flight, max_keepalive_connections=settings.in_flight)
    connection = await asyncpg.connect(stack.primary.dsn)
    try:
        async with httpx.AsyncClient(base_url=stack.intake_url, limits=limits, timeout=load.POST_TIMEOUT_S) as http:
            before, started_s = stack.cpu_s(), time.monotonic()
            await post_all(http, batches, settings, window)
            after, ended_s = await settle(connection, window, settings.stall_timeout_s, stack)
    finally:
        await connection.close()
    window.cpu_s = {name: after[name] - before[name] for name in before}
    window.cpu_wall_s = ended_s - started_s
    return window


async def post_all(http: httpx.AsyncClient, batches: Sequence[tuple[list[load.Planned], bytes]], settings: Settings,
                   window: Window) -> None:  # fmt: skip
    """As bench.e2e_load.post_all: `in_flight` senders, paced at `rate_per_s` when set; a batch that
    fails as a whole is sent again (the intake has no per-item 503)."""
    pending = list(range(len(batches)))
    pending.reverse()
    started_s = time.perf_counter()
    window.first_post_ms = time.time_ns() // 1_000_000
    headers = {"content-type": "application/json"}

    async def sender() -> None:
        while pending:
            number = pending.pop()
            items, body = batches[number]
            if settings.rate_per_s > 0:
                await asyncio.sleep(
                    max(0.0, started_s + number * len(items) / settings.rate_per_s - time.perf_counter())
                )
            for attempt in range(load.POST_TRIES_MAX):
                if attempt:
                    await asyncio.sleep(load.RETRY_PAUSE_S)
                sent_s = time.perf_counter()
                try:
                    answer = await http.post("/v1/requests:batch", content=body, headers=headers)
                except httpx.HTTPError as error:
                    window.first_refusal = window.first_refusal or f"transport: {type(error).__name__}: {error}"
                    continue
                if answer.status_code != 200:
                    window.first_refusal = window.first_refusal or f"{answer.status_code}: {answer.text[:300]}"
                    continue
                window.batch_latencies_s.append(time.perf_counter() - sent_s)
                for planned, item in zip(items, msgspec.json.decode(answer.content)["items"], strict=True):
                    window.acknowledged[int(item["request"]["id"])] = planned
                break
            else:
                window.refused += len(items)

    await asyncio.gather(*(sender() for _ in range(settings.in_flight)))


async def settle(connection: asyncpg.Connection, window: Window, stall_s: float,
                 stack: PeerStack) -> tuple[dict[str, float], float]:  # fmt: skip
    """Until no job is todo or doing, or none ended for `stall_s`: the CPU reading and time of the
    last poll that saw a job end (as bench.e2e.settle)."""
    ended, progress = -1, (stack.cpu_s(), time.monotonic())
    while True:
        rows = await connection.fetch("SELECT status::text AS status, count(*) AS n FROM procrastinate_jobs GROUP BY 1")
        window.counts = {r["status"]: int(r["n"]) for r in rows}
        pending = sum(n for status, n in window.counts.items() if status in PENDING)
        now_ended = sum(window.counts.values()) - pending
        if now_ended != ended:
            ended, progress = now_ended, (stack.cpu_s(), time.monotonic())
        if pending == 0:
            window.settled = True
            return progress
        if time.monotonic() - progress[1] > stall_s:
            return progress
        await asyncio.sleep(e2e.POLL_S)


# ---- reading back ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Jobs:
    status: dict[int, str]
    attempts: dict[int, int]
    deferred_ms: dict[int, float]
    succeeded_ms: dict[int, float]


async def read_jobs(dsn: str) -> Jobs:
    connection = await asyncpg.connect(dsn)
    try:
        jobs = await connection.fetch("SELECT id, status::text AS status, attempts FROM procrastinate_jobs")
        events = await connection.fetch(
            "SELECT job_id, type::text AS type, extract(epoch FROM at) * 1000 AS at_ms FROM procrastinate_events"
            " WHERE type IN ('deferred', 'succeeded')"
        )
    finally:
        await connection.close()
    deferred = {int(r["job_id"]): float(r["at_ms"]) for r in events if r["type"] == "deferred"}
    succeeded = {int(r["job_id"]): float(r["at_ms"]) for r in events if r["type"] == "succeeded"}
    return Jobs(status={int(r["id"]): r["status"] for r in jobs}, attempts={int(r["id"]): int(r["attempts"]) for r in jobs},
                deferred_ms=deferred, succeeded_ms=succeeded)  # fmt: skip


def summarize(window: Window, jobs: Jobs, ledgers: figures.Ledgers, settings: Settings) -> dict[str, Any]:
    done_ids = {job_id for job_id, status in jobs.status.items() if status == "succeeded"}
    acknowledged_done = done_ids & window.acknowledged.keys()
    last_done_ms = max((jobs.succeeded_ms.get(i, 0.0) for i in done_ids), default=float(window.first_post_ms))
    window_s = (last_done_ms - window.first_post_ms) / 1000
    first_try = [jobs.succeeded_ms[i] - jobs.deferred_ms[i] for i in done_ids
                 if jobs.attempts.get(i) == 1 and i in jobs.deferred_ms and i in jobs.succeeded_ms]  # fmt: skip
    retried = [jobs.succeeded_ms[i] - jobs.deferred_ms[i] for i in done_ids
               if jobs.attempts.get(i, 0) > 1 and i in jobs.deferred_ms and i in jobs.succeeded_ms]  # fmt: skip
    first = figures.spread_ms(first_try)
    cpu = figures.cpu_per_request(window.cpu_s, len(done_ids), window.cpu_wall_s)
    per_request = cpu["cpu_us_per_request"]
    peer_total = sum(per_request.get(name) or 0.0 for name in PEER_GROUPS)
    not_done: dict[str, int] = {}
    for job_id in window.acknowledged.keys() - done_ids:
        status = jobs.status.get(job_id, "missing")
        not_done[status] = not_done.get(status, 0) + 1
    return {
        "done_per_s": round(len(done_ids) / window_s, 1) if window_s > 0 else 0.0,
        "time_to_done_p50_ms": first["p50_ms"], "time_to_done_p99_ms": first["p99_ms"],
        "time_to_done_first_try": first, "time_to_done_retried": figures.spread_ms(retried),
        "lost": len(window.acknowledged) - len(acknowledged_done), "not_done_by_status": not_done,
        **figures.effects_of(window.acknowledged, done_ids, set(), ledgers, store_key_prefix=""),
        "requests": settings.requests, "acknowledged": len(window.acknowledged), "refused": window.refused,
        "done": len(done_ids), "window_s": round(window_s, 2), "settled": window.settled, "job_counts": window.counts,
        "post": {"batch_p50_ms": figures.ms(figures.percentile(window.batch_latencies_s, 0.5)),
                 "batch_p99_ms": figures.ms(figures.percentile(window.batch_latencies_s, 0.99)),
                 **({"first_refusal": window.first_refusal} if window.first_refusal else {})},
        **cpu,
        "peer_total_cpu_us_per_request": round(peer_total, 1),
    }  # fmt: skip


def checks(result: dict[str, Any], window: Window) -> list[str]:
    problems = []
    if not window.settled:
        problems.append(f"no job ended for --stall-timeout-s; jobs by status: {window.counts}")
    if result["lost"]:
        problems.append(f"{result['lost']} acknowledged jobs did not succeed: {result['not_done_by_status']}")
    if result["double_paid"]:
        problems.append(f"{result['double_paid']} transfers paid twice or never requested")
    if any(result["done_without_effect"].values()):
        problems.append(f"done without an effect downstream: {result['done_without_effect']}")
    if window.refused:
        problems.append(f"{window.refused} items never acknowledged: {window.first_refusal}")
    return problems


# ---- command ---------------------------------------------------------------------------------------
def run(settings: Settings, root: Path, result: dict[str, Any]) -> list[str]:
    stack = PeerStack(base=e2e.Stack(root))
    try:
        stack.start(settings)
        nonce = secrets.token_hex(3)
        planned = [load.submission(i, nonce=nonce, mix=load.MIX_DEFAULT, callback_target=e2e.CALLBACK_TARGET)
                   for i in range(settings.requests)]  # fmt: skip
        window = asyncio.run(measure(stack, settings, planned))
        assert stack.primary is not None and stack.base.postgres is not None
        jobs = asyncio.run(read_jobs(stack.primary.dsn))
        ledgers = asyncio.run(e2e.read_ledgers(stack.base.postgres.dsn))
        result.update(summarize(window, jobs, ledgers, settings))
        result["standins"] = e2e.standin_stats(stack.base.standin_urls)
        return checks(result, window)
    finally:
        stack.base.close()


def ours(settings: Settings) -> dict[str, Any]:
    """`python -m bench.e2e --no-reconcile --json` with the same load, in a process of its own."""
    command = [sys.executable, "-m", "bench.e2e", "--no-reconcile", "--json", "--requests", str(settings.requests),
               "--batch-size", str(settings.batch_size), "--in-flight", str(settings.in_flight),
               "--rate", str(settings.rate_per_s), "--error-rate", str(settings.error_rate),
               "--retry-ms", str(settings.retry_ms), "--attempts-max", str(settings.attempts_max),
               "--workers", str(settings.workers), "--seed", str(settings.seed)]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, check=False, env=child_environment())
    try:
        found: dict[str, Any] = json.loads(finished.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"errors": [f"bench.e2e exited {finished.returncode}: {finished.stderr.strip()[-500:]}"]}
    return found


def compare(peer: dict[str, Any], our: dict[str, Any]) -> dict[str, Any]:
    our_cpu = our.get("cpu_us_per_request", {})
    our_total = sum(our_cpu.get(name) or 0.0 for name in OURS_GROUPS)
    peer_total = peer.get("peer_total_cpu_us_per_request") or 0.0
    ratio = our["done_per_s"] / peer["done_per_s"] if peer.get("done_per_s") and our.get("done_per_s") else None
    return {
        "done_per_s": {"ours": our.get("done_per_s"), "peer": peer.get("done_per_s"),
                       "ratio": None if ratio is None else round(ratio, 2)},
        "cpu_us_per_done": {"ours": round(our_total, 1), "peer": round(peer_total, 1),
                            "ratio_peer_to_ours": round(peer_total / our_total, 2) if our_total else None},
        "time_to_done_first_try_ms": {"ours": [our.get("time_to_done_p50_ms"), our.get("time_to_done_p99_ms")],
                                      "peer": [peer.get("time_to_done_p50_ms"), peer.get("time_to_done_p99_ms")]},
        "double_paid": {"ours": our.get("double_paid"), "peer": peer.get("double_paid")},
        "lost": {"ours": our.get("lost"), "peer": peer.get("lost")},
        "target_done_per_s_ratio_at_least_4": ratio is not None and ratio >= 4.0,
    }  # fmt: skip


def parse_settings(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peer_procrastinate", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=e2e.REQUESTS_DEFAULT)
    parser.add_argument("--batch-size", type=int, default=100, help="items per POST (as bench.e2e)")
    parser.add_argument("--in-flight", type=int, default=4, help="batches in flight (as bench.e2e)")
    parser.add_argument("--rate", type=float, default=0.0, help="items/s to submit at (0: as fast as answered)")
    parser.add_argument("--error-rate", type=float, default=0.2, help="each stand-in's 503 rate, every attempt")
    parser.add_argument("--retry-ms", type=int, default=200, help="the wait before every retry (+10%% jitter)")
    parser.add_argument("--attempts-max", type=int, default=20, help="attempts before a job fails")
    parser.add_argument(
        "--workers", type=int, default=2, help="procrastinate worker processes (as bench.e2e's workers)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="jobs each worker runs at once")
    parser.add_argument("--stall-timeout-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1, help="the stand-ins' fault generators")
    parser.add_argument("--no-standby", dest="standby", action="store_false",
                        help="one PostgreSQL, no synchronous standby (an ack is then one fsync)")  # fmt: skip
    parser.add_argument("--side-by-side", action="store_true",
                        help="then run bench.e2e --no-reconcile with the same load and report both")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, databases)")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args(argv)
    if min(args.requests, args.in_flight, args.workers, args.concurrency, args.retry_ms, args.attempts_max) < 1:
        parser.error("--requests, --in-flight, --workers, --concurrency, --retry-ms, --attempts-max must be positive")
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be in 1..1000")
    if not 0.0 <= args.error_rate <= 1.0 or args.rate < 0:
        parser.error("--error-rate must be in 0..1 and --rate not negative")
    settings = Settings(
        requests=args.requests, batch_size=args.batch_size, in_flight=args.in_flight, rate_per_s=args.rate,
        error_rate=args.error_rate, retry_ms=args.retry_ms, attempts_max=args.attempts_max, workers=args.workers,
        concurrency=args.concurrency, stall_timeout_s=args.stall_timeout_s, seed=args.seed, standby=args.standby,
    )  # fmt: skip
    return settings, args


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_settings(argv)
    os.chdir(Path(__file__).resolve().parents[1])  # the children must run this checkout
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime())}
    load_before = os.getloadavg()
    errors = run_in_directory("bench.peer_procrastinate", keep=args.keep, body=lambda root: run(settings, root, result))
    if errors:
        result["errors"] = errors
    result["settings"] = {
        "requests": settings.requests, "batch_size": settings.batch_size, "in_flight": settings.in_flight,
        "rate_per_s": settings.rate_per_s or None, "mix": {kind.value: weight for kind, weight in load.MIX_DEFAULT},
        "error_rate": settings.error_rate, "retry_ms": settings.retry_ms, "attempts_max": settings.attempts_max,
        "workers": settings.workers, "concurrency": settings.concurrency, "seed": settings.seed,
        "queue": "PostgreSQL 18, fsync on, " + ("a synchronous streaming standby" if settings.standby else "no standby"),
    }  # fmt: skip
    result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["machine"] = e2e.describe_machine()
    result["code"] = code_revision()
    output: dict[str, Any] = result
    if args.side_by_side:
        our = ours(settings)
        errors += [f"bench.e2e: {message}" for message in our.get("errors", [])]
        output = {"peer": result, "ours": our, "comparison": compare(result, our) if not errors else None}
    print(json.dumps(output) if args.json else json.dumps(output, indent=2))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
