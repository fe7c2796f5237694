"""API benchmark: `compensator api` over a 3-node store on loopback, fsync on, loaded by wrk.

    python -m bench.api --json
    python -m bench.api --workers 2 --json
    python -m bench.api --phases single --seconds 10 --profile var/profiles --json

Starts its own store (`--machine queues.replicated:machine_factory`, the cluster bench/queue.py
uses) in a temporary directory, creates a producer token whose quota never throttles, and starts
the API with the real command (`compensator api`, configured through COMPENSATOR_* variables,
nothing else inherited from the caller's environment). Then, each phase warmed up for
`--warmup-s` and measured for `--seconds` with wrk (bench/api_load.lua, every request a new
Idempotency-Key and a `--body-bytes` JSON body, a transfer padded through its memo and the
failure text):

- single: POST /v1/requests, `--connections` in flight (wrk -t 2 -c 64).
- hello:  the same requests to a hello-world FastAPI route (bench/hello_app.py) under the API's
          uvicorn settings and worker count: the ceiling of FastAPI and uvicorn on this machine.
          `ratio` = single_per_s / hello_per_s, both from the same run.
- batch:  POST /v1/requests:batch, `--batch-size` items per request, `--batch-connections` in
          flight; items are counted as created from the 201s inside the answers.

Only 2xx answers count (and only items answered 201 in a batch); everything else is reported, and
the command fails if most requests failed. At the end the store's counts (a linearizable read)
must hold at least every request answered 201, and at most that plus what was in flight when wrk
stopped. CPU seconds of the API's processes, the three nodes and wrk are read from /proc around
each measured window, per request: robust to a noisy machine where rates are not. `--profile DIR`
records a py-spy profile of the API's processes during the measured single phase.

Child processes run this checkout's code: the current directory is the repository root and it
leads PYTHONPATH. Every process is stopped on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from api.tokens import new_token
from bench import hello_app
from bench.harness import (
    MACHINE,
    REPO_ROOT,
    BenchError,
    Profiler,
    Server,
    api_server,
    caught_up_of,
    child_environment,
    children_cpu_s,
    code_revision,
    compensator_command,
    create_producer,
    leader_progress_of,
    machine_busy_cpu_s,
    py_spy,
    terminated_as_interrupt,
    tree_cpu_s,
)
from ledger.kinds import MEMO_LENGTH_MAX
from queues import QueueClient, RaftClient
from raft_store.testing.processes import ProcessCluster, free_ports
from submission.models import SUBMISSION

LUA_SCRIPT: Final = REPO_ROOT / "bench" / "api_load.lua"
PHASES: Final = ("single", "hello", "batch")
KEY_MARKER: Final = "{{KEY}}"
KEY_PREFIX_LENGTH: Final = 8
KEY_LENGTH: Final = KEY_PREFIX_LENGTH + 2 + 10
"""bench/api_load.lua: the run's prefix, the wrk thread (2 digits), its counter (10 digits)."""
FAILURE_TEXT_LENGTH_MAX: Final = 1000
WRK_TIMEOUT_S: Final = 10
# The ratio is issue 23's: a single POST at least half the hello route's rate in the same run.
TARGETS: Final = {"single_per_s": 2500.0, "single_p99_ms": 50.0, "ratio": 0.5, "batch_items_per_s": 10_000.0}


def hello_server(root: Path, *, port: int, workers: int) -> Server:
    command = [sys.executable, "-m", "bench.hello_app", "--port", str(port), "--workers", str(workers)]
    return Server("hello app", command, child_environment(), root / "hello.log")


def api_uvicorn_settings() -> dict[str, Any]:
    """The constant keyword arguments of compensator/commands/api.py's `uvicorn.run` call."""
    tree = ast.parse((REPO_ROOT / "compensator" / "commands" / "api.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "uvicorn.run":
            return {kw.arg: kw.value.value for kw in node.keywords
                    if kw.arg and isinstance(kw.value, ast.Constant) and kw.arg != "factory"}  # fmt: skip
    raise BenchError("compensator/commands/api.py no longer calls uvicorn.run: update bench/hello_app.py")


def check_same_uvicorn_settings() -> None:
    api = api_uvicorn_settings()
    if api != hello_app.UVICORN_SETTINGS:
        raise BenchError(f"the hello app's uvicorn settings {hello_app.UVICORN_SETTINGS} differ from the API's {api}")


# ---- load ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    url: str
    mode: str
    connections: int
    threads: int
    seconds: int
    prefix: str
    template: str
    batch_size: int
    token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WrkRun:
    result: dict[str, Any]
    wall_s: float
    wrk_cpu_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds over the run, by process group (server, nodes, machine busy), when measured."""
    leader: dict[str, float] = field(default_factory=dict)
    """The store leader's log entries, applied commands and fsyncs over the run (`leader_progress`)."""

    @property
    def duration_s(self) -> float:
        return float(self.result["duration_us"]) / 1e6

    @property
    def statuses(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.result["statuses"].items()}

    @property
    def ok(self) -> int:
        return sum(n for status, n in self.statuses.items() if 200 <= status <= 299)

    @property
    def socket_errors(self) -> int:
        errors = self.result["errors"]
        return int(errors["connect"] + errors["read"] + errors["write"] + errors["timeout"])

    @property
    def items_created(self) -> int:
        return int(self.result["items"]["created"])

    @property
    def items_answered(self) -> int:
        items = self.result["items"]
        return int(items["created"] + items["replayed"] + items["other"])

    @property
    def failed(self) -> int:
        """Answers other than 2xx, and requests wrk saw fail on the socket (connect, read, write, timeout)."""
        return int(self.result["responses"]) - self.ok + self.socket_errors


def submission_template(body_bytes: int) -> str:
    """A transfer's submission with `KEY_MARKER` for the key, exactly `body_bytes` long once the
    key is in: the memo and the failure text carry the padding."""

    def document(memo: str, text: str) -> str:
        submission = {
            "kind": "transfer", "ref_key": f"rp-{KEY_MARKER}",
            "payload": {"transfer_id": f"tr-{KEY_MARKER}", "payer": "red-packet-escrow", "payee": "user-42",
                        "amount_minor": 888, "currency": "CNY", "memo": memo},
            "failure": {"error_class": "timeout", "text": text, "http_status": 504},
        }  # fmt: skip
        return json.dumps(submission, separators=(",", ":"))

    filler = "payment system did not answer within 2 s; the red packet stays pending. "
    padding = body_bytes - len(document("", "").replace(KEY_MARKER, "k" * KEY_LENGTH))
    memo_length = min(MEMO_LENGTH_MAX, max(0, padding) // 4)
    text_length = padding - memo_length
    if not 0 <= text_length <= FAILURE_TEXT_LENGTH_MAX:
        raise BenchError(f"--body-bytes {body_bytes}: one transfer's submission can be padded to about 350-1600 bytes")
    repeated = filler * (1 + (memo_length + text_length) // len(filler))
    template = document(repeated[:memo_length], repeated[:text_length])
    sample = template.replace(KEY_MARKER, "k" * KEY_LENGTH)
    assert len(sample) == body_bytes, (len(sample), body_bytes)
    SUBMISSION.validate_json(sample)  # the API would take it: a ValidationError here is the bench's bug
    return template


def run_wrk(load: Load, cpu_sources: dict[str, Callable[[], float]] | None = None,
            on_start: Callable[[], None] | None = None, settle: Callable[[], object] | None = None) -> WrkRun:  # fmt: skip
    """`settle`: called once wrk has ended; the "nodes" CPU is read after it (the followers' applies
    the window's commits left, caught_up_of), the other sources at the window's end."""
    command = [
        "wrk", "-t", str(load.threads), "-c", str(load.connections), "-d", f"{load.seconds}s",
        "--timeout", f"{WRK_TIMEOUT_S}s", "--latency", "-s", str(LUA_SCRIPT), load.url,
        "--", load.mode, load.prefix, load.template, str(load.batch_size),
    ]  # fmt: skip
    sources = cpu_sources or {}
    before = {name: read() for name, read in sources.items()}
    wrk_cpu0 = children_cpu_s()
    started = time.perf_counter()
    with subprocess.Popen(command, cwd=REPO_ROOT, env=dict(os.environ, BENCH_TOKEN=load.token),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as wrk:  # fmt: skip
        if on_start is not None:
            on_start()
        try:
            out, err = wrk.communicate(timeout=load.seconds + 60)
        finally:
            if wrk.poll() is None:
                wrk.kill()
                wrk.wait()
    wall_s = time.perf_counter() - started
    cpu_s = {name: read() - before[name] for name, read in sources.items()}
    if settle is not None:
        settle()
        if "nodes" in sources:
            cpu_s["nodes"] = sources["nodes"]() - before["nodes"]
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("WRK_RESULT ")]
    if wrk.returncode != 0 or not lines:
        raise BenchError(f"wrk exited {wrk.returncode} without a result: {err.decode(errors='replace').strip()[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("WRK_RESULT "))
    return WrkRun(result=result, wall_s=wall_s, wrk_cpu_s=children_cpu_s() - wrk_cpu0, cpu_s=cpu_s)


def check_mostly_ok(phase: str, run: WrkRun, batch_size: int) -> None:
    """Fail loudly: a rate of errors is not a throughput."""
    if phase == "batch":
        ok, total = run.items_created, run.items_answered + run.failed * batch_size
    else:
        ok, total = run.ok, run.ok + run.failed
    if ok == 0 or ok < total / 2:
        raise BenchError(
            f"{phase}: {ok} of {total} succeeded; statuses {run.result['statuses']}, wrk errors"
            f" {run.result['errors']}, first unexpected answer: {run.result['sample'][:300]!r}"
        )


# ---- profile -----------------------------------------------------------------------------------------
# ---- phases ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    phases: tuple[str, ...]
    seconds: int
    warmup_s: int
    workers: int
    connections: int
    threads: int
    batch_size: int
    batch_connections: int
    body_bytes: int
    profile_dir: Path | None
    profile_format: str


def round_ms(microseconds: float) -> float:
    return round(microseconds / 1000, 2)


def phase_summary(phase: str, run: WrkRun) -> dict[str, Any]:
    """What one measured window shows: rates from 2xx only, latency of every answer, CPU per unit
    (a request, or an item for a batch), and how busy the machine was meanwhile."""
    units = run.items_created if phase == "batch" else run.ok
    latency = run.result["latency_us"]
    ours = sum(run.cpu_s.get(name, 0.0) for name in ("server", "nodes")) + run.wrk_cpu_s
    busy = run.cpu_s.get("machine_busy", 0.0)
    summary: dict[str, Any] = {
        "per_s": round(run.ok / run.duration_s, 1),
        "p50_ms": round_ms(latency["p50"]), "p90_ms": round_ms(latency["p90"]), "p99_ms": round_ms(latency["p99"]),
        "p999_ms": round_ms(latency["p999"]), "max_ms": round_ms(latency["max"]),
        "ok": run.ok, "errors": run.failed, "statuses": run.result["statuses"], "wrk_errors": run.result["errors"],
        "seconds": round(run.duration_s, 2), "request_bytes": run.result["request_bytes"],
        "cpu_us_per_" + ("item" if phase == "batch" else "request"): {
            name: round(1e6 * seconds / units, 1) if units else None
            for name, seconds in (*((n, run.cpu_s[n]) for n in ("server", "nodes") if n in run.cpu_s),
                                  ("wrk", run.wrk_cpu_s))
        },
        "machine_busy_cores": round(busy / run.wall_s, 2),
        "other_processes_cores": round(max(0.0, busy - ours) / run.wall_s, 2),
    }  # fmt: skip
    if run.leader and units:
        # Commands per log entry: how many requests shared a frame (the client's coalescing).
        entries = run.leader.get("entries", 0.0)
        summary["store_per_" + ("item" if phase == "batch" else "request")] = {
            "leader_entries": round(entries / units, 3), "leader_fsyncs": round(run.leader.get("fsyncs", 0.0) / units, 3),
            "commands_per_entry": round(run.leader.get("commands", 0.0) / entries, 2) if entries else None,
        }  # fmt: skip
    if phase == "batch":
        summary["items_created"] = run.items_created
        summary["items_not_created"] = run.items_answered - run.items_created
        summary["items_per_s"] = round(run.items_created / run.duration_s, 1)
    if run.result["sample"]:
        summary["first_unexpected_answer"] = run.result["sample"][:300]
    return summary


@dataclass
class Bench:
    """One run: the store, the API, the phases in order, and what the store holds at the end."""

    settings: Settings
    root: Path
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    cluster: ProcessCluster | None = None
    api_url: str = ""
    api: Server | None = None
    token: str = ""
    nonce: str = field(default_factory=lambda: secrets.token_hex(3))
    template: str = ""
    runs: dict[str, list[WrkRun]] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def close(self) -> None:
        while self.cleanups:
            with suppress(Exception):
                self.cleanups.pop()()

    def start_store_and_api(self) -> None:
        cluster = self.cluster = ProcessCluster(self.root / "store", machine=MACHINE)
        self.cleanups.append(cluster.stop_all)
        cluster.start_all()
        self.token = new_token()
        asyncio.run(create_producer(cluster, self.token, reason="bench/api.py"))
        (port,) = free_ports(1)
        api = self.api = api_server(cluster, self.root, port=port, workers=self.settings.workers)
        self.cleanups.append(api.stop)
        api.start()
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_ready(f"{self.api_url}/readyz")

    def load(self, phase: str, url: str, *, warm: bool) -> Load:
        settings = self.settings
        prefix = f"{self.nonce}{phase[0]}{'w' if warm else 'm'}"
        assert len(prefix) == KEY_PREFIX_LENGTH, prefix
        batch = phase == "batch"
        return Load(
            url=url, mode="batch" if batch else "single", prefix=prefix, template=self.template, token=self.token,
            connections=settings.batch_connections if batch else settings.connections, threads=settings.threads,
            seconds=settings.warmup_s if warm else settings.seconds, batch_size=settings.batch_size,
        )  # fmt: skip

    def measure(self, phase: str, url: str, server: Server) -> tuple[WrkRun, dict[str, Any] | None]:
        """Warm up, then one measured window with CPU read around it (and py-spy, if asked)."""
        self.runs.setdefault(phase, []).append(run_wrk(self.load(phase, url, warm=True)))
        sources: dict[str, Callable[[], float]] = {"server": lambda: tree_cpu_s(server.pid),
                                                   "machine_busy": machine_busy_cpu_s}  # fmt: skip
        if self.cluster is not None:
            sources["nodes"] = self.cluster.cpu_seconds
        profiler = self.profiler(phase, server)
        leader = asyncio.run(leader_progress_of(self.cluster)) if self.cluster is not None and phase != "hello" else {}
        cluster = self.cluster
        measured = run_wrk(self.load(phase, url, warm=False), sources, on_start=profiler.start if profiler else None,
                           settle=(lambda: caught_up_of(cluster)) if cluster is not None and phase != "hello" else None)  # fmt: skip
        if leader:
            after = asyncio.run(leader_progress_of(self.cluster)) if self.cluster is not None else {}
            measured = dataclasses.replace(measured, leader={name: after[name] - leader.get(name, 0.0) for name in after})
        self.runs[phase].append(measured)
        return measured, profiler.finish() if profiler else None

    def profiler(self, phase: str, server: Server) -> Profiler | None:
        folder = self.settings.profile_dir
        executable = py_spy()
        if folder is None or phase != "single" or executable is None:
            return None
        output_format = self.settings.profile_format
        suffix = {"flamegraph": ".svg", "speedscope": ".json", "raw": ".txt"}[output_format]
        output = folder / f"api-single-w{self.settings.workers}-{time.strftime('%Y%m%dT%H%M%S')}{suffix}"
        note = "py-spy sampled the API's processes through the measured single window"
        profiler = Profiler(executable, output, output_format, server.pid, self.settings.seconds, note=note)
        self.cleanups.append(profiler.stop)
        return profiler

    def hello(self) -> tuple[WrkRun, dict[str, Any] | None]:
        check_same_uvicorn_settings()
        (port,) = free_ports(1)
        server = hello_server(self.root, port=port, workers=self.settings.workers)
        self.cleanups.append(server.stop)
        server.start()
        try:
            url = f"http://127.0.0.1:{port}{hello_app.PATH}"
            server.wait_ready(url)
            return self.measure("hello", url, server)
        finally:
            server.stop()

    def run(self) -> None:
        """Every phase, into `result`; a phase whose requests mostly failed is recorded with its
        figures and its error in `errors`, and the others still run."""
        settings = self.settings
        self.template = submission_template(settings.body_bytes)
        if {"single", "batch"} & set(settings.phases):
            self.start_store_and_api()
        result = self.result
        for phase in settings.phases:
            if phase == "hello":
                measured, profile = self.hello()
            else:
                assert self.api is not None
                path = "/v1/requests:batch" if phase == "batch" else "/v1/requests"
                measured, profile = self.measure(phase, self.api_url + path, self.api)
            summary = phase_summary(phase, measured)
            result.update({f"{phase}_{k}": summary[k] for k in ("per_s", "p50_ms", "p99_ms", "errors")})
            if phase == "batch":
                result["batch_items_per_s"] = summary["items_per_s"]
            result[phase] = summary
            if profile is not None:
                result["profile"] = profile
            try:
                check_mostly_ok(phase, measured, settings.batch_size)
            except BenchError as error:
                self.errors.append(str(error))
        if "single" in result and "hello" in result:
            result["ratio"] = round(result["single_per_s"] / result["hello_per_s"], 3)
        if self.cluster is not None:
            result["store"] = self.store_check()

    def store_check(self) -> dict[str, Any]:
        """The store must hold every request answered 201, and at most what was in flight more."""
        assert self.cluster is not None
        counts = asyncio.run(stored_counts(self.cluster))
        stored = sum(n for key, n in counts.items() if key.startswith("transfer/"))
        single, batch = self.runs.get("single", []), self.runs.get("batch", [])
        created = sum(r.statuses.get(201, 0) for r in single) + sum(r.items_created for r in batch)
        replayed = sum(r.statuses.get(200, 0) for r in single) + sum(int(r.result["items"]["replayed"]) for r in batch)
        in_flight_max = sum(self.settings.connections + r.socket_errors for r in single) + sum(
            (self.settings.batch_connections + r.socket_errors) * self.settings.batch_size for r in batch
        )
        if stored < created:
            raise BenchError(f"the API answered 201 for {created} requests but the store holds {stored}: {counts}")
        return {
            "counts": counts, "stored": stored, "answered_201": created, "answered_200_replays": replayed,
            "stored_without_201": stored - created, "stored_without_201_max": in_flight_max,
            "check": "ok" if stored - created <= in_flight_max else "more stored than answered 201 plus in flight",
        }  # fmt: skip


async def stored_counts(cluster: ProcessCluster) -> dict[str, int]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=60.0)
    try:
        counts = (await QueueClient(raft).counts()).value
    finally:
        await raft.close()
    return {f"{kind}/{state}": n for (kind, state), n in sorted(counts.items())}


# ---- command -----------------------------------------------------------------------------------------
def describe_machine() -> str:
    import fastapi
    import uvicorn

    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False).stdout.split(" [")[0]
    return (f"{platform.machine()} {os.cpu_count()} cores, {memory_gib:.0f} GiB, Python {platform.python_version()},"
            f" uvicorn {uvicorn.__version__}, FastAPI {fastapi.__version__}, {wrk}")  # fmt: skip


def parse_settings(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="measured seconds per phase")
    parser.add_argument("--warmup-s", type=int, default=2, help="warm-up seconds before each phase (not measured)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers of the API and of the hello app")
    parser.add_argument("--connections", type=int, default=64, help="in flight for single and hello")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batch-connections", type=int, default=8, help="batches in flight")
    parser.add_argument("--body-bytes", type=int, default=1024, help="one submission's JSON")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, run in this order")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy flamegraph of the API in the single phase")
    parser.add_argument(
        "--profile-format",
        choices=("flamegraph", "speedscope", "raw"),
        default="flamegraph",
        help="py-spy's output: an SVG, a speedscope JSON, or collapsed stacks (text)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (store data, logs)")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args(argv)
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases or not set(phases) <= set(PHASES) or len(set(phases)) != len(phases):
        parser.error(f"--phases: a comma-separated subset of {','.join(PHASES)}")
    if min(args.seconds, args.warmup_s, args.workers, args.connections, args.threads, args.batch_connections) < 1:
        parser.error("--seconds, --warmup-s, --workers, --connections, --threads, --batch-connections must be positive")
    if args.threads > min(args.connections, args.batch_connections):
        parser.error("--threads must not exceed --connections or --batch-connections")
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be in 1..1000 (the API's limit)")
    settings = Settings(
        phases=phases, seconds=args.seconds, warmup_s=args.warmup_s, workers=args.workers,
        connections=args.connections, threads=args.threads, batch_size=args.batch_size,
        batch_connections=args.batch_connections, body_bytes=args.body_bytes,
        profile_dir=args.profile.resolve() if args.profile else None, profile_format=args.profile_format,
    )  # fmt: skip
    return settings, args


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_settings(argv)
    if shutil.which("wrk") is None:
        print("bench.api: wrk is not installed (Debian: apt-get install wrk)", file=sys.stderr)
        return 1
    profile_note = None
    if settings.profile_dir is not None and "single" not in settings.phases:
        profile_note = "the profile is taken in the single phase, which is not run"
    elif settings.profile_dir is not None and py_spy() is None:
        profile_note = "py-spy is not installed (pip install py-spy)"
    if profile_note is not None:
        print(f"bench.api: --profile skipped: {profile_note}", file=sys.stderr)
    os.chdir(REPO_ROOT)  # `python -m` puts the current directory first: the nodes must run this checkout
    os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime())}
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="bench-api-"))
    bench = Bench(settings, root)
    code = 0
    try:
        with terminated_as_interrupt():
            bench.run()
    except BenchError as error:
        bench.errors.append(str(error))
    except KeyboardInterrupt as interrupt:
        bench.errors.append(f"interrupted ({str(interrupt) or 'SIGINT'}); every process was stopped")
    finally:
        bench.close()
        if args.keep:
            print(f"bench.api: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    result.update(bench.result)
    for message in bench.errors:
        print(f"bench.api: {message}", file=sys.stderr)
    if bench.errors:
        result["errors"] = bench.errors
        code = 1
    if profile_note is not None:
        result["profile"] = {"skipped": profile_note}
    result.update(settings_of(settings, bench))
    result["targets_met"] = targets_met(result)
    result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["machine"] = describe_machine()
    result["code"] = code_revision()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return code


def settings_of(settings: Settings, bench: Bench) -> dict[str, Any]:
    return {
        "workers": settings.workers, "duration_s": settings.seconds, "warmup_s": settings.warmup_s,
        "connections": settings.connections, "wrk_threads": settings.threads, "batch_size": settings.batch_size,
        "batch_connections": settings.batch_connections, "payload_bytes": settings.body_bytes,
        "phases": list(settings.phases),
        **({"nodes": bench.cluster.size, "fsync": True, "api_command": " ".join([*compensator_command(), "api"]),
            "api_log_level": "info (default)", "telemetry_exporter": "none (default)"} if bench.cluster else {}),
    }  # fmt: skip


def targets_met(result: dict[str, Any]) -> dict[str, bool]:
    met: dict[str, bool] = {}
    if "single_per_s" in result:
        met["single_per_s >= 2500"] = result["single_per_s"] >= TARGETS["single_per_s"]
        met["single_p99_ms < 50"] = result["single_p99_ms"] < TARGETS["single_p99_ms"]
    if "ratio" in result:
        met[f"ratio >= {TARGETS['ratio']}"] = result["ratio"] >= TARGETS["ratio"]
    if "batch_items_per_s" in result:
        met["batch_items_per_s >= 10000"] = result["batch_items_per_s"] >= TARGETS["batch_items_per_s"]
    return met


if __name__ == "__main__":
    raise SystemExit(main())
