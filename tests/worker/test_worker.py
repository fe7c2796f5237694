"""The worker's mechanics against a real one-node store in this process: leasing within limits,
batched settlement, waiting for work without writing to the log, lease extension, late work
finished elsewhere, and the drain. The handlers here are scripted implementations of the handler
contract (handlers/contract.py); the handlers that call real downstreams are tested against the
stand-ins in tests/handlers, and the whole loop on processes in tests/worker/test_worker_processes.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry import trace

from delay.policy import RetryPolicy
from handlers.contract import Attempt, Decision, Permanent, Retryable, Succeeded
from ledger.kinds import Kind, ListUpdatePayload, TransferPayload, encode_payload
from queues import Code, QueueClient, RaftClient, State
from queues.model import Enqueue
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store
from services.worker.breaker import BreakerSettings
from services.worker.limits import Limits
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker, WorkerSettings

FAST = RetryPolicy(tiers_ms=(200,), tier_jitter_ratio=0.0, attempts_max=3)


@dataclass
class Scripted:
    """A handler whose decisions the test scripts; it records every attempt it saw."""

    kind: Kind
    downstream: str
    decide: Callable[[Attempt], Decision] = lambda attempt: Succeeded(detail="done")
    delay_s: float = 0.0
    seen: list[Attempt] = field(default_factory=list)
    running: int = 0
    running_max: int = 0

    async def handle(self, attempt: Attempt) -> Decision:
        self.seen.append(attempt)
        self.running += 1
        self.running_max = max(self.running_max, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            return self.decide(attempt)
        finally:
            self.running -= 1


def _payload(index: int, kind: str) -> bytes:
    if kind == "list_update":
        return encode_payload(ListUpdatePayload(red_packet_id=f"rp-{index}", receiver="u", version=1, amount_minor=1,
                                                currency="CNY"))  # fmt: skip
    return encode_payload(TransferPayload(transfer_id=f"t{index}", payer="a", payee="b", amount_minor=100,
                                          currency="CNY"))  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


@pytest.fixture
async def queue(store: StoreThread) -> AsyncIterator[QueueClient]:
    client = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    for kind in ("transfer", "list_update"):
        await client.set_policy(kind, FAST)
    yield client
    await client.raft.close()


async def _enqueue(queue: QueueClient, count: int, kind: str = "transfer", start: int = 0) -> list[int]:
    results = await queue.enqueue_many([
        Enqueue(kind=kind, idempotency_key=f"{kind}-{i}", ref_key=f"rp-{i}", payload=_payload(i, kind))
        for i in range(start, start + count)
    ])  # fmt: skip
    return [r.message_id for r in results]


@contextlib.asynccontextmanager
async def running(queue: QueueClient, handlers: dict[str, Scripted], *, per_kind: int = 8, per_downstream: int = 8,
                  **settings: object) -> AsyncIterator[tuple[Worker, asyncio.Event]]:  # fmt: skip
    limits = Limits(per_kind={k: per_kind for k in handlers}, per_downstream={h.downstream: per_downstream
                    for h in handlers.values()}, downstream_of={k: h.downstream for k, h in handlers.items()})  # fmt: skip
    worker = Worker({1: queue}, handlers, limits, WorkerSettings(**{"worker_id": "w1", "idle_poll_s": 0.02, **settings}),  # type: ignore[arg-type]
                    tracer=trace.NoOpTracer(), metrics=WorkerMetrics())  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker, stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _states(queue: QueueClient, ids: list[int]) -> list[State]:
    return [view.state for view in (await queue.get_many(ids, with_history=False)).value]


async def _until(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():  # type: ignore[misc]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_every_message_is_done_within_its_kinds_limits_and_acks_are_batched(queue: QueueClient) -> None:
    transfers = Scripted(Kind.TRANSFER, "payment", delay_s=0.02)
    updates = Scripted(Kind.LIST_UPDATE, "red_packet", delay_s=0.02)
    ids = await _enqueue(queue, 60) + await _enqueue(queue, 60, kind="list_update")
    before = (await queue.raft.status(queue.raft.addresses[0]))["commit"]
    async with running(queue, {"transfer": transfers, "list_update": updates}, per_kind=5):

        async def all_done() -> bool:
            return set(await _states(queue, ids)) == {State.DONE}

        await _until(all_done)
    assert transfers.running_max == 5 and updates.running_max == 5
    assert len(transfers.seen) == 60 and all(a.attempt == 1 and a.previous_error_class is None for a in transfers.seen)
    assert transfers.seen[0].payload == TransferPayload(transfer_id="t0", payer="a", payee="b", amount_minor=100,
                                                        currency="CNY")  # fmt: skip
    entries = int((await queue.raft.status(queue.raft.addresses[0]))["commit"]) - int(before)
    assert entries < 120, f"{entries} log entries for 120 messages: leases and acks were not batched"


async def test_decisions_become_retries_dead_letters_and_retry_after(queue: QueueClient) -> None:
    def decide(attempt: Attempt) -> Decision:
        index = int(attempt.ref_key.split("-")[1])
        if index == 0:
            return Permanent(error_class="insufficient_funds", detail="no money", status=422)
        if index == 1:
            return Retryable(error_class="rate_limited", detail="slow down", status=429, retry_after_s=30)
        if attempt.attempt == 1:
            return Retryable(error_class="timeout", detail="no answer", outcome_unknown=True)
        return Succeeded(detail="transferred")

    handler = Scripted(Kind.TRANSFER, "payment", decide=decide)
    ids = await _enqueue(queue, 3)
    async with running(queue, {"transfer": handler}):

        async def settled() -> bool:
            states = await _states(queue, ids)
            return states[0] is State.DEAD and states[1] is State.DELAYED and states[2] is State.DONE

        await _until(settled)
    dead, later, done = (await queue.get_many(ids)).value
    assert dead.last_error_class == "insufficient_funds" and dead.dead_reason == "permanent_error"
    assert "HTTP 422" in (dead.last_error_text or "")
    assert later.due_ms - later.history[0].ended_ms >= 29_000  # type: ignore[operator]
    assert [a.outcome for a in done.history] == ["failed", "succeeded"]
    second = [a for a in handler.seen if a.message_id == ids[2] and a.attempt == 2]
    assert second and second[0].previous_error_class == "timeout"


async def test_an_idle_worker_writes_nothing_to_the_log(queue: QueueClient) -> None:
    handler = Scripted(Kind.TRANSFER, "payment")
    async with running(queue, {"transfer": handler}):
        await asyncio.sleep(0.3)
        before = (await queue.raft.status(queue.raft.addresses[0]))["commit"]
        await asyncio.sleep(1.5)
        after = (await queue.raft.status(queue.raft.addresses[0]))["commit"]
        assert after == before
        (message_id,) = await _enqueue(queue, 1, start=500)  # and it notices work at once

        async def done() -> bool:
            return (await _states(queue, [message_id])) == [State.DONE]

        await _until(done, timeout_s=2)


async def test_an_idle_worker_hears_of_an_enqueue_when_it_applies_not_at_its_next_poll(queue: QueueClient) -> None:
    """Its wait is a long poll that the store answers after the next apply: with a 5 s poll the
    attempt still starts, and is acked, within a fraction of that."""
    handler = Scripted(Kind.TRANSFER, "payment")
    async with running(queue, {"transfer": handler}, idle_poll_s=5.0):
        await asyncio.sleep(0.3)  # the worker is waiting now
        began = asyncio.get_running_loop().time()
        (message_id,) = await _enqueue(queue, 1, start=700)

        async def done() -> bool:
            return (await _states(queue, [message_id])) == [State.DONE]

        await _until(done, timeout_s=5.0)
        assert asyncio.get_running_loop().time() - began < 1.5
        assert len(handler.seen) == 1


async def test_an_idle_lane_long_polls_again_after_leases_lost_to_other_workers(queue: QueueClient) -> None:
    """After reads that said ready and leases that came back empty (other workers took the work),
    a lane backs off with plain polls; once a read finds nothing ready it waits in a long poll
    again. Counted at the node: its stale reads over a second idle, with `idle_poll_s` 20 ms (plain
    polling: about 50) and `idle_wait_s` 0.5 s (long polls: about 2, and a few documents reads)."""
    handler = Scripted(Kind.TRANSFER, "payment")
    address = queue.raft.addresses[0]
    async with running(queue, {"transfer": handler}, idle_wait_s=0.5) as (worker, _):
        await asyncio.sleep(0.3)
        for lane in worker.lanes.values():  # as two empty leases after ready reads leave it
            lane.watch.wait_after(0, from_read=True)
            lane.watch.wait_after(0, from_read=True)
        await asyncio.sleep(0.6)  # the long poll under way when the state was set has ended
        before = (await queue.raft.status(address))["metrics"]["stale_reads"]
        await asyncio.sleep(1.0)
        reads = (await queue.raft.status(address))["metrics"]["stale_reads"] - before
        assert reads <= 10, f"{reads} reads in an idle second: the lane kept polling"


async def test_a_handler_that_raises_is_a_retry_with_an_unknown_outcome(queue: QueueClient) -> None:
    def decide(attempt: Attempt) -> Decision:
        if attempt.attempt == 1:
            raise RuntimeError("a bug")
        return Succeeded(detail="ok")

    handler = Scripted(Kind.TRANSFER, "payment", decide=decide)
    (message_id,) = await _enqueue(queue, 1)
    async with running(queue, {"transfer": handler}):

        async def done() -> bool:
            return (await _states(queue, [message_id])) == [State.DONE]

        await _until(done)
    assert handler.seen[1].previous_error_class == "handler_error"


async def test_a_slow_handler_keeps_its_lease(queue: QueueClient) -> None:
    handler = Scripted(Kind.TRANSFER, "payment", delay_s=1.5)
    (message_id,) = await _enqueue(queue, 1)
    async with running(queue, {"transfer": handler}, lease_ms=400) as (worker, _):

        async def done() -> bool:
            return (await _states(queue, [message_id])) == [State.DONE]

        await _until(done)
    assert worker.lanes[1].keeper.extended >= 3 and worker.lanes[1].keeper.lost == 0
    assert len(handler.seen) == 1  # never expired, never delivered twice


async def test_drain_hands_back_what_did_not_finish_so_nothing_waits_for_a_lease(queue: QueueClient) -> None:
    slow = Scripted(Kind.TRANSFER, "payment", delay_s=60)
    ids = await _enqueue(queue, 4)
    async with running(queue, {"transfer": slow}, drain_grace_s=0.3, lease_ms=120_000) as (worker, stop):

        async def all_running() -> bool:
            return worker.running == 4

        await _until(all_running)
        started = asyncio.get_running_loop().time()
        stop.set()
    took_s = asyncio.get_running_loop().time() - started
    assert took_s < 5
    views = (await queue.get_many(ids)).value
    assert {v.state for v in views} == {State.READY}  # due at once, not after the 120 s lease
    assert all(v.history[-1].outcome == "interrupted" for v in views)
    grants = (await queue.lease("w2", kinds=("transfer",), count_max=10)).grants
    assert sorted(g.message_id for g in grants) == sorted(ids)
    assert {g.previous_error_class for g in grants} == {"interrupted"} and {g.attempt for g in grants} == {2}


async def test_work_finished_under_another_lease_is_counted_not_an_error(queue: QueueClient) -> None:
    gate = asyncio.Event()

    class Stalled(Scripted):
        async def handle(self, attempt: Attempt) -> Decision:
            self.seen.append(attempt)
            await gate.wait()  # stalls past its lease (the keeper cannot save it: see below)
            return Succeeded(detail="late")

    stalled = Stalled(Kind.TRANSFER, "payment")
    (message_id,) = await _enqueue(queue, 1)
    async with running(queue, {"transfer": stalled}, per_kind=1, lease_ms=300) as (worker, _):
        await _until(lambda: _true_after(stalled.seen))
        worker.lanes[1].keeper.forget(message_id)  # as if the worker had been frozen past its lease
        await asyncio.sleep(0.6)
        grants: list[int] = []
        for _ in range(50):
            found = (await queue.lease("w2", kinds=("transfer",), count_max=1, lease_ms=5000)).grants
            if found:
                await queue.ack(found[0].message_id, found[0].token)
                grants.append(found[0].message_id)
                break
            await asyncio.sleep(0.05)
        assert grants == [message_id]
        gate.set()
        await _until(lambda: _settled(worker))
    text = worker_metrics_text(worker)
    assert 'compensator_worker_completions_total{action="ack",result="done_elsewhere"} 1.0' in text


async def test_a_lease_lost_to_a_later_failed_delivery_is_counted_fenced_not_a_lifecycle_error(queue: QueueClient) -> None:
    gate = asyncio.Event()

    class Stalled(Scripted):
        async def handle(self, attempt: Attempt) -> Decision:
            self.seen.append(attempt)
            await gate.wait()  # stalls past its lease, as a worker paused by SIGSTOP does
            return Retryable(error_class="timeout", detail="no answer", outcome_unknown=True)

    stalled = Stalled(Kind.TRANSFER, "payment")
    (message_id,) = await _enqueue(queue, 1)
    async with running(queue, {"transfer": stalled}, per_kind=1, lease_ms=300) as (worker, _):
        await _until(lambda: _true_after(stalled.seen))
        worker.lanes[1].keeper.forget(message_id)
        await asyncio.sleep(0.6)
        for _ in range(50):  # another worker's delivery fails: the message waits for its retry
            found = (await queue.lease("w2", kinds=("transfer",), count_max=1, lease_ms=5000)).grants
            if found:
                assert (await queue.fail(found[0].message_id, found[0].token, "timeout")).code is Code.OK
                break
            await asyncio.sleep(0.05)
        assert found
        gate.set()
        await _until(lambda: _settled(worker))
    text = worker_metrics_text(worker)
    assert 'compensator_worker_completions_total{action="fail",result="fenced"} 1.0' in text
    assert "illegal_state" not in text


async def _true_after(seen: list[Attempt]) -> bool:
    return bool(seen)


async def _settled(worker: Worker) -> bool:
    return worker.pending == 0 and worker.running == 0


def worker_metrics_text(worker: Worker) -> str:
    from prometheus_client import generate_latest

    return generate_latest(worker._metrics.registry).decode()


async def test_the_breaker_pauses_a_failing_downstream_for_every_worker_probes_and_closes(queue: QueueClient) -> None:
    healthy = asyncio.Event()

    def decide(attempt: Attempt) -> Decision:
        if healthy.is_set():
            return Succeeded(detail="ok")
        return Retryable(error_class="server_error", detail="503", status=503, outcome_unknown=True)

    failing = Scripted(Kind.TRANSFER, "payment", decide=decide)
    fine = Scripted(Kind.LIST_UPDATE, "red_packet")
    ids = await _enqueue(queue, 30)
    others = await _enqueue(queue, 20, kind="list_update")
    breaker = BreakerSettings(window_s=5, attempts_min=5, failure_ratio=0.5, probe_every_s=0.2, ramp_jitter_s=0)
    async with running(queue, {"transfer": failing, "list_update": fine}, breaker=breaker) as (worker, _):

        async def tripped() -> bool:
            kinds = {v.kind: v for v in (await queue.kinds()).value}
            return [p.holder for p in kinds["transfer"].pauses] == ["breaker:payment"]

        await _until(tripped)
        attempts_when_open = len(failing.seen)

        async def others_done() -> bool:
            return set(await _states(queue, others)) == {State.DONE}

        await _until(others_done)  # the other downstream flows on
        await asyncio.sleep(0.6)
        assert len(failing.seen) - attempts_when_open <= 6  # probes only, one at a time
        healthy.set()

        async def closed_and_done() -> bool:
            kinds = {v.kind: v for v in (await queue.kinds()).value}
            return not kinds["transfer"].pauses and set(await _states(queue, ids)) == {State.DONE}

        await _until(closed_and_done, timeout_s=20)
    assert worker.breakers["payment"].trips >= 1 and worker.breakers["payment"].probes >= 1
    events = [e for e in (await queue.events_after(0)).value if e.kind == "transfer" and e.type.value in ("paused", "resumed")]
    assert [e.type.value for e in events][:2] == ["paused", "resumed"]
    assert "attempts failed" in str(events[0].data["reason"])


async def test_an_operator_forces_a_breaker_open_and_closed(queue: QueueClient) -> None:
    handler = Scripted(Kind.TRANSFER, "payment")
    async with running(queue, {"transfer": handler}, modes_refresh_s=0.05):
        await queue.put_document("breakers", "payment", b'{"mode": "open"}', actor="ops", reason="payment maintenance")

        async def held() -> bool:
            kinds = {v.kind: v for v in (await queue.kinds()).value}
            return [p.holder for p in kinds["transfer"].pauses] == ["breaker:payment"]

        await _until(held)
        (message_id,) = await _enqueue(queue, 1)
        await asyncio.sleep(0.5)
        assert handler.seen == []  # forced open: no probes either
        await queue.put_document("breakers", "payment", b'{"mode": "closed"}', actor="ops")

        async def done() -> bool:
            return (await _states(queue, [message_id])) == [State.DONE]

        await _until(done)


async def test_an_attempt_knows_its_lease_and_its_in_doubt_time_holds_the_retry_back(queue: QueueClient) -> None:
    """What the transfer handler relies on: a request that may take effect for a second more keeps
    the retry from being delivered before then, and the next grant says how long is left."""
    started: list[float] = []

    def decide(attempt: Attempt) -> Decision:
        import time

        started.append(time.monotonic())
        lease = attempt.lease
        assert lease is not None and lease.send_by() - time.monotonic() <= 30.0
        if attempt.attempt == 1:
            lease.report()
            lease.sending(lease.expires_at_ms(1.0))
            lease.settled(in_doubt=True)  # a timeout: it may take effect until then
            return Retryable(error_class="timeout", detail="no answer", outcome_unknown=True)
        return Succeeded(detail="already transferred")

    transfer = Scripted(Kind.TRANSFER, "payment", decide)
    async with running(queue, {"transfer": transfer}, lease_ms=30_000):
        (message_id,) = await _enqueue(queue, 1)

        async def done() -> bool:
            return await _states(queue, [message_id]) == [State.DONE]

        await _until(done)
    first, second = transfer.seen
    assert (first.in_doubt_ms, first.budget_attempt) == (None, 1)
    assert second.previous_error_class == "timeout" and second.budget_attempt == 2
    assert second.in_doubt_ms is not None and -1000 < second.in_doubt_ms <= 0
    assert started[1] - started[0] >= 0.9  # not the policy's 200 ms


async def test_a_worker_refuses_to_start_on_a_policy_that_outlasts_the_dedup_window(queue: QueueClient) -> None:
    from compensator.config import load
    from compensator.shell import ProcessError
    from compensator.wiring.worker import check_policies

    config = load(None, {"COMPENSATOR_HANDLERS__PAYMENT": '{"base_url": "http://x:1", "dedup_window_s": 60}'})
    with pytest.raises(ProcessError, match=r"the transfer retry policy can re-send up to \d+ s after the first"
                                           r" attempt .* beyond handlers.payment.dedup_window_s \(60 s\)"):
        await check_policies(config, {1: queue}, asyncio.Event())
    await queue.set_policy("transfer", RetryPolicy(tiers_ms=(1000,), attempts_max=3, retry_after_max_ms=0))
    await check_policies(config, {1: queue}, asyncio.Event())  # 2 retries of 1.1 s, 2 x 2 x 10 s per attempt
