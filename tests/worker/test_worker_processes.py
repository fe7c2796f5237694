"""`compensator worker` as it runs: worker processes over a real 3-process store, calling the real
stand-ins (`compensator standins`, their ledgers in an embedded PostgreSQL), with work enqueued
straight into the store. The store nodes keep writes in process memory until fsync (`--volatile`),
so a kill -9 loses exactly what was not fsynced. Every child runs this checkout's code: it starts
in the repository root with the root first on PYTHONPATH.

What is checked, from the store's messages and events and the stand-ins' own ledgers:
1. payments stay exactly-once while the downstreams fail (503), apply then withhold or cut their
   answers, workers are killed mid-attempt and paused past their leases, and the store leader is
   killed: each transfer paid once, no receive-list version ever goes backwards, every callback
   arrives, every message ends done (or dead for a reason the faults explain), none lost or stuck;
2. a payment outage opens the payment breaker for every worker within 2 s while the other kinds
   flow on, and after it the transfer backlog ramps up instead of arriving in one second;
3. SIGTERM drains a busy worker within its grace and hands back what it held at once;
4. four idle workers, with the maintenance drivers they run, add almost nothing to the log.

The stand-ins (PostgreSQL is the slowest thing to start) serve the whole module; each test has a
store of its own, names its data with a run prefix, and puts the stand-ins' faults back to none.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from delay.policy import RetryPolicy
from ledger import pg
from ledger.kinds import CallbackPayload, ListUpdatePayload, Payload, TransferPayload, encode_payload
from queues import ClientError, Code, EventType, QueueClient, RaftClient, State
from queues.model import Enqueue, Event, MessageView
from queues.query_codec import IDS_PER_QUERY_MAX
from raft_store.testing.processes import ProcessCluster, free_ports

pytestmark = pytest.mark.slow

ROOT: Final = Path(__file__).resolve().parents[2]
MACHINE: Final = "queues.replicated:machine_factory"
KINDS: Final = ("transfer", "list_update", "callback")
SERVICES: Final = ("payment", "red_packet", "callback")
TARGET: Final = "merchant-a"
SECRET: Final = "whsec-worker-processes-0123456789"
START_TIMEOUT_S: Final = 90.0
STORE_DEADLINE_S: Final = 20.0
TERMINAL: Final = frozenset({State.DONE, State.DEAD})
FAULT_CLASSES: Final = frozenset({"timeout", "connection_lost", "server_error", "lease_expired", "interrupted"})
"""Error classes the injected faults explain: no answer in time, a cut answer, a 5xx, a worker
killed or paused (its lease expired), a drain."""


# ---- processes ---------------------------------------------------------------------------------


def python_path() -> str:
    """This checkout first, then whatever PYTHONPATH already named."""
    return os.pathsep.join([str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


def child_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any COMPENSATOR_ setting, on this checkout's code."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    return {**env, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1", **(overrides or {})}


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- the stand-ins: one `compensator standins` process for the module --------------------------


@dataclass(frozen=True, slots=True)
class Standins:
    urls: Mapping[str, str]
    """Service name -> base URL."""
    dsn: str
    """The stand-ins' embedded PostgreSQL, where their ledgers are."""
    secrets_file: Path

    async def faults(self, service: str, **settings: Any) -> None:
        async with httpx.AsyncClient(base_url=self.urls[service], timeout=10.0) as client:
            answer = await client.put("/_faults", json=settings)
        assert answer.status_code == 200, answer.text

    async def healthy(self) -> None:
        for service in SERVICES:
            await self.faults(service)

    async def stats(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        async with httpx.AsyncClient(timeout=10.0) as client:
            for service in SERVICES:
                answer = await client.get(f"{self.urls[service]}/_stats")
                assert answer.status_code == 200, answer.text
                found[service] = answer.json()
        return found

    async def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        connection = await asyncpg.connect(self.dsn)
        try:
            return [dict(row) for row in await connection.fetch(query, *args)]
        finally:
            await connection.close()


def postmaster(pg_data: Path) -> tuple[int, int] | None:
    """(pid, TCP port) of the PostgreSQL serving `pg_data`, from its postmaster.pid."""
    try:
        lines = (pg_data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    return int(lines[0]), int(lines[3])


def wait_serving(process: subprocess.Popen[bytes], urls: Mapping[str, str], pg_data: Path, log: Path) -> str:
    """The ledgers' DSN once all three stand-ins answer."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"`compensator standins` exited {process.returncode}: {log.read_text()[-2000:]}"
        with contextlib.suppress(httpx.HTTPError):
            if all(httpx.get(f"{url}/_faults", timeout=2.0).status_code == 200 for url in urls.values()):
                found = postmaster(pg_data)
                assert found is not None, "the stand-ins serve, but their PostgreSQL left no postmaster.pid"
                return pg.ServerAddress(host=pg.HOST, port=found[1], password=pg.EmbeddedPostgres(pg_data).password()).dsn
        time.sleep(0.2)
    raise AssertionError(f"the stand-ins did not serve within {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def standins_process(root: Path, *flags: str, seed: int = 11) -> Iterator[Standins]:
    """`compensator standins` with these flags (the payment system's modes), its ledgers in an
    embedded PostgreSQL under `root`, stopped with it."""
    secrets_file = root / "callback-secrets.json"
    secrets_file.write_text(json.dumps({TARGET: SECRET}))
    ports = dict(zip(SERVICES, free_ports(3), strict=True))
    pg_data = root / "pg" / "data"
    log = root / "standins.log"
    command = [
        sys.executable, "-m", "compensator", "standins", "--payment-port", str(ports["payment"]),
        "--red-packet-port", str(ports["red_packet"]), "--callback-port", str(ports["callback"]),
        "--pg-data", str(pg_data), "--secrets-file", str(secrets_file), "--seed", str(seed), *flags,
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        urls = {service: f"http://127.0.0.1:{port}" for service, port in ports.items()}
        dsn = wait_serving(process, urls, pg_data, log)
        yield Standins(urls=urls, dsn=dsn, secrets_file=secrets_file)
    finally:
        stop_process(process, timeout_s=30.0)  # it stops its PostgreSQL on the way out
        left = postmaster(pg_data)
        if left is not None and alive(left[0]):  # the command was killed before it could
            os.kill(left[0], signal.SIGINT)  # PostgreSQL's fast shutdown


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standins]:
    with standins_process(tmp_path_factory.mktemp("standins")) as running:
        yield running


# ---- the store: three node processes per test --------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with pytest.MonkeyPatch.context() as patch:  # the nodes ProcessCluster starts run this checkout
        patch.setenv("PYTHONPATH", python_path())
        patch.chdir(ROOT)
        nodes = ProcessCluster(tmp_path / "store", machine=MACHINE, extra_args=["--volatile"])
        nodes.start_all()
        try:
            yield nodes
        finally:
            nodes.stop_all()


@contextlib.asynccontextmanager
async def store_queue(cluster: ProcessCluster) -> AsyncIterator[QueueClient]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=STORE_DEADLINE_S)
    try:
        await cluster.wait_leader(raft, timeout_s=30.0)
        yield QueueClient(raft)
    finally:
        await raft.close()


async def leader_commit(cluster: ProcessCluster, queue: QueueClient) -> int:
    leader = await cluster.wait_leader(queue.raft)
    return int((await queue.raft.status(cluster.address(leader)))["commit"])


async def set_policies(queue: QueueClient, policy: RetryPolicy) -> None:
    for kind in KINDS:
        await queue.set_policy(kind, policy, actor="test")


# ---- workers -----------------------------------------------------------------------------------


def gateway(*, read_timeout_s: float, attempt_timeout_s: float) -> dict[str, float]:
    return {"connect_timeout_s": 1.0, "write_timeout_s": 1.0, "read_timeout_s": read_timeout_s,
            "pool_timeout_s": 1.0, "attempt_timeout_s": attempt_timeout_s}  # fmt: skip


def worker_env(cluster: ProcessCluster, standins: Standins, *, read_timeout_s: float, attempt_timeout_s: float,
               **worker: object) -> dict[str, str]:  # fmt: skip
    """`compensator worker`'s configuration: this store, these stand-ins, `worker` settings."""
    timeouts = gateway(read_timeout_s=read_timeout_s, attempt_timeout_s=attempt_timeout_s)
    callback_url = f"{standins.urls['callback']}/callbacks/{TARGET}"
    env = {
        **cluster.service_settings(),
        "COMPENSATOR_HANDLERS__PAYMENT": json.dumps({"base_url": standins.urls["payment"], "gateway": timeouts}),
        "COMPENSATOR_HANDLERS__RED_PACKET": json.dumps({"base_url": standins.urls["red_packet"], "gateway": timeouts}),
        "COMPENSATOR_HANDLERS__CALLBACK": json.dumps({"gateway": timeouts,
                                                      "targets": [{"name": TARGET, "url": callback_url}]}),
        "COMPENSATOR_WORKER__CALLBACK_SECRETS_FILE": str(standins.secrets_file),
        "COMPENSATOR_WORKER__IDLE_POLL_MS": "50",
    }  # fmt: skip
    env.update({f"COMPENSATOR_WORKER__{name.upper()}": json.dumps(value) for name, value in worker.items()})
    return env


@dataclass(slots=True)
class WorkerProcess:
    worker_id: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def running(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: int) -> None:
        assert self.running(), f"{self.worker_id} exited {self.process.returncode}: {self.tail()}"
        self.process.send_signal(sig)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Its Prometheus samples: (name, sorted labels) -> value."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5.0).text
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
        }  # fmt: skip


@dataclass(slots=True)
class Workers:
    """The `compensator worker` processes of one test, tracked by pid and stopped at its end."""

    root: Path
    env: dict[str, str]
    started: list[WorkerProcess] = field(default_factory=list)

    def argv(self, worker_id: str) -> list[str]:
        return [sys.executable, "-m", "compensator", "worker", "--id", worker_id]

    def extra_env(self, worker_id: str) -> dict[str, str]:
        """Settings of this one worker beside the group's (none here)."""
        return {}

    def start(self, worker_id: str) -> WorkerProcess:
        log = self.root / f"worker-{worker_id}.log"
        port = free_ports(1)[0]
        env = child_env({**self.env, **self.extra_env(worker_id), "COMPENSATOR_WORKER__METRICS_PORT": str(port)})
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.argv(worker_id), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        worker = WorkerProcess(worker_id, process, log, port)
        self.started.append(worker)
        return worker

    async def wait_running(self, *workers: WorkerProcess) -> None:
        """Until each printed that it runs (its store client, handlers and metrics are up)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for worker in workers:
            while f"worker {worker.worker_id} running" not in worker.log.read_text(errors="replace"):
                assert worker.running(), f"{worker.worker_id} exited {worker.process.returncode}: {worker.tail()}"
                assert time.monotonic() < deadline, f"{worker.worker_id} did not start: {worker.tail()}"
                await asyncio.sleep(0.1)

    def stop_all(self) -> None:
        """SIGTERM to every worker still running (they drain together), then wait for each."""
        for worker in self.started:
            if worker.running():
                worker.process.send_signal(signal.SIGCONT)
                worker.process.terminate()
        for worker in self.started:
            stop_process(worker.process)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Workers]]:
    """Workers for a configuration; every process started is stopped when the test ends."""
    made: list[Workers] = []

    def workers(env: dict[str, str]) -> Workers:
        made.append(Workers(tmp_path, env))
        return made[-1]

    try:
        yield workers
    finally:
        for group in made:
            group.stop_all()


# ---- work --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Workload:
    """What a test submits, by idempotency key, and the message ids the store gave them."""

    run: str
    transfers: dict[str, TransferPayload] = field(default_factory=dict)
    updates: dict[str, ListUpdatePayload] = field(default_factory=dict)
    callbacks: dict[str, CallbackPayload] = field(default_factory=dict)
    ref_keys: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    """Key -> the message id the store answered."""

    def transfer(self, number: int) -> Enqueue:
        key = f"{self.run}-t-{number}"
        payload = TransferPayload(transfer_id=f"{self.run}-tr-{number}", payer=f"escrow-{self.run}",
                                  payee=f"user-{number}", amount_minor=100 + number, currency="CNY",
                                  memo=f"red packet {number}")  # fmt: skip
        self.transfers[key] = payload
        return self._enqueue("transfer", key, f"{self.run}-rp-{number}", payload)

    def update(self, packet: int, receiver: int, version: int) -> Enqueue:
        key = f"{self.run}-u-{packet}-{receiver}-v{version}"
        payload = ListUpdatePayload(red_packet_id=f"{self.run}-rp-{packet}", receiver=f"user-{receiver}",
                                    version=version, amount_minor=1000 * version + receiver,
                                    currency="CNY")  # fmt: skip
        self.updates[key] = payload
        return self._enqueue("list_update", key, f"{self.run}-rp-{packet}", payload)

    def callback(self, number: int) -> Enqueue:
        key = f"{self.run}-c-{number}"
        body = {"event": "red_packet.granted", "number": number, "run": self.run}
        payload = CallbackPayload(target=TARGET, body=body)
        self.callbacks[key] = payload
        return self._enqueue("callback", key, f"{self.run}-rp-{number}", payload)

    def _enqueue(self, kind: str, key: str, ref_key: str, payload: Payload) -> Enqueue:
        """Stamped with its request id once, so a retry after a lost answer is recognised."""
        self.ref_keys[key] = ref_key
        return Enqueue(kind=kind, idempotency_key=key, ref_key=ref_key, payload=encode_payload(payload),
                       request_id=secrets.randbits(63) or 1)  # fmt: skip

    async def submit(self, queue: QueueClient, items: Sequence[Enqueue]) -> None:
        """Until the store answers; OK, or EXISTS for a retry whose first try had landed."""
        deadline = time.monotonic() + STORE_DEADLINE_S * 3
        while True:
            try:
                results = await queue.enqueue_many(items)
                break
            except ClientError:
                assert time.monotonic() < deadline, "the store took no enqueue for a minute"
                await asyncio.sleep(0.2)
        for item, result in zip(items, results, strict=True):
            assert result.code in (Code.OK, Code.EXISTS), (item.idempotency_key, result)
            assert self.ids.setdefault(item.idempotency_key, result.message_id) == result.message_id


async def views(queue: QueueClient, ids: Sequence[int], *, with_history: bool = True) -> list[MessageView]:
    found: list[MessageView] = []
    for start in range(0, len(ids), IDS_PER_QUERY_MAX):
        chunk = ids[start : start + IDS_PER_QUERY_MAX]
        found += (await queue.get_many(chunk, with_history=with_history)).value
    return found


async def events(queue: QueueClient) -> list[Event]:
    found: list[Event] = []
    while page := (await queue.events_after(found[-1].seq if found else 0, limit=5000)).value:
        found += page
    return found


async def holders(queue: QueueClient, workload: Workload) -> dict[str, dict[int, int]]:
    """The leases on the workload now, by the store: worker -> message id -> token (a worker that
    holds none is left out); one read for every worker."""
    held: dict[str, dict[int, int]] = {}
    for v in await views(queue, sorted(workload.ids.values()), with_history=False):
        if v.state is State.LEASED and v.lease_worker is not None:
            held.setdefault(v.lease_worker, {})[v.message_id] = v.token
    return held


async def held_by(queue: QueueClient, workload: Workload, worker_id: str) -> dict[int, int]:
    """The leases `worker_id` holds now, by the store: message id -> token."""
    return (await holders(queue, workload)).get(worker_id, {})


async def until_terminal(queue: QueueClient, workload: Workload, timeout_s: float) -> float:
    """Seconds until every submitted message is done or dead; fails naming what is not."""
    started = time.monotonic()
    ids = sorted(workload.ids.values())
    while True:
        left = [v for v in await views(queue, ids, with_history=False) if v.state not in TERMINAL]
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            shown = [(v.message_id, v.kind, v.state.value, v.attempts, v.last_error_class, v.lease_worker)
                     for v in left[:10]]  # fmt: skip
            raise AssertionError(f"{len(left)} messages not terminal after {timeout_s} s: {shown}")
        await asyncio.sleep(0.5)


async def until(condition: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> float:
    """Seconds until `await condition()` held; fails after `timeout_s`."""
    started = time.monotonic()
    while not await condition():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(interval_s)
    return time.monotonic() - started


async def _not(condition: Callable[[], Any]) -> bool:
    return not await condition()


def per_second(times_ms: Sequence[int], start_ms: int, end_ms: int) -> list[int]:
    """How many of `times_ms` fall in each second of [start_ms, end_ms)."""
    buckets = [0] * max(1, math.ceil((end_ms - start_ms) / 1000))
    for when in times_ms:
        if start_ms <= when < end_ms:
            buckets[(when - start_ms) // 1000] += 1
    return buckets


def delta(after: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stand-in: what its counters grew by (requests, applied, repeats), and its outcomes and
    faults by name."""
    found: dict[str, dict[str, Any]] = {}
    for service in SERVICES:
        grew: dict[str, Any] = {name: after[service][name] - before[service][name]
                                for name in ("requests", "applied", "repeats")}  # fmt: skip
        for group in ("by_outcome", "faults"):
            was = before[service][group]
            counts = {name: count - was.get(name, 0) for name, count in sorted(after[service][group].items())}
            grew[group] = {name: count for name, count in counts.items() if count}
        found[service] = grew
    return found


# ---- 1. exactly-once payments under downstream faults, kills and pauses --------------------------

FAULTS: Final = {
    "payment": {"error_rate": 0.1, "apply_then_timeout_rate": 0.1, "withhold_ms": 2500, "latency_ms": 300},
    "red_packet": {"error_rate": 0.1, "apply_then_timeout_rate": 0.05, "apply_then_drop_rate": 0.05,
                   "withhold_ms": 2500},
    "callback": {"error_rate": 0.1, "apply_then_drop_rate": 0.1},
}  # fmt: skip
"""Withheld answers come after the workers' read timeout (READ_TIMEOUT_S): applied, but unknown. Every
payment call takes 300 ms or more, so a worker mostly has attempts running for a signal to cut."""
READ_TIMEOUT_S: Final = 1.0
CHAOS_LEASE_MS: Final = 2500
TRANSFERS: Final = 240
PACKETS: Final = 15
RECEIVERS: Final = 3
VERSIONS: Final = 4
CALLBACKS: Final = 150
WAVES: Final = 15
WAVE_S: Final = 1.5
CHAOS_WORKERS: Final = ("w1", "w2", "w3")
HOLDING_WAIT_S: Final = 10.0
SETTLE_S: Final = 0.4


def chaos_waves(workload: Workload, rng: random.Random) -> list[list[Enqueue]]:
    """Transfers, list updates (each version of a receiver a message of its own, shuffled, so a
    newer version is often enqueued before an older one) and callbacks, in WAVES waves."""
    items = [workload.transfer(number) for number in range(TRANSFERS)]
    items += [workload.update(packet, receiver, version) for packet in range(PACKETS) for receiver in range(RECEIVERS)
              for version in range(1, VERSIONS + 1)]  # fmt: skip
    items += [workload.callback(number) for number in range(CALLBACKS)]
    rng.shuffle(items)
    return [items[wave::WAVES] for wave in range(WAVES)]


async def produce_waves(queue: QueueClient, workload: Workload, waves: list[list[Enqueue]], started_s: float) -> None:
    for number, wave in enumerate(waves):
        await asyncio.sleep(max(0.0, started_s + number * WAVE_S - time.monotonic()))
        await workload.submit(queue, wave)


def newer_first(workload: Workload) -> int:
    """Receivers whose versions the store took in an order other than ascending."""
    order: dict[tuple[str, str], list[int]] = {}
    for _, payload in sorted(workload.updates.items(), key=lambda item: workload.ids[item[0]]):
        order.setdefault((payload.red_packet_id, payload.receiver), []).append(payload.version)
    return sum(versions != sorted(versions) for versions in order.values())


@dataclass(slots=True)
class Fault:
    """One fault the test caused: what, to which process, and what that worker held then."""

    what: str
    target: str
    held: dict[int, int] = field(default_factory=dict)
    """Message id -> the token of the lease the worker held."""


@dataclass(slots=True)
class Chaos:
    """Kills, restarts and pauses of workers and of the store leader, on a schedule."""

    queue: QueueClient
    cluster: ProcessCluster
    workers: Workers
    workload: Workload
    started_s: float
    current: dict[str, WorkerProcess] = field(default_factory=dict)
    generations: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: list[Fault] = field(default_factory=list)

    down: set[str] = field(default_factory=set)
    """Slots whose worker was killed and not yet started again."""
    paused: str = ""
    """The slot of the worker that was paused: never killed after, so its settlements can be read."""
    spared: set[str] = field(default_factory=set)
    """Slots never killed: a check reads their workers' metrics after the scenario."""

    def start(self, slot: str) -> None:
        self.current[slot] = self.workers.start(f"{slot}.{self.generations[slot]}")
        self.generations[slot] += 1
        self.down.discard(slot)

    def running(self, *, but: Collection[str] = ()) -> list[str]:
        return [slot for slot in self.current if slot not in self.down and slot not in but]

    async def at(self, offset_s: float) -> None:
        await asyncio.sleep(max(0.0, self.started_s + offset_s - time.monotonic()))

    async def frozen_mid_attempt(self, slots: Sequence[str], *, required: bool = True) -> tuple[str, dict[int, int]]:
        """One of `slots`' workers stopped (SIGSTOP) while it holds leases, and those leases, read
        once SETTLE_S passed: a settlement it sent before it stopped has landed by then, so each
        lease left is an attempt it cannot finish while stopped (and never will if it is then
        killed). Whichever of them holds work is the one: the store hands work to whichever
        worker asks first, so one named worker may go seconds without any (seen in CI), while
        some worker holds work whenever work flows. Not `required`: if none held any for
        HOLDING_WAIT_S, the first is stopped idle (late in a scenario whose work is nearly drained,
        on a store where a lease lasts milliseconds)."""
        deadline = time.monotonic() + HOLDING_WAIT_S
        stopped_too_late = 0
        while True:
            if not required and time.monotonic() >= deadline:
                self.current[slots[0]].signal(signal.SIGSTOP)
                return slots[0], {}
            assert time.monotonic() < deadline, (
                f"none of {list(slots)} held a lease for {HOLDING_WAIT_S} s (stopped {stopped_too_late} times just"
                f" after its attempts ended); their logs end:\n"
                + "\n".join(self.current[slot].tail() for slot in slots))  # fmt: skip
            holding = await holders(self.queue, self.workload)
            slot = next((slot for slot in slots if holding.get(self.current[slot].worker_id)), None)
            if slot is None:
                await asyncio.sleep(0.05)
                continue
            worker = self.current[slot]
            worker.signal(signal.SIGSTOP)
            await asyncio.sleep(SETTLE_S)
            held = await held_by(self.queue, self.workload, worker.worker_id)
            if held:
                return slot, held
            stopped_too_late += 1
            worker.signal(signal.SIGCONT)  # its attempts ended as it stopped: try again

    async def kill(self, *, mid_attempt: bool = True) -> str:
        """kill -9 of a running worker but the spared ones, mid-attempt (or, not
        `mid_attempt`, idle if none holds anything); the slot, to start again."""
        slot, held = await self.frozen_mid_attempt(self.running(but=self.spared), required=mid_attempt)
        worker = self.current[slot]
        worker.signal(signal.SIGKILL)
        worker.process.wait(10)
        self.down.add(slot)
        self.faults.append(Fault("kill -9 worker", worker.worker_id, held))
        return slot

    async def pause(self, pause_s: float) -> str:
        """SIGSTOP of a running worker mid-attempt for `pause_s`; the slot (never killed after)."""
        slot, held = await self.frozen_mid_attempt(self.running())
        worker = self.current[slot]
        self.paused = slot
        self.spared.add(slot)
        self.faults.append(Fault(f"SIGSTOP worker {pause_s:g} s", worker.worker_id, held))
        await asyncio.sleep(pause_s - SETTLE_S)
        worker.signal(signal.SIGCONT)
        return slot

    async def kill_leader(self) -> int:
        leader = await self.cluster.wait_leader(self.queue.raft)
        self.cluster.kill(leader)
        self.faults.append(Fault("kill -9 store leader", f"node {leader}"))
        return leader

    async def run(self) -> None:
        await self.at(2.0)
        killed = await self.kill()
        await self.at(3.5)
        self.start(killed)
        await self.at(6.0)
        leader = await self.kill_leader()
        await self.at(8.0)
        self.cluster.start(leader)
        await self.at(10.0)
        await self.pause(CHAOS_LEASE_MS / 1000 + 2.0)
        await self.at(16.0)
        killed = await self.kill()
        await self.at(17.5)
        self.start(killed)
        await self.at(19.0)
        killed = await self.kill()
        await self.at(20.5)
        self.start(killed)


async def check_stored(queue: QueueClient, workload: Workload, finished: Sequence[MessageView]) -> list[MessageView]:
    """None lost, none duplicated, none stuck; the dead, each for a reason the faults explain."""
    counts = (await queue.counts()).value
    assert sum(n for (kind, _), n in counts.items() if kind in KINDS) == len(workload.ids)
    assert {state for (kind, state), n in counts.items() if kind in KINDS and n} <= {"done", "dead"}, counts
    keys = sorted(workload.ids)
    stored: dict[str, list[int]] = {}
    for start in range(0, len(keys), IDS_PER_QUERY_MAX):
        for view in (await queue.by_idempotency_keys(keys[start : start + IDS_PER_QUERY_MAX])).value:
            stored.setdefault(view.idempotency_key, []).append(view.message_id)
    assert stored == {key: [message_id] for key, message_id in workload.ids.items()}
    dead = [view for view in finished if view.state is State.DEAD]
    for view in dead:
        assert view.dead_reason == "attempts_exhausted" and view.last_error_class in FAULT_CLASSES, view
    return dead


async def check_paid_once(standins: Standins, workload: Workload) -> None:
    """One transfer per transfer id submitted, none other, each as submitted."""
    rows = await standins.rows(
        "SELECT transfer_id, business_id, payer, payee, amount_minor, currency FROM payment_transfers"
        " WHERE transfer_id LIKE $1", f"{workload.run}-%",
    )  # fmt: skip
    paid = collections.Counter(row["transfer_id"] for row in rows)
    assert [transfer_id for transfer_id, times in paid.items() if times > 1] == []
    wanted = {payload.transfer_id: (workload.ref_keys[key], payload) for key, payload in workload.transfers.items()}
    assert sorted(paid) == sorted(wanted)
    for row in rows:
        ref_key, payload = wanted[row["transfer_id"]]
        assert (row["business_id"], row["payer"], row["payee"], row["amount_minor"], row["currency"]) == (
            ref_key, payload.payer, payload.payee, payload.amount_minor, payload.currency)


async def check_versions_forward(standins: Standins, workload: Workload) -> None:
    """In the order the red-packet service applied them, each receiver's versions only rise, each
    as submitted, and every receiver ends at the newest version submitted for it."""
    rows = await standins.rows(
        "SELECT red_packet_id, receiver, version, amount_minor FROM red_packet_versions WHERE red_packet_id LIKE $1"
        " ORDER BY seq", f"{workload.run}-%",
    )  # fmt: skip
    submitted = {(p.red_packet_id, p.receiver, p.version): p.amount_minor for p in workload.updates.values()}
    applied: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        assert submitted.get((row["red_packet_id"], row["receiver"], row["version"])) == row["amount_minor"], row
        applied.setdefault((row["red_packet_id"], row["receiver"]), []).append(row["version"])
    assert {key: versions for key, versions in applied.items() if versions != sorted(set(versions))} == {}
    newest: dict[tuple[str, str], int] = {}
    for packet, receiver, version in submitted:
        newest[(packet, receiver)] = max(version, newest.get((packet, receiver), 0))
    assert {key: versions[-1] for key, versions in applied.items()} == newest
    current = await standins.rows(
        "SELECT red_packet_id, receiver, version FROM red_packet_receivers WHERE red_packet_id LIKE $1",
        f"{workload.run}-%",
    )  # fmt: skip
    assert {(row["red_packet_id"], row["receiver"]): row["version"] for row in current} == newest


async def check_callbacks_arrived(standins: Standins, workload: Workload) -> int:
    """Every callback key received at least once; the repeats the receiver counted."""
    rows = await standins.rows(
        "SELECT idempotency_key, count FROM callback_deliveries WHERE target = $1 AND idempotency_key LIKE $2",
        TARGET, f"{workload.run}-%",
    )  # fmt: skip
    assert sorted(row["idempotency_key"] for row in rows) == sorted(workload.callbacks)
    return sum(row["count"] - 1 for row in rows)


def check_faulted_leases(faults: Sequence[Fault], finished: Sequence[MessageView]) -> dict[str, int]:
    """Every lease a worker held when it was killed or paused (it was mid-attempt) expired, and
    the message was finished by another delivery. A paused worker's late ack is still taken when
    nobody leased the message in between (`succeeded_late`): its lease had expired all the same.
    Returns how many expired per worker."""
    by_id = {view.message_id: view for view in finished}
    expired: dict[str, int] = {}
    for fault in faults:
        ends = {"expired"} if fault.what.startswith("kill") else {"expired", "succeeded_late"}
        for message_id, token in fault.held.items():
            view = by_id[message_id]
            (attempt,) = [a for a in view.history if a.token == token]
            assert attempt.worker_id == fault.target and attempt.outcome in ends, (fault, view.history)
            assert view.state is State.DONE or view.last_error_class in FAULT_CLASSES, view
            expired[fault.target] = expired.get(fault.target, 0) + (attempt.outcome == "expired")
    return expired


def settlements(worker: WorkerProcess) -> collections.Counter[str]:
    """A worker's acks, fails and releases by the store's answer (ok; fenced: its lease was lost;
    done_elsewhere: another lease finished the message; anything else: a refusal it did not expect)."""
    found: collections.Counter[str] = collections.Counter()
    for (name, labels), value in worker.metrics().items():
        if name == "compensator_worker_completions_total":
            found[dict(labels)["result"]] += int(value)
    return found


async def test_payments_stay_exactly_once_under_downstream_faults_worker_kills_a_pause_and_a_leader_kill(
    cluster: ProcessCluster, standins: Standins, spawn: Callable[[dict[str, str]], Workers]
) -> None:
    workload = Workload(run=f"chaos-{uuid.uuid4().hex[:6]}")
    waves = chaos_waves(workload, random.Random(7))
    workers = spawn(worker_env(cluster, standins, read_timeout_s=READ_TIMEOUT_S, attempt_timeout_s=3.0,
                               lease_ms=CHAOS_LEASE_MS))  # fmt: skip
    async with store_queue(cluster) as queue:
        await standins.healthy()
        await set_policies(queue, RetryPolicy(tiers_ms=(200, 400, 800), tier_jitter_ratio=0.2, attempts_max=50))
        chaos = Chaos(queue, cluster, workers, workload, started_s=time.monotonic())
        for slot in CHAOS_WORKERS:
            chaos.start(slot)
        await workers.wait_running(*chaos.current.values())
        before = await standins.stats()
        for seed, (service, settings) in enumerate(FAULTS.items()):
            await standins.faults(service, **settings, seed=seed)
        chaos.started_s = time.monotonic()
        producing = asyncio.create_task(produce_waves(queue, workload, waves, chaos.started_s))
        await chaos.run()
        await producing
        faults_s = time.monotonic() - chaos.started_s
        await standins.healthy()
        drain_s = await until_terminal(queue, workload, timeout_s=120.0)
        finished = await views(queue, sorted(workload.ids.values()))
        dead = await check_stored(queue, workload, finished)
        found = await events(queue)
        paused = chaos.current[chaos.paused]  # never killed: the worker that was paused past its leases
        settled = settlements(paused)
        after = await standins.stats()
    assert all(worker.running() for worker in chaos.current.values()), "a worker exited on its own"
    await check_paid_once(standins, workload)
    await check_versions_forward(standins, workload)
    repeats = await check_callbacks_arrived(standins, workload)
    expired = check_faulted_leases(chaos.faults, finished)
    # The paused worker's late settlements were fenced off by the store, and it knew them for that.
    assert set(settled) <= {"ok", "fenced", "done_elsewhere"}, settled
    refused = settled["fenced"] + settled["done_elsewhere"]
    assert refused >= 1 or not expired.get(paused.worker_id), (settled, expired)
    shuffled = newer_first(workload)
    assert shuffled >= PACKETS * RECEIVERS // 2, shuffled
    seen = delta(after, before)
    summaries = collections.Counter(re.sub(r"\d+", "N", str(e.data.get("summary")))
                                    for e in found if e.type is EventType.SUCCEEDED)  # fmt: skip
    deliveries = sum(len(view.history) for view in finished)
    duplicates = {"transfers found paid by the lookup": seen["payment"]["by_outcome"].get("found", 0),
                  "transfers replayed": seen["payment"]["by_outcome"].get("replayed", 0),
                  "list versions already applied": seen["red_packet"]["repeats"],
                  "callbacks repeated": repeats}  # fmt: skip
    injected = {service: {**seen[service]["faults"], "503": seen[service]["by_outcome"].get("unavailable", 0)}
                for service in SERVICES}  # fmt: skip
    print(
        f"\n{len(workload.ids)} messages ({TRANSFERS} transfers, {len(workload.updates)} list updates of"
        f" {PACKETS * RECEIVERS} receivers, {shuffled} of them enqueued newer-first, {CALLBACKS} callbacks) in"
        f" {faults_s:.1f} s of faults, all terminal {drain_s:.1f} s after: {len(dead)} dead"
        f" {[(v.kind, v.last_error_class) for v in dead]}"
        f"\nfaults: {[(f.what, f.target, len(f.held)) for f in chaos.faults]}; leases expired per faulted worker"
        f" {expired}; the paused worker's settlements {dict(settled)}; injected by the stand-ins {injected}"
        f"\nstand-ins: {seen}"
        f"\n{deliveries} deliveries ({deliveries - len(finished)} beyond the first); duplicate deliveries"
        f" {duplicates} ({sum(duplicates.values())}); successes by summary {dict(summaries)}; 0 duplicate effects"
    )  # fmt: skip


# ---- 2. the payment breaker: an outage pauses transfers for every worker, the rest flows on ------

OUTAGE_S: Final = 20.0
WARM_S: Final = 4.0
RATE_PER_S: Final = 8
"""Messages of each kind submitted per second, before and during the outage."""
TICK_S: Final = 0.25
BREAKER_WORKERS: Final = 2
OPEN_WITHIN_S: Final = 2.0
BREAKER: Final = {"breaker_window_s": 1.0, "breaker_attempts_min": 5, "breaker_failure_ratio": 0.5,
                  "breaker_probe_every_s": 1.0, "ramp_start_per_s": 4.0, "ramp_double_s": 2.0,
                  "ramp_until_per_s": 64.0}  # fmt: skip
FLOW_WITHIN_S: Final = 2.0
"""A list update or callback that arrives while transfers are paused is done within this (at
light load it takes tens of milliseconds; a worker held by a payment call would keep it for the
read timeout, 5 s)."""
PROBES_PER_S_MAX: Final = 2.0
"""Per worker while open: one probe every probe_every_s, stretched by a factor of 0.5-1.5."""


def ramp_budget(elapsed_s: float) -> float:
    """Attempts one worker may have started `elapsed_s` after its ramp began (breaker.py)."""
    start, double = float(BREAKER["ramp_start_per_s"]), float(BREAKER["ramp_double_s"])
    return start * double / math.log(2) * (2 ** (elapsed_s / double) - 1) + 1


async def produce_steadily(queue: QueueClient, workload: Workload, stop: asyncio.Event) -> None:
    """RATE_PER_S of each kind, a tick's worth at a time, until `stop`."""
    number = 0
    while not stop.is_set():
        tick = time.monotonic()
        items: list[Enqueue] = []
        for _ in range(int(RATE_PER_S * TICK_S)):
            items += [workload.transfer(number), workload.update(number, 0, 1), workload.callback(number)]
            number += 1
        await workload.submit(queue, items)
        await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - tick)))


def waits_of(found: Sequence[Event], kind: str, start_ms: int, end_ms: int) -> list[int]:
    """From enqueue to success, sorted, of the messages of `kind` enqueued within [start_ms, end_ms)."""
    arrived = {e.message_id: e.ts_ms for e in found
               if e.kind == kind and e.type is EventType.ENQUEUED and start_ms <= e.ts_ms < end_ms}  # fmt: skip
    done = {e.message_id: e.ts_ms for e in found if e.type is EventType.SUCCEEDED and e.message_id in arrived}
    assert done.keys() == arrived.keys(), sorted(arrived.keys() - done.keys())
    return sorted(done[m] - arrived[m] for m in arrived)


def breaker_events(found: Sequence[Event]) -> tuple[int, int]:
    """When the payment breaker first paused transfers, and when it let them go again."""
    held = [e for e in found if e.kind == "transfer" and e.data.get("holder") == "breaker:payment"]
    paused = next(e.ts_ms for e in held if e.type is EventType.PAUSED)
    resumed = next(e.ts_ms for e in held if e.type is EventType.RESUMED and e.ts_ms >= paused)
    return paused, resumed


def times_of(found: Sequence[Event], kind: str, event_type: EventType) -> list[int]:
    return [e.ts_ms for e in found if e.kind == kind and e.type is event_type]


async def test_a_payment_outage_pauses_transfers_for_every_worker_while_the_other_kinds_flow_on(
    cluster: ProcessCluster, standins: Standins, spawn: Callable[[dict[str, str]], Workers]
) -> None:
    workload = Workload(run=f"outage-{uuid.uuid4().hex[:6]}")
    workers = spawn(worker_env(cluster, standins, read_timeout_s=5.0, attempt_timeout_s=10.0, lease_ms=3000,
                               **BREAKER))  # fmt: skip
    async with store_queue(cluster) as queue:
        await standins.healthy()
        await set_policies(queue, RetryPolicy(tiers_ms=(200, 400), tier_jitter_ratio=0.2, attempts_max=40))
        started = [workers.start(f"breaker-{n}") for n in range(BREAKER_WORKERS)]
        await workers.wait_running(*started)
        stop = asyncio.Event()
        producer = asyncio.create_task(produce_steadily(queue, workload, stop))
        await asyncio.sleep(WARM_S)

        async def paused() -> bool:
            kinds = {view.kind: view for view in (await queue.kinds()).value}
            return [pause.holder for pause in kinds["transfer"].pauses] == ["breaker:payment"]

        outage_ms, outage_began = time.time_ns() // 1_000_000, time.monotonic()
        await standins.faults("payment", outage_s=OUTAGE_S)
        await until(paused, timeout_s=OUTAGE_S, interval_s=0.05)
        open_s = time.monotonic() - outage_began
        await asyncio.sleep(max(0.0, outage_ms / 1000 + OUTAGE_S - time.time()))
        stop.set()
        await producer
        stopped_ms = time.time_ns() // 1_000_000
        await until(lambda: _not(paused), timeout_s=15.0)
        await until_terminal(queue, workload, timeout_s=90.0)
        finished = await views(queue, sorted(workload.ids.values()), with_history=False)
        found = await events(queue)
    assert {view.state for view in finished} == {State.DONE}
    assert open_s <= OPEN_WITHIN_S, f"the breaker opened {open_s:.2f} s after the outage began"
    paused_ms, resumed_ms = breaker_events(found)
    # Paused: while open, only probes lease transfers.
    open_for_s = (resumed_ms - paused_ms) / 1000
    leased_while_open = [t for t in times_of(found, "transfer", EventType.LEASED) if paused_ms < t < resumed_ms]
    assert len(leased_while_open) <= PROBES_PER_S_MAX * BREAKER_WORKERS * open_for_s + BREAKER_WORKERS
    # Isolation: the other downstreams' kinds complete at the rate they come in, each within
    # FLOW_WITHIN_S of its arrival (a worker that waited on the payment system would hold them for
    # its read timeout).
    flowing, waits = {}, {}
    seconds = int((stopped_ms - paused_ms) // 1000)
    for kind in ("list_update", "callback"):
        rates = per_second(times_of(found, kind, EventType.SUCCEEDED), paused_ms, paused_ms + seconds * 1000)
        flowing[kind], waits[kind] = rates, waits_of(found, kind, paused_ms, stopped_ms)
        assert sum(rates) >= 0.75 * RATE_PER_S * seconds, (kind, rates)
        assert len(waits[kind]) >= 0.75 * RATE_PER_S * seconds, (kind, len(waits[kind]))
        assert waits[kind][-1] <= FLOW_WITHIN_S * 1000, (kind, waits[kind][-10:], rates)
    # The ramp: the backlog's completions per second rise after the close; no second carries it all.
    after = sorted(t for t in times_of(found, "transfer", EventType.SUCCEEDED) if t >= resumed_ms)
    ramp = per_second(after, resumed_ms, after[-1] + 1)
    backlog = len(after)
    assert backlog >= RATE_PER_S * OUTAGE_S / 2, backlog
    assert ramp[0] <= BREAKER_WORKERS * ramp_budget(1.0) + 2, ramp
    assert ramp[0] < max(ramp) <= backlog / 2, ramp
    print(f"\npayment outage of {OUTAGE_S:g} s: transfers paused by breaker:payment {open_s:.2f} s after it began"
          f" (the pause event {paused_ms - outage_ms} ms after), resumed {resumed_ms - outage_ms} ms after it began;"
          f" {len(leased_while_open)} transfer leases (probes) in {open_for_s:.1f} s open;"
          f" completions per second while open: list_update {flowing['list_update']}, callback {flowing['callback']};"
          f" their waits from arrival to done, p50 and max: {[(w[len(w) // 2], w[-1]) for w in waits.values()]} ms;"
          f" backlog of {backlog} transfers after the close, per second: {ramp}")  # fmt: skip


# ---- 3. SIGTERM drains a busy worker -------------------------------------------------------------

DRAIN_GRACE_S: Final = 1.0
DRAIN_EXIT_SLACK_S: Final = 4.0
DRAIN_LEASE_MS: Final = 60_000
DRAIN_LATENCY_MS: Final = 15_000
"""Each payment call of the busy worker takes this long: its attempts outlast the grace."""
DRAIN_MESSAGES: Final = 8


async def test_sigterm_drains_a_busy_worker_and_hands_back_what_it_held_at_once(
    cluster: ProcessCluster, standins: Standins, spawn: Callable[[dict[str, str]], Workers]
) -> None:
    workload = Workload(run=f"drain-{uuid.uuid4().hex[:6]}")
    workers = spawn(worker_env(cluster, standins, read_timeout_s=30.0, attempt_timeout_s=60.0,
                               lease_ms=DRAIN_LEASE_MS, drain_grace_s=DRAIN_GRACE_S))  # fmt: skip
    async with store_queue(cluster) as queue:
        await standins.healthy()
        await standins.faults("payment", latency_ms=DRAIN_LATENCY_MS)
        await set_policies(queue, RetryPolicy(tiers_ms=(200,), tier_jitter_ratio=0.2, attempts_max=5))
        busy = workers.start("busy")
        await workers.wait_running(busy)
        sent_before = (await standins.stats())["payment"]["requests"]
        await workload.submit(queue, [workload.transfer(n) for n in range(DRAIN_MESSAGES)])
        ids = sorted(workload.ids.values())

        async def all_sent() -> bool:
            held = await held_by(queue, workload, "busy")
            sent = (await standins.stats())["payment"]["requests"] - sent_before
            return len(held) == DRAIN_MESSAGES and sent >= DRAIN_MESSAGES

        await until(all_sent, timeout_s=20.0)
        other = workers.start("other")  # idle until the busy worker hands its work back
        await workers.wait_running(other)
        await standins.faults("payment")  # what follows is quick; the busy worker's calls still wait
        assert sorted(await held_by(queue, workload, "busy")) == ids
        signalled = time.monotonic()
        busy.signal(signal.SIGTERM)
        while busy.running():
            assert time.monotonic() - signalled < DRAIN_GRACE_S + 30, "the busy worker did not stop"
            await asyncio.sleep(0.05)
        exit_s = time.monotonic() - signalled
        assert busy.process.returncode == 0, busy.tail()
        assert await held_by(queue, workload, "busy") == {}  # nothing it held waits for its lease
        await until_terminal(queue, workload, timeout_s=DRAIN_LEASE_MS / 1000)
        finished = await views(queue, ids)
    assert f"worker busy drained: {DRAIN_MESSAGES} leased" in busy.tail()
    assert exit_s <= DRAIN_GRACE_S + DRAIN_EXIT_SLACK_S, exit_s
    handed_back_ms, finished_ms = [], []
    for view in finished:
        assert view.state is State.DONE, view
        first, *_, last = view.history
        assert (first.worker_id, first.outcome) == ("busy", "interrupted"), view.history
        assert (last.worker_id, last.outcome) == ("other", "succeeded"), view.history
        assert first.ended_ms is not None
        assert last.ended_ms is not None
        handed_back_ms.append(view.history[1].leased_ms - first.ended_ms)
        finished_ms.append(last.ended_ms - first.ended_ms)
    assert max(handed_back_ms) < DRAIN_LEASE_MS / 10, handed_back_ms  # leased again at once, not after the lease
    assert max(finished_ms) < DRAIN_LEASE_MS / 10, finished_ms
    paid = await standins.rows("SELECT transfer_id FROM payment_transfers WHERE transfer_id LIKE $1",
                               f"{workload.run}-%")  # fmt: skip
    assert sorted(row["transfer_id"] for row in paid) == sorted(p.transfer_id for p in workload.transfers.values())
    print(f"\nSIGTERM with {DRAIN_MESSAGES} attempts running: exited 0 after {exit_s:.2f} s"
          f" (grace {DRAIN_GRACE_S:g} s);"
          f" the other worker leased them {min(handed_back_ms)}-{max(handed_back_ms)} ms after they were handed back"
          f" and finished them {max(finished_ms)} ms after at most (lease {DRAIN_LEASE_MS / 1000:g} s)")  # fmt: skip


# ---- 4. idle workers write (almost) nothing ------------------------------------------------------

IDLE_WORKERS: Final = 4
IDLE_S: Final = 30.0
IDLE_ENTRIES_MAX: Final = 30


async def test_idle_workers_and_their_maintenance_drivers_add_almost_nothing_to_the_log(
    cluster: ProcessCluster, standins: Standins, spawn: Callable[[dict[str, str]], Workers]
) -> None:
    workload = Workload(run=f"idle-{uuid.uuid4().hex[:6]}")
    env = worker_env(cluster, standins, read_timeout_s=5.0, attempt_timeout_s=10.0, lease_ms=3000)
    workers = spawn(env)
    async with store_queue(cluster) as queue:
        await standins.healthy()
        await set_policies(queue, RetryPolicy(tiers_ms=(200,), tier_jitter_ratio=0.2, attempts_max=5))
        started = [workers.start(f"idle-{number}") for number in range(IDLE_WORKERS)]
        await workers.wait_running(*started)
        # Some work first, so the workers idle after leasing, settling and reading their breakers.
        work = [(workload.transfer(n), workload.update(0, n, 1), workload.callback(n)) for n in range(4)]
        await workload.submit(queue, [item for items in work for item in items])
        await until_terminal(queue, workload, timeout_s=30.0)
        assert {v.state for v in await views(queue, sorted(workload.ids.values()))} == {State.DONE}
        await asyncio.sleep(1.0)  # the last settlements' flushes and breaker reads
        before = await leader_commit(cluster, queue)
        await asyncio.sleep(IDLE_S)
        after = await leader_commit(cluster, queue)
    assert all(worker.running() for worker in started), [w.tail() for w in started if not w.running()]
    acked = (("action", "ack"), ("result", "ok"))
    acks = sum(worker.metrics().get(("compensator_worker_completions_total", acked), 0.0) for worker in started)
    print(f"\n{IDLE_WORKERS} idle workers for {IDLE_S:.0f} s: {after - before} log entries"
          f" (commit {before} -> {after}); {acks:.0f} acks before they idled")  # fmt: skip
    assert after - before < IDLE_ENTRIES_MAX
