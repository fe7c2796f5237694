"""``compensator run`` (``make run``): the whole service on one machine, on embedded defaults.

Starts the 3-node store (``compensator node`` processes on loopback, data under `local.data_dir`,
kept between runs), the queue's maintenance driver and replica auditor, one PostgreSQL (embedded,
under `local.data_dir`/pg, unless $COMPENSATOR_PG_DSN names one) holding the three ledgers the
nightly reconciliation reads: the payment and red-packet stand-ins' own and the compensation ledger
the projector writes, so `compensator reconcile --pg-data var/local/pg/data` reconciles what the
local run did; the ledger projector, the stand-ins, the workers and the API; rotates two
tokens for local use (a producer's and an operator's); prints the API's URL, the tokens, a ``curl``
that grants a red packet at the red-packet stand-in and one that submits its failed transfer (a
transfer always pays a granted red packet, as in the real flow, so the local run reconciles clean),
``compensator demo`` for ten more, and the stand-ins' fault settings (the breaker's included).
Ctrl-C stops everything, in order, and waits for it.

A child that exits is started again, and the reason (the last line of its log: for a Python
process, the exception) is printed. A child that exits three times within 30 s is not retried:
the launcher stops everything and exits 1 with that reason, instead of printing "ready" over a
node that can never start (a taken port, a corrupt data directory).

Must never: leave a child running when it exits, or start when a port it needs is taken.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from api.tokens import new_token, token_hash
from compensator.commands import demo
from compensator.commands.run_sets import LocalSets
from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from compensator.config_processes import parse_address
from compensator.shell import Running, Shell
from compensator.shell import run as run_process
from compensator.store import access_client, queue_client
from queues import ClientError, QueueClient, QueueError, Role
from queues.audit import ReplicaAuditor, close_clients, replica_clients
from queues.maintenance import SERVICE, MaintenanceDriver
from raft_store.auth import write_secret_file
from raft_store.files import private_dir

EXITS_MAX: Final = 3
EXIT_WINDOW_S: Final = 30.0
START_TIMEOUT_S: Final = 60.0
LOCAL_TOKENS: Final = (("local-producer", Role.PRODUCER), ("local-operator", Role.OPERATOR))
DEMO_USERS: Final = (("demo-reviewer", Role.REVIEWER), ("demo-approver", Role.APPROVER))


class LaunchError(ValueError):
    """Why the local service cannot run; one line for the person at the terminal."""


def last_words(log: Path, lines_max: int = 200) -> str:
    """The last meaningful line a child wrote: a traceback ends with its exception."""
    try:
        with log.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            tail = handle.read().decode(errors="replace").splitlines()[-lines_max:]
    except OSError:
        return "(no log)"
    for line in reversed(tail):
        if line.strip():
            return line.strip()[:300]
    return "(empty log)"


@dataclass
class Child:
    name: str
    command: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    exits: collections.deque[float] = field(default_factory=collections.deque)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"--- {dt.datetime.now(dt.UTC).isoformat()} starting: {' '.join(self.command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **self.env), start_new_session=True,
            )  # fmt: skip

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout_s: float = 15.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"{self.name} did not stop within {timeout_s:.0f} s of SIGTERM; killing it and its process group",
                  file=sys.stderr, flush=True)  # fmt: skip
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # its own session (start_new_session): its children too
            process.wait()


def _port(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise LaunchError(f"{url}: make run starts a stand-in there, so the URL needs an explicit port")
    return port


def port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


class LocalService:
    def __init__(self, config: Config, *, config_path: Path | None, sets: int = 1) -> None:
        self.config = config
        self.data_dir = Path(config.local.data_dir)
        self.sets = LocalSets.plan(config, sets, self.data_dir) if sets != 1 else None  # `run --sets N`
        self.addresses = [parse_address(a) for a in config.store.addresses]
        python = [sys.executable, "-m", "compensator"]
        config_args = ["--config", str(config_path.resolve())] if config_path else []
        self.secret_file = config.secret_path
        store = config.store
        auth_args = ["--secret-file", str(self.secret_file.resolve())] + (
            ["--tls-ca", store.tls_ca, "--tls-cert", store.tls_cert, "--tls-key", store.tls_key] if store.tls_ca else [])
        self.nodes = [  # the set: store.addresses; with --sets, node i of every set (run_sets.py)
            Child(f"node {i}", [*python, "node", *config_args, "--id", str(i), "--data", str(self.data_dir / f"node{i}"),
                                *auth_args, *(self.sets.replica_args(i) if self.sets else [])], self.data_dir / f"node{i}.log")
            for i in range(1, len(self.addresses) + 1)
        ]  # fmt: skip
        local = config.local
        self.standin_ports = {
            "payment": _port(config.handlers.payment.base_url), "red_packet": _port(config.handlers.red_packet.base_url),
            "callback": local.callback_port,
        } if local.standins else {}  # fmt: skip
        callback_secrets = self.data_dir / "callback-secrets.json"
        self.pg_data = local_pg_data(config)
        self.pg_dsn: str | None = None
        self._pg: Any = None  # the EmbeddedPostgres this launcher started, if any
        self._pg_start: asyncio.Future[Any] | None = None
        self.database_left_running: str | None = None
        """Why the server this launcher started may still run (its stop failed): the launcher's line."""
        self.standins = [Child("stand-ins", [
            *python, "standins", *config_args, "--payment-port", str(self.standin_ports["payment"]),
            "--red-packet-port", str(self.standin_ports["red_packet"]), "--callback-port", str(local.callback_port),
            "--secrets-file", str(callback_secrets),
        ], self.data_dir / "standins.log")] if local.standins else []  # fmt: skip
        target_url = f"http://127.0.0.1:{local.callback_port}/callbacks/{local.callback_target}"
        targets = {"COMPENSATOR_HANDLERS__CALLBACK": json.dumps({"targets": [{"name": local.callback_target,
                                                                             "url": target_url}]})}  # fmt: skip
        # The API refuses a callback to a target the workers do not know: both read the same targets.
        sets_env = self.sets.env if self.sets else {}
        self.api = Child("api", [*python, "api", *config_args], self.data_dir / "api.log", env={**targets, **sets_env})
        worker_env = {
            **targets,
            "COMPENSATOR_WORKER__CALLBACK_SECRETS_FILE": str(callback_secrets),
            "COMPENSATOR_WORKER__MAINTENANCE": "false",  # the launcher runs the driver itself
            "COMPENSATOR_WORKER__BREAKER_ATTEMPTS_MIN": str(local.breaker_attempts_min),  # a person's traffic
        }  # fmt: skip
        self.workers = [
            Child(f"worker {i}", [*python, "worker", *config_args, "--id", f"local-worker-{i}"],
                  self.data_dir / f"worker{i}.log", env=worker_env)
            for i in range(1, local.workers + 1)
        ] + [Child(f"set {k} worker", [*python, "worker", *config_args, "--id", f"local-worker-set{k}"],
                   self.data_dir / f"worker-set{k}.log", env={**worker_env, **extra.set_env(k)})
             for extra in ([self.sets] if self.sets else []) for k in sorted(extra.sets)[1:]]  # fmt: skip
        self.secrets_file = callback_secrets
        # One projector for every set: with --sets it reads the control set's table (docs/ledger.md).
        self.projectors = [Child("projector", [*python, "project", *config_args, "--id", "local-projector"],
                                 self.data_dir / "projector.log", env=self.sets.env if self.sets is not None else {})
                           ] if local.projector else []  # fmt: skip

    def start_database(self) -> None:
        """The ledgers' PostgreSQL, started in the background (on a thread: pg_ctl waits); the
        configured one when $COMPENSATOR_PG_DSN names it."""
        from ledger import pg

        if not (self.standins or self.projectors):
            return
        configured = pg.dsn_from_env()
        if configured is not None:
            self.pg_dsn = configured
            return
        self._pg = pg.EmbeddedPostgres(self.pg_data)
        self._pg_start = asyncio.ensure_future(asyncio.to_thread(self._pg.start))

    async def database_ready(self) -> bool:
        """Wait for the server, then hand its DSN to the children that use it."""
        if self._pg_start is not None:
            await asyncio.shield(self._pg_start)  # a Ctrl-C leaves the start to finish, then stops it
            self.pg_dsn = self._pg.dsn
        for child in (*self.standins, *self.projectors):
            if self.pg_dsn is not None:
                child.env["COMPENSATOR_PG_DSN"] = self.pg_dsn
        return True

    async def stop_database(self) -> None:
        """Stop the server this launcher started, also when a Ctrl-C came while it was starting
        (the start is waited for first) or a child left it running: the directory is ours."""
        if self._pg_start is None:
            return
        if not self._pg_start.done():
            await asyncio.wait([self._pg_start], timeout=60.0)
        from ledger import pg

        try:
            await asyncio.to_thread(self._pg.stop_any)
        except pg.StopFailed as failed:  # the rest still stops; the launcher then exits 1
            self.database_left_running = str(failed)

    @property
    def children(self) -> list[Child]:
        return [*self.nodes, *self.projectors, *self.standins, *self.workers, self.api]

    def ensure_cluster_secret(self) -> None:
        """The store's cluster secret, made once (0600, in a 0700 folder) and kept: every node and
        client of this run presents it, and so do `compensator token` and `user` run beside it."""
        private_dir(self.data_dir)
        if not self.secret_file.exists():
            write_secret_file(self.secret_file)

    def ensure_secrets(self) -> None:
        """The demo target's signing secret, made once and kept beside the data (0600): the local
        stand-in and the workers must share it, as a merchant and we would."""
        if self.secrets_file.exists():
            return
        self.secrets_file.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({self.config.local.callback_target: secrets.token_urlsafe(32)}, handle)

    async def wait_standins(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        urls = [f"http://127.0.0.1:{port}/_faults" for port in self.standin_ports.values()]
        while time.monotonic() < deadline:
            self.supervise()
            if all([await asyncio.to_thread(_ready, url) for url in urls]):
                return True
            await asyncio.sleep(0.2)
        raise LaunchError(f"the stand-ins were not ready within 60 s: {last_words(self.standins[0].log)}")

    def check_ports(self) -> None:
        wanted = [*self.addresses, *(self.sets.addresses() if self.sets else []), (self.config.api.host, self.config.api.port),
                  *(("127.0.0.1", port) for port in self.standin_ports.values())]  # fmt: skip
        taken = [f"{h}:{p}" for h, p in wanted if port_taken(h, p)]
        if taken:
            raise LaunchError(
                f"port {', '.join(taken)} already in use (another `make run`?); stop it, or set other ports"
                " with COMPENSATOR_STORE__ADDRESSES / COMPENSATOR_API__PORT"
            )

    def supervise(self) -> None:
        """Start again any child that exited; raise LaunchError for one in a crash loop."""
        now = time.monotonic()
        for child in self.children:
            code = child.exited()
            if code is None:
                continue
            reason = last_words(child.log)
            child.exits.append(now)
            while child.exits and now - child.exits[0] > EXIT_WINDOW_S:
                child.exits.popleft()
            if len(child.exits) >= EXITS_MAX:
                raise LaunchError(f"{child.name} exited {len(child.exits)} times in {EXIT_WINDOW_S:.0f} s"
                                  f" (last code {code}): {reason} (log: {child.log})")  # fmt: skip
            print(f"{child.name} exited with {code}: {reason}; starting it again", flush=True)
            child.start()

    async def wait_leader(self, queue: QueueClient) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.supervise()
            for status in await queue.node_statuses():
                if status.get("role") == "leader":
                    return int(status["node"])
            await asyncio.sleep(0.2)
        raise LaunchError(
            "no store leader within 60 s: " + "; ".join(f"{n.name}: {last_words(n.log)}" for n in self.nodes)
        )

    async def wait_ready(self) -> bool:
        url = f"http://{self.config.api.host}:{self.config.api.port}/readyz"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.supervise()
            if await asyncio.to_thread(_ready, url):
                return True
            await asyncio.sleep(0.2)
        raise LaunchError(f"the API was not ready within 60 s: {last_words(self.api.log)} (log: {self.api.log})")


T = TypeVar("T")


async def _unless(stop: asyncio.Event, step: Coroutine[Any, Any, T]) -> T | None:
    """The step's result, or None once Ctrl-C came first: starting up must not outlast it."""
    running = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if running.done():
        return running.result()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    return None


def _interrupted() -> int:
    print("stopped before the service was ready", flush=True)
    return 130


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


async def rotate_local_tokens(queue: QueueClient) -> dict[str, str]:
    """Fresh tokens for local use at every start: printed, never written down."""
    tokens: dict[str, str] = {}
    for name, role in LOCAL_TOKENS:
        token = new_token()
        await queue.put_token(name, role, token_hash(token), actor="make-run", reason="local development token")
        tokens[name] = token
    return tokens


async def reset_demo_users(queue: QueueClient) -> dict[str, str]:
    """The review pages' demo users, created or given fresh passwords at every start (their old
    sessions end): printed, never written down, as the tokens are."""
    from api.web.accounts import Accounts

    accounts = Accounts(queue, clock_ms=lambda: time.time_ns() // 1_000_000)
    passwords: dict[str, str] = {}
    for name, role in DEMO_USERS:
        password = secrets.token_urlsafe(12)
        await accounts.ensure(name, role, password, actor="make-run")
        passwords[name] = password
    return passwords


def banner(config: Config, leader: int, tokens: dict[str, str], standins: dict[str, int],
           logins: dict[str, str] | None = None, sets: LocalSets | None = None) -> str:  # fmt: skip
    url = config.api_url
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    share = demo.Share(red_packet_id=f"rp-{stamp}", receiver="user-42", amount_minor=888, currency="CNY")
    producer, operator = tokens["local-producer"], tokens["local-operator"]
    return "\n".join([
        f"compensator is running; data in {config.local.data_dir}, logs beside it. Ctrl-C stops everything.",
        f"  API             {url}   (OpenAPI: {url}/docs)",
        f"  store           {','.join(config.store.addresses)}   (leader: node {leader})",
        *(sets.banner_lines() if sets else []),
        *_ledger_lines(config),
        f"  producer token  {producer}   (local-producer: submits, reads its own)",
        f"  operator token  {operator}   (local-operator: kinds, pauses, policies, metrics)",
        "  (both are new at every start; the store keeps only their hashes)",
        *_review_lines(url, logins or {}),
        *_grant_lines(share, standins),
        f"{'Its transfer to the payment system failed: submit it' if standins else 'Submit a failed transfer'}"
        " (the same command again answers 200 with the same id):",
        f"  curl -sS -i -X POST {url}/v1/requests -H 'Authorization: Bearer {producer}' \\",
        f"    -H 'Idempotency-Key: {share.submission_key}' -H 'Content-Type: application/json' \\",
        f"    -d '{json.dumps(share.submission())}'",
        f"Read it back: curl -sS {url}/v1/requests/<id> -H 'Authorization: Bearer {producer}'",
        *_demo_lines(config, producer, standins),
        *_standins_lines(config, standins, operator),
    ])  # fmt: skip


def _grant_lines(share: demo.Share, standins: dict[str, int]) -> list[str]:
    """A transfer is paid for a red packet someone received: the red-packet service records the grant
    first (here its stand-in), so the nightly reconciliation finds the grant behind the payout."""
    if not standins:
        return []
    return [
        f"A red packet: {share.receiver} receives {share.amount_minor} fen, and the red-packet service records the grant:",
        f"  curl -sS -X PUT http://127.0.0.1:{standins['red_packet']}{share.grant_path}"
        f" -H 'Idempotency-Key: {share.grant_key}' \\",
        f"    -H 'Content-Type: application/json' -d '{json.dumps(share.grant())}'",
    ]


def _demo_lines(config: Config, producer: str, standins: dict[str, int]) -> list[str]:
    """More of the same: a red packet shared by ten receivers, each granted, then submitted."""
    if not standins:
        return []
    defaults = Config()
    options = "".join([
        f" --api-url {config.api_url}" if config.api_url != defaults.api_url else "",
        f" --red-packet-url {config.handlers.red_packet.base_url}"
        if config.handlers.red_packet.base_url != defaults.handlers.red_packet.base_url else "",
    ])  # fmt: skip
    return [
        "Ten more, each paying a red packet's share granted first (the breaker step of the README sends these):",
        f"  COMPENSATOR_API_TOKEN={producer} {_compensator()} demo --transfers 10{options}",
    ]


def _compensator() -> str:
    """How this checkout's `compensator` is run, as the person at the terminal would type it."""
    script = Path(sys.executable).parent / "compensator"
    if not script.exists():
        return f"{sys.executable} -m compensator"
    with contextlib.suppress(ValueError):
        return str(script.relative_to(Path.cwd()))
    return str(script)


def _review_lines(url: str, logins: dict[str, str]) -> list[str]:
    if not logins:
        return []
    return [
        f"  review          {url}/review   (finance review pages; log in as one of:)",
        *(f"  {role.value:<15} {name} / {logins[name]}" for name, role in DEMO_USERS if name in logins),
        "  (new passwords at every start; `compensator user` manages real users)",
    ]


def local_pg_data(config: Config) -> Path:
    """The local run's PostgreSQL folder: the three ledgers, one database."""
    return Path(config.local.data_dir) / "pg" / "data"


def _ledger_lines(config: Config) -> list[str]:
    if not config.local.projector:
        return []
    where = local_pg_data(config)
    return [f"  ledgers         compensation_requests/_attempts (by `compensator project`) beside the stand-ins'"
            f" payment_transfers and red_packet_grants, in PostgreSQL at {where} (docs/ledger.md);",
            f"                  reconcile a day: compensator reconcile --date YYYY-MM-DD --pg-data {where}"]  # fmt: skip


def _standins_lines(config: Config, ports: dict[str, int], operator: str) -> list[str]:
    if not ports:
        return []
    payment = f"http://127.0.0.1:{ports['payment']}"
    put = f"  curl -sS -X PUT {payment}/_faults -H 'Content-Type: application/json' -d"
    return [
        f"Stand-ins: payment {payment}, red packets http://127.0.0.1:{ports['red_packet']}, callbacks"
        f" http://127.0.0.1:{ports['callback']} (target {config.local.callback_target});"
        f" {config.local.workers} workers. Faults (PUT replaces every setting, PATCH changes those it names):",
        f"{put} '{{\"error_rate\": 0.5}}'       # half answered 503: retries",
        f"{put} '{{\"permanent_rate\": 1.0}}'   # insufficient funds: dead letters",
        f"{put} '{{\"outage_s\": 30}}'          # every call 503 for 30 s: with ten transfers sent the breaker opens",
        f"  curl -sS {config.api_url}/v1/breakers -H 'Authorization: Bearer {operator}'   # the breakers",
        f"{put} '{{}}'                      # healthy again",
    ]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    run = subparsers.add_parser("run", help="the whole service on this machine (make run)")
    run.add_argument("--sets", type=int, default=1, help="store sets (default 1; more: a control set too, docs/sets.md)")
    add_config_argument(run)
    run.set_defaults(handler=run_local)


def run_local(args: argparse.Namespace) -> int:
    config = load_for(args)
    service = LocalService(config, config_path=args.config, sets=args.sets)
    service.check_ports()
    service.ensure_cluster_secret()
    # The driver's and the auditor's log lines go to a file beside the children's logs; only what
    # needs a person (a diverged replica: ERROR) is also printed. A replica that does not answer
    # while its node restarts is a line in the file, not noise over the launcher's own messages.
    settings = Shell(name="run", log_file=service.data_dir / "launcher.log")
    return run_process(settings, lambda: _launcher(service))


@contextlib.asynccontextmanager
async def _launcher(service: LocalService) -> AsyncIterator[Running]:
    yield Running(lambda stop: serve(service, stop))


async def serve(service: LocalService, stop: asyncio.Event) -> int:
    """Everything started in order, supervised until `stop` (Ctrl-C or SIGTERM), then stopped in order."""
    config = service.config
    queue = queue_client(config)
    driver = auditor = None
    try:
        for node in service.nodes:
            node.start()
        service.start_database()  # meanwhile: the nodes elect a leader
        leader = await _unless(stop, service.wait_leader(queue))
        if leader is None or (service.sets and await _unless(stop, service.sets.wait_leaders(service.supervise)) is None):
            return _interrupted()
        if service.sets:
            await service.sets.bootstrap()
            service.sets.start_drivers()
        if not await _unless(stop, service.database_ready()):
            return _interrupted()
        # Where tokens and users live: the control set with several sets (store.access_client).
        access = access_client(service.sets.config) if service.sets else queue
        try:
            tokens = await rotate_local_tokens(access)
            logins = await reset_demo_users(access)
        finally:
            if access is not queue:
                await access.raft.close()
        driver = MaintenanceDriver(queue, SERVICE)  # lease expiry and purge are commands someone must propose
        driver.start()
        for projector in service.projectors:
            projector.start()
        auditor = ReplicaAuditor(replica_clients(service.addresses, queue.raft.auth))  # names a replica that diverged
        auditor.start()
        if service.standins:
            service.ensure_secrets()
            service.standins[0].start()
            if not await _unless(stop, service.wait_standins()):
                return _interrupted()
        for worker in service.workers:
            worker.start()
        service.api.start()
        if not await _unless(stop, service.wait_ready()):
            return _interrupted()
        print(banner(config, leader, tokens, service.standin_ports, logins, service.sets), flush=True)
        while not stop.is_set():
            service.supervise()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        print("stopping: the API, the workers (they drain), the projector, the stand-ins, then the store", flush=True)
        return 0
    except (ClientError, QueueError) as error:
        raise LaunchError(f"the local store did not answer: {error}") from None
    finally:
        service.api.stop()
        for worker in service.workers:  # all drain at once
            if worker.exited() is None and worker.process is not None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in service.workers:
            worker.stop(timeout_s=30.0)
        for projector in service.projectors:
            projector.stop()
        for standin in service.standins:
            standin.stop()
        await service.stop_database()
        if driver is not None:
            await driver.stop()
        if service.sets:
            await service.sets.stop_drivers()
        if auditor is not None:
            await auditor.stop()
            await close_clients(auditor.replicas)
        await queue.raft.close()
        for node in service.nodes:
            node.stop()
        if service.database_left_running is not None:
            if sys.exc_info()[0] is None:
                raise LaunchError(service.database_left_running)
            print(service.database_left_running, file=sys.stderr, flush=True)  # before the failure's own line
