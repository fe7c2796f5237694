"""Exactly once against a payment system that does not deduplicate, on real processes.

The payment stand-in runs with ``--payment-dedup off`` (every accepted POST is a new payment, so a
transfer paid twice is two rows of ``payment_transfers``) and the workers reach it through a fault
proxy (handlers/standins/proxy.py) that holds requests in "the network" and delivers them after the
worker gave up, drops answers after the stand-in committed, slows answers past the read timeout and
loses requests. Beside that: a worker killed with -9 mid-attempt, a worker stopped (SIGSTOP) past
its lease mid-attempt, a worker stopped right before its send (a test hook, tests/worker/hooked_worker.py)
and resumed after its lease ended, and the store leader killed with -9. Checked from the payment
ledger and the store, never from what the workers say:

1. ``--payment-expiry enforce`` and the payment system declared ``expiry``: every transfer paid
   exactly once, every request done, none lost; held requests arrived late and were refused;
2. ``--payment-expiry ignore`` and declared ``none``: no transfer paid twice; every transfer
   whose outcome stayed unknown is a dead letter of class ``unknown_outcome``, listed by the review
   API with its lookups as evidence and never paid; redriven, each is paid exactly once;
3. the same as 1 with a planted bug (re-send without the wait): transfers are paid twice, and
   the check of 1 says so. This is how the checks of 1 were shown able to fail.

The stand-ins and their PostgreSQL start once per mode for the module; each test has its own store
and proxy. About 25-40 s per test on the 2-core machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import pytest
from test_worker_processes import (  # the process harness of the worker tests
    HOLDING_WAIT_S,
    MACHINE,
    ROOT,
    Chaos,
    Fault,
    Standins,
    WorkerProcess,
    Workers,
    Workload,
    python_path,
    standins_process,
    store_queue,
    until_terminal,
    views,
)

from api.tokens import new_token, token_hash
from compensator import config as configuration
from compensator.wiring.api import api_app
from delay.policy import RetryPolicy
from handlers.standins.proxy import ProxyFaults, RunningProxy, running_proxy
from queues import QueueClient, Role, State
from queues.model import Enqueue, MessageView
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow

HOOKED: Final = Path(__file__).resolve().parent / "hooked_worker.py"
LEASE_MS: Final = 2500
READ_TIMEOUT_S: Final = 0.6
ATTEMPT_TIMEOUT_S: Final = 2.0
"""A request's deadline is at most this far ahead of its send (and never past the lease)."""
SKEW_MS: Final = 200
HORIZON_S: Final = 3.0
POLICY: Final = RetryPolicy(tiers_ms=(100, 300, 600), tier_jitter_ratio=0.2, attempts_max=100)
WORKER_IDS: Final = ("w1", "w2", "w3")
"""Each carries the stop-before-send hook (`Faults.stop_before_send`)."""


# ---- the stand-ins in a mode, the proxy before the payment system -----------------------------


@contextlib.contextmanager
def standins_in_mode(*flags: str) -> Iterator[Standins]:
    """The stand-ins in a folder of their own under /tmp: as root, PostgreSQL runs as another user,
    who must reach it (pytest's base folder is private to root, and other sessions reset its mode)."""
    root = Path(tempfile.mkdtemp(prefix="exactly-once-standins-"))
    try:
        with standins_process(root, *flags, seed=20) as standins:
            assert "payment dedup off" in (root / "standins.log").read_text()
            yield standins
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def expiring() -> Iterator[Standins]:
    with standins_in_mode("--payment-dedup", "off", "--payment-expiry", "enforce") as standins:
        yield standins


@pytest.fixture(scope="module")
def unguarded() -> Iterator[Standins]:
    with standins_in_mode("--payment-dedup", "off", "--payment-expiry", "ignore") as standins:
        yield standins


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    """Three store nodes of this checkout, writes kept in memory until fsync (`--volatile`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", python_path())
        patch.chdir(ROOT)
        nodes = ProcessCluster(tmp_path / "store", machine=MACHINE, extra_args=["--volatile"])
        nodes.start_all()
        try:
            yield nodes
        finally:
            nodes.stop_all()


@contextlib.contextmanager
def proxy_before(standins: Standins) -> Iterator[RunningProxy]:
    host, port = standins.urls["payment"].removeprefix("http://").split(":")
    with running_proxy((host, int(port)), ProxyFaults()) as proxy:
        yield proxy


# ---- workers ------------------------------------------------------------------------------------


@dataclass(slots=True)
class HookedWorkers(Workers):
    """`compensator worker` through tests/worker/hooked_worker.py: hooks per worker by environment."""

    hooks: dict[str, dict[str, str]] = field(default_factory=dict)
    """Worker id prefix -> its extra environment."""

    def argv(self, worker_id: str) -> list[str]:
        return [sys.executable, str(HOOKED), "worker", "--id", worker_id]

    def extra_env(self, worker_id: str) -> dict[str, str]:
        return next((env for prefix, env in self.hooks.items() if worker_id.startswith(prefix)), {})


def worker_env(cluster: ProcessCluster, standins: Standins, proxy: RunningProxy, **payment: object) -> dict[str, str]:
    timeouts = {"connect_timeout_s": 0.5, "write_timeout_s": 0.5, "read_timeout_s": READ_TIMEOUT_S,
                "pool_timeout_s": 1.0, "attempt_timeout_s": ATTEMPT_TIMEOUT_S}  # fmt: skip
    return {
        **cluster.service_settings(),
        "COMPENSATOR_HANDLERS__PAYMENT": json.dumps({"base_url": f"http://127.0.0.1:{proxy.port}",
                                                     "gateway": timeouts, **payment}),
        "COMPENSATOR_HANDLERS__RED_PACKET": json.dumps({"base_url": standins.urls["red_packet"]}),
        "COMPENSATOR_WORKER__IDLE_POLL_MS": "50",
        "COMPENSATOR_WORKER__LEASE_MS": str(LEASE_MS),
        "COMPENSATOR_WORKER__BREAKER_FAILURE_RATIO": "1.0",  # the proxy's faults are the test: no breaker pauses
    }  # fmt: skip


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[Callable[[dict[str, str], dict[str, dict[str, str]]], HookedWorkers]]:
    made: list[HookedWorkers] = []

    def workers(env: dict[str, str], hooks: dict[str, dict[str, str]]) -> HookedWorkers:
        made.append(HookedWorkers(tmp_path, env, hooks=hooks))
        return made[-1]

    try:
        yield workers
    finally:
        for group in made:
            group.stop_all()


def stop_hooks(tmp_path: Path) -> dict[str, dict[str, str]]:
    """Every worker's hook (tests/worker/hooked_worker.py): the first to POST once the file exists stops."""
    return {slot: {"EXACTLY_ONCE_STOP_FILE": str(tmp_path / "stop-before-send")} for slot in WORKER_IDS}


def handler_events(worker: WorkerProcess) -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for (name, labels), value in worker.metrics().items():
        if name == "compensator_worker_handler_events_total":
            found[dict(labels)["event"]] += int(value)
    return found


# ---- the faults ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Faults(Chaos):
    """The worker tests' kills and pauses (test_worker_processes.Chaos), a stop right before a
    send, and this module's schedule."""

    stop_file: Path = Path("/nonexistent")

    stopped: str = ""
    """The slot of the worker that stopped right before its send."""

    async def stop_before_send(self) -> None:
        """The first worker whose POST enters the gateway next stops there (every worker carries
        the hook; the one that removes the file stops); resumed once its lease has passed."""
        self.stop_file.touch()
        deadline = time.monotonic() + HOLDING_WAIT_S
        while not (slots := [slot for slot in self.running()
                             if "hook: stopping before POST" in self.current[slot].log.read_text(errors="replace")]):  # fmt: skip
            assert time.monotonic() < deadline, "no worker sent a POST: " + "\n".join(
                self.current[slot].tail() for slot in self.running())  # fmt: skip
            await asyncio.sleep(0.05)
        (self.stopped,) = slots
        self.spared.add(self.stopped)
        worker = self.current[self.stopped]
        await asyncio.sleep(LEASE_MS / 1000 + 1.0)
        worker.signal(signal.SIGCONT)
        self.faults.append(Fault("SIGSTOP right before its send, past its lease", worker.worker_id))

    async def run(self) -> None:
        await self.at(1.5)
        killed = await self.kill()
        await self.at(2.5)
        self.start(killed)
        await self.at(3.0)
        await self.stop_before_send()
        await self.at(7.0)
        leader = await self.kill_leader()
        await self.at(8.5)
        self.cluster.start(leader)
        await self.at(9.0)
        await self.pause(LEASE_MS / 1000 + 1.0)
        await self.at(13.0)
        killed = await self.kill(mid_attempt=False)  # the first kill was mid-attempt; by now the work may be drained
        await self.at(14.0)
        self.start(killed)

    def said(self) -> list[tuple[str, str, int]]:
        return [(fault.what, fault.target, len(fault.held)) for fault in self.faults]


async def produce(queue: QueueClient, workload: Workload, items: Sequence[Enqueue], waves: int, every_s: float) -> None:
    for number in range(waves):
        await workload.submit(queue, items[number::waves])
        await asyncio.sleep(every_s)


# ---- what is checked ----------------------------------------------------------------------------


async def payments(standins: Standins, workload: Workload) -> collections.Counter[str]:
    """Payments per transfer id of this workload, from the payment ledger (each row one payment),
    each checked to be the transfer submitted under that id."""
    rows = await standins.rows(
        "SELECT transfer_id, business_id, payer, payee, amount_minor, currency FROM payment_transfers"
        " WHERE transfer_id LIKE $1", f"{workload.run}-%",
    )  # fmt: skip
    wanted = {payload.transfer_id: (workload.ref_keys[key], payload) for key, payload in workload.transfers.items()}
    for row in rows:
        ref_key, payload = wanted[row["transfer_id"]]
        assert (row["business_id"], row["payer"], row["payee"], row["amount_minor"], row["currency"]) == (
            ref_key, payload.payer, payload.payee, payload.amount_minor, payload.currency), row
    return collections.Counter(row["transfer_id"] for row in rows)


def check_paid_exactly_once(paid: collections.Counter[str], workload: Workload) -> None:
    twice = {transfer_id: times for transfer_id, times in paid.items() if times > 1}
    assert not twice, f"{len(twice)} transfers paid more than once: {sorted(twice.items())[:10]}"
    unpaid = sorted({p.transfer_id for p in workload.transfers.values()} - set(paid))
    assert not unpaid, f"{len(unpaid)} transfers never paid: {unpaid[:10]}"


async def check_none_lost(queue: QueueClient, workload: Workload) -> list[MessageView]:
    """Every acknowledged request is in the store once, done or dead; the views."""
    keys = sorted(workload.ids)
    stored: dict[str, list[int]] = {}
    for view in (await queue.by_idempotency_keys(keys)).value:
        stored.setdefault(view.idempotency_key, []).append(view.message_id)
    assert stored == {key: [message_id] for key, message_id in workload.ids.items()}
    finished = await views(queue, sorted(workload.ids.values()))
    assert {view.state for view in finished} <= {State.DONE, State.DEAD}, collections.Counter(v.state for v in finished)
    return finished


@contextlib.asynccontextmanager
async def review_api(cluster: ProcessCluster) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The service's API app over this store, and a viewer's headers: what the review pages read."""
    config = configuration.load(None, {**cluster.service_settings(), "COMPENSATOR_STORE__DEADLINE_S": "10"})
    token = new_token()
    app = api_app(config)
    async with app.router.lifespan_context(app):
        await app.state.services.queue.put_token("finance-viewer", Role.VIEWER, token_hash(token), actor="test")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            headers = {"Authorization": f"Bearer {token}"}
            deadline = time.monotonic() + 10.0
            while (await client.get("/v1/review/dead-letters", headers=headers)).status_code == 401:
                assert time.monotonic() < deadline, "the API never saw the viewer's token"
                await asyncio.sleep(0.2)
            yield client, headers


# ---- 1. expiry enforced: exactly once ------------------------------------------------------------

EXPIRY_TRANSFERS: Final = 150
EXPIRY_FAULTS: Final = ProxyFaults(hold_rate=0.15, hold_s=(0.8, 3.5), lose_rate=0.05, drop_rate=0.1, slow_rate=0.1,
                                   slow_s=1.5, seed=20)  # fmt: skip
"""A held request arrives after the worker's read timeout (0.6 s): before its 2 s deadline, so the
lookup of the next attempt must not come before it lands, or after it, so the stand-in refuses it."""


async def run_expiry_scenario(
    cluster: ProcessCluster, standins: Standins, workers: HookedWorkers, proxy: RunningProxy, workload: Workload,
    *, faults: ProxyFaults, transfers: int, chaos: bool, tmp_path: Path,
) -> tuple[list[MessageView], collections.Counter[str], Faults]:  # fmt: skip
    items = [workload.transfer(number) for number in range(transfers)]
    random.Random(20).shuffle(items)
    async with store_queue(cluster) as queue:
        await queue.set_policy("transfer", POLICY, actor="test")
        plan = Faults(queue, cluster, workers, workload, started_s=0.0, stop_file=tmp_path / "stop-before-send")
        for slot in WORKER_IDS:
            plan.start(slot)
        await workers.wait_running(*plan.current.values())
        await standins.faults("payment", error_rate=0.05, seed=3)
        proxy.configure(faults)
        plan.started_s = time.monotonic()
        waves = 15 if chaos else 3  # with faults: past the last one
        producing = asyncio.create_task(produce(queue, workload, items, waves=waves, every_s=1.0))
        if chaos:
            await plan.run()
        await producing
        await asyncio.sleep(1.0)
        proxy.configure(ProxyFaults())
        await standins.faults("payment")
        await until_terminal(queue, workload, timeout_s=120.0)
        finished = await check_none_lost(queue, workload)
    return finished, await payments(standins, workload), plan


async def test_with_expiry_enforced_every_transfer_is_paid_exactly_once_through_held_requests_and_kills(
    cluster: ProcessCluster, expiring: Standins, hooked: Callable[..., HookedWorkers], tmp_path: Path,
) -> None:
    workload = Workload(run=f"expiry-{uuid.uuid4().hex[:6]}")
    before = await expiring.stats()
    with proxy_before(expiring) as proxy:
        workers = hooked(worker_env(cluster, expiring, proxy, guarantee="expiry", clock_skew_ms=SKEW_MS),
                         stop_hooks(tmp_path))  # fmt: skip
        finished, paid, plan = await run_expiry_scenario(
            cluster, expiring, workers, proxy, workload, faults=EXPIRY_FAULTS, transfers=EXPIRY_TRANSFERS, chaos=True,
            tmp_path=tmp_path,
        )  # fmt: skip
        fates = proxy.counts()
        stopped = handler_events(plan.current[plan.stopped])
        events = sum((handler_events(w) for w in plan.current.values()), collections.Counter[str]())
    after = await expiring.stats()
    check_paid_exactly_once(paid, workload)
    assert {view.state for view in finished} == {State.DONE}
    assert min(fates[f] for f in ("hold", "lose", "drop", "slow")) >= 1, fates
    assert stopped["lease_ended"] >= 1, stopped  # resumed past its lease: it wrote nothing
    refused = after["payment"]["by_outcome"].get("request_expired", 0) - before["payment"]["by_outcome"].get(
        "request_expired", 0)  # fmt: skip
    assert refused >= 1, "no held request arrived after its expiry: the scenario did not test the refusal"
    print(f"\n{EXPIRY_TRANSFERS} transfers, every one paid once and done; proxy fates {fates}; faults {plan.said()};"
          f" held requests refused as expired by the payment system: {refused}; the workers' handler events"
          f" {dict(events)}")  # fmt: skip


# ---- 3. the planted bug: a re-send without the wait pays twice -------------------------------------


async def test_a_resend_without_the_wait_is_caught_paying_twice(
    cluster: ProcessCluster, expiring: Standins, hooked: Callable[..., HookedWorkers], tmp_path: Path,
) -> None:
    """The checks of test 1 with the handler's wait taken out (EXACTLY_ONCE_PLANTED_BUG, which
    tests/worker/hooked_worker.py plants in the worker processes): every POST is held 1-1.6 s, past
    the read timeout but before its 2 s deadline, so the next attempt looks the transfer up while its
    first request is still in the network, finds nothing and sends again. `check_paid_exactly_once`
    must then fail; run with the bug, test 1 fails the same way (seen while writing it)."""
    workload = Workload(run=f"planted-{uuid.uuid4().hex[:6]}")
    with proxy_before(expiring) as proxy:
        workers = hooked(worker_env(cluster, expiring, proxy, guarantee="expiry", clock_skew_ms=SKEW_MS),
                         {"w": {"EXACTLY_ONCE_PLANTED_BUG": "resend_without_wait"}})  # fmt: skip
        _, paid, _ = await run_expiry_scenario(
            cluster, expiring, workers, proxy, workload, faults=ProxyFaults(hold_rate=1.0, hold_s=(1.0, 1.6), seed=5),
            transfers=20, chaos=False, tmp_path=tmp_path,
        )  # fmt: skip
    with pytest.raises(AssertionError, match="paid more than once") as caught:
        check_paid_exactly_once(paid, workload)
    print(f"\nplanted bug caught: {caught.value}")


# ---- 2. no guarantee: never twice, the unknown parked for finance -----------------------------------

UNGUARDED_TRANSFERS: Final = 100
UNGUARDED_FAULTS: Final = ProxyFaults(hold_rate=0.1, hold_s=(0.8, 2.0), lose_rate=0.1, drop_rate=0.1, slow_rate=0.1,
                                      slow_s=1.5, seed=21)  # fmt: skip
"""Every hold shorter than the in-flight horizon (3 s after the request's deadline): the assumption
`none` rests on."""


async def test_without_a_guarantee_no_transfer_is_paid_twice_and_the_unknown_are_parked_for_finance(
    cluster: ProcessCluster, unguarded: Standins, hooked: Callable[..., HookedWorkers], tmp_path: Path,
) -> None:
    workload = Workload(run=f"none-{uuid.uuid4().hex[:6]}")
    with proxy_before(unguarded) as proxy:
        workers = hooked(worker_env(cluster, unguarded, proxy, guarantee="none", in_flight_horizon_s=HORIZON_S),
                         stop_hooks(tmp_path))  # fmt: skip
        finished, paid, plan = await run_expiry_scenario(
            cluster, unguarded, workers, proxy, workload, faults=UNGUARDED_FAULTS, transfers=UNGUARDED_TRANSFERS,
            chaos=True, tmp_path=tmp_path,
        )  # fmt: skip
        fates = proxy.counts()
        twice = {transfer_id: times for transfer_id, times in paid.items() if times > 1}
        assert not twice, f"paid more than once: {twice}"
        dead = [view for view in finished if view.state is State.DEAD]
        for view in finished:
            transfer_id = workload.transfers[view.idempotency_key].transfer_id
            if view.state is State.DONE:
                assert paid[transfer_id] == 1, (view, paid[transfer_id])
            else:  # unknown, and never found: never paid
                assert (view.dead_reason, view.last_error_class) == ("permanent_error", "unknown_outcome"), view
                assert paid[transfer_id] == 0, view
        assert dead, f"no transfer's outcome stayed unknown: the scenario did not test parking (fates {fates})"
        async with review_api(cluster) as (client, headers):
            listed = (await client.get("/v1/review/dead-letters", params={"kind": "transfer", "limit": 1000},
                                       headers=headers)).json()["items"]  # fmt: skip
        ours = {item["ref_key"]: item for item in listed if item["ref_key"].startswith(workload.run)}
        assert sorted(ours) == sorted(view.ref_key for view in dead)
        for item in ours.values():
            assert item["error_class"] == "unknown_outcome"
            assert "never found: GET /transfers/" in item["error_text"] and "404 not_found" in item["error_text"]
        # Finance redrives them (the store's command the approved proposal runs): each is sent and paid once.
        async with store_queue(cluster) as queue:
            redriven = await queue.redrive("finance", "checked with the payment system: not paid",
                                           ids=[view.message_id for view in dead])  # fmt: skip
            assert sorted(redriven.ids) == sorted(view.message_id for view in dead)
            await until_terminal(queue, workload, timeout_s=60.0)
            after = await views(queue, [view.message_id for view in dead])
        assert {view.state for view in after} == {State.DONE}
        check_paid_exactly_once(await payments(unguarded, workload), workload)
    events = sum((handler_events(w) for w in plan.current.values()), collections.Counter[str]())
    print(f"\n{UNGUARDED_TRANSFERS} transfers: {len(finished) - len(dead)} done and paid once, {len(dead)} parked as"
          f" unknown_outcome (never paid), then redriven and paid once; proxy fates {fates}; faults {plan.said()};"
          f" handler events {dict(events)}; e.g. {ours[dead[0].ref_key]['error_text'][:300]!r}")  # fmt: skip
