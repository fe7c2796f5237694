"""End-to-end benchmark: failed requests in through the API, done through the workers and stand-ins.

    python -m bench.e2e --json                        # 5,000 requests; about a minute
    python -m bench.e2e --requests 1000 --json        # a smoke run
    python -m bench.e2e --profile var/profiles --json # py-spy on worker 1 through the window
    python -m bench.e2e --sets 3 --json               # a control set and 3 sets (bench/e2e_sets.py)
    python -m bench.e2e --compare-sets 1,3 --json     # both, one after the other, and the CPU ratio
    python -m bench.e2e --compare-sets 1,3 --compare-rounds 2 --json   # 1,3 then 3,1: the ratio of the means

Starts, in a temporary directory: an embedded PostgreSQL (the stand-ins' ledgers), the 3-node
store (`--machine queues.replicated:machine_factory`, fsync on), a producer token whose quota
never holds, a short retry policy for every kind (`--retry-ms`, the same wait before each retry),
the stand-ins (`compensator standins`: payment system, red-packet service, callback receiver),
`--workers` workers (`compensator worker`, configured as `make run` configures them: the
handlers' base URLs, one callback target and its secret in a file), the ledger projector
(`compensator project`, into the stand-ins' database, as `make run` does) and the API
(`compensator api`). Every child runs this checkout's code and gets no COMPENSATOR_* setting of the caller's.

Failures: every stand-in answers 503 to a request at random with probability `--error-rate`
(its `error_rate` fault, seeded), so about that fraction of first attempts fail, and retries fail
at the same rate. The stand-ins cannot fail exactly the first attempt of chosen requests.

The payment system: `--payment-guarantee dedup` (the default) starts the payment stand-in as it
ships, deduplicating on the transfer id, and declares it `dedup`; `expiry` starts it with
`--payment-dedup off --payment-expiry enforce` and declares it `expiry`; `none` with
`--payment-dedup off --payment-expiry ignore`, declared `none` with an in-flight horizon of
`--in-flight-horizon-s` (5 s: a bench, not a recommendation). Without deduplication every payment
is a row of its own, so `double_paid` reads what the workers did, not what the stand-in forgave.
A 503 may have been applied, so after one a transfer waits out its request's deadline (`expiry`:
`--payment-attempt-timeout-s`, the gateway's attempt timeout, 10 s as shipped) or is looked up
twice and parked (`none`: `parked_unknown_outcome`, dead letters for finance, not `lost`).

The load: `--requests` requests (seven transfers, two receive-list updates and one callback in
every ten), POSTed to `/v1/requests:batch` in batches of `--batch-size`, `--in-flight` batches at
a time, as fast as the API answers or paced at `--rate` items/s. The window runs from the first
POST until no request is left delayed, ready or leased (or none ended for `--stall-timeout-s`).
Then the store's views (created and terminal times, attempts) and the ledgers in PostgreSQL are
read back:

- done_per_s: done requests / (first POST to the last ack, on the wall clock);
- time_to_done_p50_ms / p99: intake (the store's `created_ms`) to the ack (`terminal_ms`) of the
  requests whose first attempt succeeded; `time_to_done_retried` for the others; `waited`
  (intake to the first lease) and `handled` (the last lease to the ack) split it;
- lost: requests answered 201 (or 200, a replay) that are not done (nor parked as unknown_outcome,
  with `none`); double_paid: transfer ids with more than one row in `payment_transfers`, plus rows
  for ids never requested; every done request must have left its effect (`done_without_effect`),
  and no parked transfer may have been paid (`parked_but_paid`);
- CPU per done request of the API, the nodes, the workers, the stand-ins, PostgreSQL and this
  process (the load client), from /proc, from the first POST to the last poll that saw a request
  end; the leader's log entries and fsyncs per done request; the workers' own metrics (handler
  times, attempts), the breakers they opened, and the stand-ins' counts;
- ledger: once the projector has every event, the compensation ledger's request count beside the
  store's, and the projector's per-event lag p50/p99 through the run (its histogram);
- reconcile: `compensator reconcile` for today on the run's three ledgers as the run left them
  (`reconcile.run`: its count per class); then four breaks planted into the stand-ins' ledgers (a
  grant paid twice, one paid the wrong amount, one never paid, a payout of no grant) and the
  reconciliation again (`reconcile.planted`: its counts, and whether each planted break was
  reported under its class). `--no-reconcile` skips both.

The command exits 1 when a request is lost, a transfer paid twice, a done request left no effect,
the ledger does not match the store, the reconciliation of the run finds a transfer paid twice or
a compensation done without a payment, the second one misses a planted break, or the run could not
finish. Every process and the directory are removed on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import secrets
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx

from api.tokens import new_token
from bench import e2e_figures as figures
from bench import e2e_load as load
from bench import e2e_reconcile as reconciliation
from bench import e2e_sets as sets_figures
from bench.e2e_store import RunStore, StoreReader, progress_between, summed
from bench.harness import (
    PRODUCER,
    BenchError,
    Profiler,
    Server,
    api_server,
    callback_targets,
    child_environment,
    code_revision,
    compensator_command,
    machine_busy_cpu_s,
    py_spy,
    run_in_directory,
    trees_cpu_s,
)
from delay.policy import RetryPolicy
from ledger import pg
from ledger.request_ids import RequestId
from queues import MessageView
from raft_store.testing.processes import free_ports

REQUESTS_DEFAULT: Final = 5_000
"""About a minute on the 2-core machine at today's rate (70-115 done/s); 20,000 takes about four."""
CALLBACK_TARGET: Final = "e2e-merchant"
WORKER_READY: Final = "running; SIGTERM drains it"
"""What `compensator worker` prints once it leases."""
POLL_S: Final = 0.2
PENDING_STATES: Final = frozenset({"delayed", "ready", "leased"})
TARGETS: Final = {"done_per_s": 2000.0, "time_to_done_p99_ms": 1000.0}
PROFILED: Final = ("worker", "api", "standins")
BREAKER_OPENS: Final = re.compile(r"breaker (\S+) opens")


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
    api_workers: int
    stall_timeout_s: float
    seed: int
    profile_dir: Path | None
    profile_format: str
    profile_process: str
    breaker: str
    reconcile: bool = True
    payment_guarantee: str = "dedup"
    in_flight_horizon_s: float = 5.0
    payment_attempt_timeout_s: float | None = None
    """The payment gateway's attempt timeout: a request's deadline under `expiry` (None: as shipped)."""
    sets: int = 1
    """Sets of three nodes; more than one adds a control set (bench/e2e_store.py)."""
    hosted: bool = True  # several sets: three hosts of node i of every set, as `run --sets` (False: a process each)


# ---- the processes ---------------------------------------------------------------------------------
@dataclass
class Stack:
    """Every process of one run, stopped in the reverse order of their start by `close`."""

    root: Path
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    store: RunStore | None = None
    postgres: pg.EmbeddedPostgres | None = None
    standins: Server | None = None
    workers: list[Server] = field(default_factory=list)
    api: Server | None = None
    token: str = ""
    api_url: str = ""
    standin_urls: dict[str, str] = field(default_factory=dict)
    metrics_urls: list[str] = field(default_factory=list)
    """Each worker's Prometheus page."""
    projectors: list[Server] = field(default_factory=list)
    """One for every set, as `compensator run --sets N` has."""
    projector_metrics_urls: list[str] = field(default_factory=list)
    nodes_idle_cores: float = 0.0

    def close(self) -> None:
        while self.cleanups:
            with suppress(Exception):
                self.cleanups.pop()()

    def start(self, settings: Settings) -> None:
        self.start_postgres()
        store = self.store = RunStore(self.root, settings.sets, hosted=settings.hosted)
        self.cleanups.append(store.stop_all)
        store.start()
        self.token = new_token()
        policy = RetryPolicy(tiers_ms=(settings.retry_ms,), tier_jitter_ratio=0.1, attempts_max=settings.attempts_max)
        asyncio.run(store.configure(self.token, policy, reason="bench/e2e.py: short retries"))
        secrets_file = self.write_secrets()
        self.start_standins(settings, secrets_file)
        ports = iter(free_ports(settings.workers + 2))  # together: one at a time may repeat
        self.start_projector(next(ports))
        for number in range(1, settings.workers + 1):  # each leases from every set; their own set in turn
            metrics_port = next(ports)
            self.metrics_urls.append(f"http://127.0.0.1:{metrics_port}/metrics")
            worker = worker_server(store.settings((number - 1) % settings.sets + 1), self.root, number, self.standin_urls, secrets_file,
                                   breaker=settings.breaker, metrics_port=metrics_port, payment=payment_settings(settings))  # fmt: skip
            self.cleanups.append(worker.stop)
            self.workers.append(worker)
            worker.start()
        for worker in self.workers:
            worker.wait_line(WORKER_READY)
        api = self.api = api_server(store.home, self.root, port=(port := next(ports)), workers=settings.api_workers, extra_env={"COMPENSATOR_HANDLERS__CALLBACK": callback_targets(self.standin_urls["callback"], CALLBACK_TARGET), **store.control_settings()})
        self.cleanups.append(api.stop)
        api.start()
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_ready(f"{self.api_url}/readyz")
        self.nodes_idle_cores = store.idle_node_cores()

    def start_postgres(self) -> None:
        folder = self.root / "pg"  # a folder of its own: as root, PostgreSQL runs as another user
        folder.mkdir()
        postgres = self.postgres = pg.EmbeddedPostgres(folder / "data")
        self.cleanups.append(postgres.stop)
        pg.wait_until_accepting(postgres.start())

    def start_projector(self, metrics_port: int) -> None:
        """One `compensator project` for every set (the control set's table), writing into the stand-ins'
        database as `make run` does: the run ends with the three ledgers the reconciliation reads."""
        assert self.postgres is not None and self.store is not None
        self.projector_metrics_urls.append(f"http://127.0.0.1:{metrics_port}/metrics")
        env = child_environment(**self.store.settings(1), COMPENSATOR_PG_DSN=self.postgres.dsn,
                                COMPENSATOR_PROJECTOR__METRICS_PORT=str(metrics_port))  # fmt: skip
        projector = Server("compensator project", [*compensator_command(), "project", "--id", "e2e"], env,
                           self.root / "projector.log")  # fmt: skip
        self.projectors.append(projector)
        self.cleanups.append(projector.stop)
        projector.start()

    def write_secrets(self) -> Path:
        """The callback target's secret, shared by the receiver and the workers as `make run` does."""
        path = self.root / "callback-secrets.json"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({CALLBACK_TARGET: secrets.token_urlsafe(32)}, handle)
        return path

    def start_standins(self, settings: Settings, secrets_file: Path) -> None:
        assert self.postgres is not None
        ports = dict(zip(("payment", "red_packet", "callback"), free_ports(3), strict=True))
        command = [
            *compensator_command(), "standins", "--payment-port", str(ports["payment"]),
            "--red-packet-port", str(ports["red_packet"]), "--callback-port", str(ports["callback"]),
            "--pg-dsn", self.postgres.dsn, "--secrets-file", str(secrets_file), "--seed", str(settings.seed),
            *PAYMENT_MODES[settings.payment_guarantee],
        ]  # fmt: skip
        standins = self.standins = Server("compensator standins", command, child_environment(),
                                          self.root / "standins.log")  # fmt: skip
        self.cleanups.append(standins.stop)
        standins.start()
        self.standin_urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        for number, url in enumerate(self.standin_urls.values()):
            standins.wait_ready(f"{url}/_faults")
            faults = {"error_rate": settings.error_rate, "seed": settings.seed + number}
            answer = httpx.put(f"{url}/_faults", json=faults, timeout=10.0)
            if answer.status_code != 200:
                raise BenchError(f"{url}/_faults refused {faults}: {answer.status_code} {answer.text[:200]}")

    def breaker_trips(self) -> dict[str, int]:
        """Breakers the workers opened, by downstream (their logs say "breaker <downstream> opens")."""
        trips: dict[str, int] = {}
        for worker in self.workers:
            for found in BREAKER_OPENS.finditer(worker.log_path.read_text(errors="replace")):
                trips[found[1]] = trips.get(found[1], 0) + 1
        return trips

    def postmaster_pid(self) -> int:
        assert self.postgres is not None
        return int((self.postgres.data_dir / "postmaster.pid").read_text().split()[0])

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far by process group (whole trees), this process's and the machine's."""
        assert self.api is not None and self.standins is not None and self.store is not None
        trees = trees_cpu_s({
            "api": [self.api.pid], "workers": [w.pid for w in self.workers], "standins": [self.standins.pid],
            "postgres": [self.postmaster_pid()], "projectors": [p.pid for p in self.projectors],
        })  # fmt: skip
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {**trees, "nodes": self.store.node_cpu_s(), "bench_client": own.ru_utime + own.ru_stime,
                "machine_busy": machine_busy_cpu_s()}  # fmt: skip


PAYMENT_MODES: Final = {
    "dedup": (),
    "expiry": ("--payment-dedup", "off", "--payment-expiry", "enforce"),
    "none": ("--payment-dedup", "off", "--payment-expiry", "ignore"),
}
"""The payment stand-in's flags for each guarantee the workers declare."""


def payment_settings(settings: Settings) -> dict[str, Any]:
    """`handlers.payment` beside its base URL: the declared guarantee and its bounds."""
    found: dict[str, Any] = {"guarantee": settings.payment_guarantee}
    if settings.payment_guarantee == "none":
        found["in_flight_horizon_s"] = settings.in_flight_horizon_s
    if settings.payment_attempt_timeout_s is not None:
        found["gateway"] = {"attempt_timeout_s": settings.payment_attempt_timeout_s,
                            "read_timeout_s": min(5.0, settings.payment_attempt_timeout_s)}  # fmt: skip
    return found


def worker_server(
    store_settings: dict[str, str], root: Path, number: int, urls: dict[str, str], secrets_file: Path, *, breaker: str,
    metrics_port: int, payment: dict[str, Any] | None = None,
) -> Server:  # fmt: skip
    """`compensator worker` with the settings compensator/commands/run.py gives `make run`'s workers;
    `breaker` "off" makes the breakers trip only when every attempt of their window failed;
    `payment`: what the payment system is declared to guarantee (`payment_settings`)."""
    env = child_environment(
        **store_settings,
        COMPENSATOR_HANDLERS__PAYMENT=json.dumps({"base_url": urls["payment"], **(payment or {})}),
        COMPENSATOR_HANDLERS__RED_PACKET=json.dumps({"base_url": urls["red_packet"]}),
        COMPENSATOR_HANDLERS__CALLBACK=callback_targets(urls["callback"], CALLBACK_TARGET),
        COMPENSATOR_WORKER__CALLBACK_SECRETS_FILE=str(secrets_file),
        COMPENSATOR_WORKER__METRICS_PORT=str(metrics_port),
        **({"COMPENSATOR_WORKER__BREAKER_FAILURE_RATIO": "1.0"} if breaker == "off" else {}),
    )
    command = [*compensator_command(), "worker", "--id", f"e2e-worker-{number}"]
    return Server(f"worker {number}", command, env, root / f"worker{number}.log")


# ---- the measured window -----------------------------------------------------------------------------
@dataclass
class Window:
    posted: load.Posted = field(default_factory=load.Posted)
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds by process group from the first POST to the last poll that saw a request end."""
    cpu_wall_s: float = 0.0
    leader_by_set: dict[int, dict[str, float]] = field(default_factory=dict)
    """Each set's leader's log entries, applied commands, fsyncs and stale reads over the window."""
    settled: bool = False
    backlog_max: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    profile: dict[str, Any] | None = None


async def measure(stack: Stack, settings: Settings, planned: list[load.Planned]) -> Window:
    """POST everything, and wait until nothing is left to do (or nothing moved for `stall_timeout_s`)."""
    batches = load.batch_bodies(planned, settings.batch_size)
    window = Window()
    limits = httpx.Limits(max_connections=settings.in_flight, max_keepalive_connections=settings.in_flight)
    assert stack.store is not None
    reader = stack.store.reader()
    profiler = profiler_for(stack, settings)
    async with httpx.AsyncClient(base_url=stack.api_url, limits=limits, timeout=load.POST_TIMEOUT_S) as http:
        client = load.Client(http=http, token=stack.token, rate_per_s=settings.rate_per_s, in_flight=settings.in_flight)
        leader_before = await reader.leader_progress()
        before, started_s = stack.cpu_s(), time.monotonic()
        if profiler is not None:
            profiler.start()
        try:
            await load.post_all(client, batches, window.posted)
            after, ended_s = await settle(reader, window, settings.stall_timeout_s, stack.cpu_s)
            leader_after = await reader.leader_progress()
        finally:
            await reader.close()
    window.leader_by_set = progress_between(leader_before, leader_after)
    window.cpu_s = {name: after[name] - before[name] for name in before}
    window.cpu_wall_s = ended_s - started_s
    if profiler is not None:
        window.profile = profiler.finish()
    return window


async def settle(
    reader: StoreReader, window: Window, stall_s: float, cpu_s: Callable[[], dict[str, float]]
) -> tuple[dict[str, float], float]:
    """Until nothing is delayed, ready or leased, or nothing has ended for `stall_s`. Returns the
    CPU reading and the time of the last poll that saw a request end: a stall's idle seconds are
    not charged to the requests."""
    ended, progress = -1, (cpu_s(), time.monotonic())
    while True:
        counts = await reader.counts()
        pending = sum(n for (_, state), n in counts.items() if state in PENDING_STATES)
        window.backlog_max = max(window.backlog_max, pending)
        window.counts = {f"{kind}/{state}": n for (kind, state), n in sorted(counts.items())}
        now_ended = sum(counts.values()) - pending
        if now_ended != ended:
            ended, progress = now_ended, (cpu_s(), time.monotonic())
        if pending == 0:
            window.settled = True
            return progress
        if time.monotonic() - progress[1] > stall_s:
            return progress
        await asyncio.sleep(POLL_S)


def profiler_for(stack: Stack, settings: Settings) -> Profiler | None:
    executable = py_spy()
    if settings.profile_dir is None or executable is None:
        return None
    server = {"worker": stack.workers[0], "api": stack.api, "standins": stack.standins}[settings.profile_process]
    assert server is not None
    suffix = {"flamegraph": ".svg", "speedscope": ".json", "raw": ".txt"}[settings.profile_format]
    output = settings.profile_dir / f"e2e-{settings.profile_process}-{time.strftime('%Y%m%dT%H%M%S')}{suffix}"
    note = f"py-spy sampled {server.name} (and its subprocesses) from the first POST to the last done"
    profiler = Profiler(executable, output, settings.profile_format, server.pid, None, note=note)
    stack.cleanups.append(profiler.stop)
    return profiler


# ---- reading back ----------------------------------------------------------------------------------
async def read_ledgers(dsn: str) -> figures.Ledgers:
    connection = await asyncpg.connect(dsn)
    try:
        transfers = await connection.fetch("SELECT transfer_id, count(*) AS n FROM payment_transfers GROUP BY 1")
        versions = await connection.fetch(
            "SELECT red_packet_id || '/' || receiver || '/' || version AS entry, count(*) AS n"
            " FROM red_packet_versions GROUP BY 1"
        )
        deliveries = await connection.fetch(
            "SELECT idempotency_key, count AS n FROM callback_deliveries WHERE target = $1", CALLBACK_TARGET
        )
    finally:
        await connection.close()
    return figures.Ledgers(
        payment_transfers={r["transfer_id"]: int(r["n"]) for r in transfers},
        red_packet_versions={r["entry"]: int(r["n"]) for r in versions},
        callback_deliveries={r["idempotency_key"]: int(r["n"]) for r in deliveries},
    )


async def ledger_caught_up(stack: Stack, timeout_s: float = 120.0) -> dict[str, Any]:
    """Once the projector has every event: the ledger's request count beside the store's, the lag over
    the run (its histogram, p50/p99 within buckets), its transactions (rounds) and sets' batches."""
    assert stack.store is not None and stack.postgres is not None
    reader = stack.store.reader()
    try:
        last, counts = await reader.last_events(), await reader.counts()
    finally:
        await reader.close()
    connection = await asyncpg.connect(stack.postgres.dsn)
    try:
        deadline, cursors = time.monotonic() + timeout_s, dict.fromkeys(last, 0)
        while time.monotonic() < deadline and any(cursors[k] < last[k] for k in last):
            rows = await connection.fetch("SELECT set_id, last_seq FROM projector_cursors")
            cursors.update({int(r["set_id"]): int(r["last_seq"]) for r in rows if int(r["set_id"]) in cursors})
            await asyncio.sleep(0.2)
        ledger_requests = await connection.fetchval("SELECT count(*) FROM compensation_requests")
    finally:
        await connection.close()
    pages = scrape(stack.projector_metrics_urls)
    buckets = figures.histogram(pages, "compensator_projector_event_lag_seconds")
    return {
        **{key: figures.counter(pages, f"compensator_projector_{key}_total") for key in ("rounds", "batches")},
        "events": sum(last.values()), "projected": sum(min(cursors[k], last[k]) for k in last), "ledger_requests": ledger_requests,
        "store_requests": sum(counts.values()), "lag_p50_s": figures.histogram_quantile(buckets, 0.5),
        "lag_p99_s": figures.histogram_quantile(buckets, 0.99),
    }


def scrape(urls: list[str]) -> list[str]:
    pages = []
    for url in urls:
        with suppress(httpx.HTTPError):
            pages.append(httpx.get(url, timeout=10.0).text)
    return pages


def standin_stats(urls: dict[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, url in urls.items():
        try:
            stats = httpx.get(f"{url}/_stats", timeout=10.0).json()
        except (httpx.HTTPError, ValueError) as error:
            found[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        found[name] = {key: stats.get(key) for key in ("requests", "applied", "repeats", "by_outcome")}
    return found


# ---- the figures -----------------------------------------------------------------------------------
def summarize(
    window: Window, views: dict[RequestId, MessageView], ledgers: figures.Ledgers, settings: Settings
) -> dict[str, Any]:
    posted = window.posted
    done = [v for v in views.values() if v.state.value == figures.DONE and v.terminal_ms is not None]
    last_done_ms = max((v.terminal_ms or 0 for v in done), default=posted.first_post_ms)
    window_s = (last_done_ms - posted.first_post_ms) / 1000
    timings = figures.timings(views.values())
    first_try = figures.spread_ms(timings.first_try)
    intake_s = (posted.last_answer_ms - posted.first_post_ms) / 1000
    cpu = figures.cpu_per_request(window.cpu_s, len(done), window.cpu_wall_s)
    total_us = cpu["cpu_us_per_request"]["total"]
    outcomes = figures.outcomes(posted.acknowledged, views)
    return {
        "done_per_s": round(len(done) / window_s, 1) if window_s > 0 else 0.0,
        "time_to_done_p50_ms": first_try["p50_ms"], "time_to_done_p99_ms": first_try["p99_ms"],
        "time_to_done_first_try": first_try,
        "time_to_done_retried": figures.spread_ms(timings.retried),
        "waited_intake_to_first_lease": figures.spread_ms(timings.waited),
        "handled_last_lease_to_ack": figures.spread_ms(timings.handled),
        "double_paid": None, "lost": outcomes["lost"],  # early in the JSON; the values follow
        **outcomes,
        **figures.effects(posted.acknowledged, views, ledgers, store_key_prefix=f"{PRODUCER}:"),
        "requests": settings.requests, "acknowledged": len(posted.acknowledged), "done": len(done),
        "window_s": round(window_s, 2), "settled": window.settled, "backlog_max": window.backlog_max,
        "posted_per_s": round(len(posted.acknowledged) / intake_s, 1) if intake_s > 0 else None,
        "post": {"batch_p50_ms": figures.ms(figures.percentile(posted.batch_latencies_s, 0.5)),
                 "batch_p99_ms": figures.ms(figures.percentile(posted.batch_latencies_s, 0.99)),
                 "replays": posted.replays, "retried_items": posted.retried_items,
                 "retried_batches": posted.retried_batches, "refused": posted.refused,
                 **({"first_refusal": posted.first_refusal} if posted.first_refusal else {})},
        **cpu,
        "cpu_ceiling_per_s": round((os.cpu_count() or 1) * 1e6 / total_us) if total_us else None,
        "store_per_done": {f"leader_{name}": round(n / len(done), 2) if done else None
                           for name, n in summed(window.leader_by_set).items()},
        "store_counts": window.counts,
        "per_set": sets_figures.per_set(posted.acknowledged, views, window.leader_by_set),
    }  # fmt: skip


def checks(result: dict[str, Any], window: Window) -> list[str]:
    """What must hold whatever the speed; each failure is one line."""
    problems = []
    if not window.settled:
        problems.append(f"no request ended for --stall-timeout-s; still pending: {window.counts}")
    if result["lost"]:
        problems.append(f"{result['lost']} acknowledged requests are not done: {result['states']}")
    if result["double_paid"]:
        problems.append(f"{result['double_paid']} transfers paid twice or never requested")
    if result["parked_but_paid"]:
        problems.append(f"{result['parked_but_paid']} transfers parked as unknown_outcome were paid")
    if any(result["done_without_effect"].values()):
        problems.append(f"done without an effect downstream: {result['done_without_effect']}")
    if result["list_versions_applied_twice"] or result["list_versions_unrequested"]:
        problems.append("receive-list versions applied twice or never requested")
    reconciled = result.get("reconcile")
    if reconciled is not None:
        run, planted = reconciled["run"], reconciled["planted"]
        counts = run.get("counts", {})
        if run.get("error") or counts.get("duplicate_payout") or counts.get("compensated_not_in_payment"):
            problems.append(f"the reconciliation of the run found what a correct run cannot produce: {run}")
        if planted.get("error") or not all(planted.get("planted_found", {}).values()):
            problems.append(f"the reconciliation missed a planted break: {planted}")
    ledger = result.get("ledger")
    if ledger is not None and (ledger["projected"] < ledger["events"] or ledger["ledger_requests"] != ledger["store_requests"]):
        problems.append(f"the compensation ledger does not match the store: {ledger}")
    return problems


def targets_met(result: dict[str, Any]) -> dict[str, bool]:
    p99 = result.get("time_to_done_p99_ms")
    return {
        "done_per_s >= 2000": result.get("done_per_s", 0.0) >= TARGETS["done_per_s"],
        "time_to_done_p99_ms < 1000": p99 is not None and p99 < TARGETS["time_to_done_p99_ms"],
    }


# ---- command ---------------------------------------------------------------------------------------
def run(settings: Settings, root: Path, result: dict[str, Any]) -> list[str]:
    stack = Stack(root)
    try:
        stack.start(settings)
        nonce = secrets.token_hex(3)
        planned = [load.submission(i, nonce=nonce, mix=load.MIX_DEFAULT, callback_target=CALLBACK_TARGET)
                   for i in range(settings.requests)]  # fmt: skip
        window = asyncio.run(measure(stack, settings, planned))
        views = sets_figures.read_views(stack.store, window.posted.acknowledged)
        assert stack.postgres is not None
        ledgers = asyncio.run(read_ledgers(stack.postgres.dsn))
        result.update(summarize(window, views, ledgers, settings))
        result["nodes_idle"] = sets_figures.idle(stack.nodes_idle_cores, result.get("done_per_s"))
        result["breaker_trips"] = stack.breaker_trips()
        result["worker_metrics"] = figures.worker_metrics(scrape(stack.metrics_urls))
        result["standins"] = standin_stats(stack.standin_urls)
        result["ledger"] = asyncio.run(ledger_caught_up(stack))
        if settings.reconcile:
            dsn, output = stack.postgres.dsn, stack.root / "reconcile"
            run = reconciliation.reconcile_today(dsn, output / "run", {})
            planted = asyncio.run(reconciliation.plant_breaks(dsn))
            result["reconcile"] = {"run": run, "planted": reconciliation.reconcile_today(dsn, output / "planted", planted)}
        if window.profile is not None:
            result["profile"] = window.profile
        return checks(result, window)
    finally:
        stack.close()


def describe_machine() -> str:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{platform.machine()} {os.cpu_count()} cores, {memory_gib:.0f} GiB, Python {platform.python_version()}"


def parse_settings(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=REQUESTS_DEFAULT)
    parser.add_argument("--batch-size", type=int, default=100, help="items per POST /v1/requests:batch")
    parser.add_argument("--in-flight", type=int, default=4, help="batches in flight")
    parser.add_argument("--rate", type=float, default=0.0, help="items/s to submit at (0: as fast as answered)")
    parser.add_argument("--error-rate", type=float, default=0.2, help="each stand-in's 503 rate, every attempt")
    parser.add_argument("--retry-ms", type=int, default=200, help="the wait before every retry (+10%% jitter)")
    parser.add_argument("--attempts-max", type=int, default=20, help="attempts before a request is dead")
    parser.add_argument("--workers", type=int, default=2, help="compensator worker processes")
    parser.add_argument("--api-workers", type=int, default=1, help="uvicorn workers of the API")
    parser.add_argument("--stall-timeout-s", type=float, default=30.0, help="give up when nothing ends for this long")
    parser.add_argument("--breaker", choices=("shipped", "off"), default="shipped",
                        help="the workers' breakers as shipped, or tripping only when every attempt failed")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="the stand-ins' fault generators")
    parser.add_argument("--payment-guarantee", choices=tuple(PAYMENT_MODES), default="dedup",
                        help="what the payment system guarantees (the stand-in started to match)")  # fmt: skip
    parser.add_argument("--in-flight-horizon-s", type=float, default=5.0,
                        help="--payment-guarantee none: the in-flight horizon the workers assume")  # fmt: skip
    parser.add_argument("--payment-attempt-timeout-s", type=float, metavar="S",
                        help="the payment gateway's attempt timeout (a request's deadline under expiry; default as shipped)")  # fmt: skip
    parser.add_argument("--no-reconcile", dest="reconcile", action="store_false", help="skip the closing reconciliation (Spark)")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy through the window")
    parser.add_argument("--profile-process", choices=PROFILED, default="worker", help="worker: the first worker")
    parser.add_argument("--profile-format", choices=("flamegraph", "speedscope", "raw"), default="flamegraph")
    sets_figures.add_arguments(parser)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, store, ledgers)")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args(argv)
    if min(args.requests, args.in_flight, args.workers, args.api_workers, args.retry_ms, args.attempts_max) < 1:
        parser.error("--requests, --in-flight, --workers, --api-workers, --retry-ms, --attempts-max must be positive")
    sets_figures.check_arguments(parser, args)
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be in 1..1000 (the API's limit)")
    if args.payment_attempt_timeout_s is not None and not 1.0 <= args.payment_attempt_timeout_s <= 120.0:
        parser.error("--payment-attempt-timeout-s must be in 1..120")
    if not 0.0 < args.in_flight_horizon_s <= 3600.0:
        parser.error("--in-flight-horizon-s must be in (0, 3600]")
    if not 0.0 <= args.error_rate <= 1.0 or args.rate < 0:
        parser.error("--error-rate must be in 0..1 and --rate not negative")
    return Settings(
        requests=args.requests, batch_size=args.batch_size, in_flight=args.in_flight, rate_per_s=args.rate,
        error_rate=args.error_rate, retry_ms=args.retry_ms, attempts_max=args.attempts_max, workers=args.workers,
        api_workers=args.api_workers, stall_timeout_s=args.stall_timeout_s, seed=args.seed,
        profile_dir=args.profile.resolve() if args.profile else None, profile_format=args.profile_format,
        profile_process=args.profile_process, breaker=args.breaker, reconcile=args.reconcile,
        payment_guarantee=args.payment_guarantee, in_flight_horizon_s=args.in_flight_horizon_s,
        payment_attempt_timeout_s=args.payment_attempt_timeout_s, sets=args.sets, hosted=not args.process_per_replica,
    ), args  # fmt: skip


def settings_of(settings: Settings) -> dict[str, Any]:
    return {
        "batch_size": settings.batch_size, "in_flight": settings.in_flight, "rate_per_s": settings.rate_per_s or None,
        "mix": {kind.value: weight for kind, weight in load.MIX_DEFAULT},
        "failure_injection": f"error_rate {settings.error_rate} on each stand-in (503 at random on every attempt,"
                             " seeded); not exactly the first attempt of chosen requests",
        "retry_policy": {"tiers_ms": [settings.retry_ms], "tier_jitter_ratio": 0.1, "attempts_max": settings.attempts_max},
        "breaker": settings.breaker, "workers": settings.workers, "api_workers": settings.api_workers, "sets": settings.sets,
        "nodes": 3 * settings.sets + (3 if settings.sets > 1 else 0), "fsync": True,
        "payment_guarantee": settings.payment_guarantee, "payment_modes": " ".join(PAYMENT_MODES[settings.payment_guarantee]) or "dedup on",
        "payment": payment_settings(settings),
        "seed": settings.seed,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_settings(argv)
    if args.compare_sets:
        return sets_figures.compare(settings, args, run_one)
    result, errors = run_one(settings, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 1 if errors else 0


def run_one(settings: Settings, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    if settings.profile_dir is not None and py_spy() is None:
        print("bench.e2e: --profile skipped: py-spy is not installed (pip install py-spy)", file=sys.stderr)
    os.chdir(Path(__file__).resolve().parents[1])  # the children must run this checkout
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime())}
    load_before = os.getloadavg()
    errors = run_in_directory("bench.e2e", keep=args.keep, body=lambda root: run(settings, root, result))
    if errors:
        result["errors"] = errors
    result.update(settings_of(settings))
    result["targets_met"] = targets_met(result)
    result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["machine"] = describe_machine()
    result["code"] = code_revision()
    return result, errors


if __name__ == "__main__":
    raise SystemExit(main())
