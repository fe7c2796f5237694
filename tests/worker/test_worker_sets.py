"""One worker over several sets, each a real one-node store in this process (a Raft set of one:
its own WAL, leader and message numbering): it drains every set and settles each grant with the
set it came from, although the sets number their messages alike; a set that stops answering
(frozen: calls time out, as with no leader or no majority; or stopped: connections refused)
stalls only its own share and is drained once it is back; and a backlog on one set does not keep
another's few requests waiting behind it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from prometheus_client import generate_latest

from handlers.contract import Attempt, Decision, Permanent, Retryable, Succeeded
from ledger.kinds import Kind
from queues import QueueClient, QueueError, RaftClient, State
from queues.model import Enqueue, QueueCommand, QueueResult
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store
from services.worker import runner
from services.worker.limits import Limits
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker, WorkerSettings
from tests.worker.test_worker import FAST, Scripted, _payload, _states, _until

SETS = (1, 2, 3)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_store(tmp_path / f"set{s}", machine_factory)) for s in SETS}


@pytest.fixture
async def sets(stores: dict[int, StoreThread]) -> AsyncIterator[dict[int, QueueClient]]:
    # A short deadline: a call to a set that does not answer gives up in 1 s, as a production
    # client does after `store.deadline_s`.
    clients = {s: QueueClient(RaftClient([t.address], auth=t.auth, attempt_timeout_s=0.3, deadline_s=1.0))
               for s, t in stores.items()}  # fmt: skip
    for client in clients.values():
        await client.set_policy("transfer", FAST)
    yield clients
    for client in clients.values():
        await client.raft.close()


async def _enqueue(queue: QueueClient, set_id: int, count: int, start: int = 0, delay_ms: int = 0) -> list[int]:
    results = await queue.enqueue_many([
        Enqueue(kind="transfer", idempotency_key=f"k-{i}", ref_key=f"s{set_id}-{i}", payload=_payload(i, "transfer"),
                delay_ms=delay_ms)
        for i in range(start, start + count)
    ])  # fmt: skip
    return [r.message_id for r in results]


@contextlib.asynccontextmanager
async def running(
    sets: dict[int, QueueClient], handler: Scripted, *, per_kind: int = 4, idle_poll_s: float = 0.05
) -> AsyncIterator[Worker]:
    limits = Limits(per_kind={"transfer": per_kind}, per_downstream={"payment": per_kind},
                    downstream_of={"transfer": "payment"})  # fmt: skip
    settings = WorkerSettings(worker_id="w1", idle_poll_s=idle_poll_s)
    worker = Worker(sets, {"transfer": handler}, limits, settings, tracer=trace.NoOpTracer(), metrics=WorkerMetrics())
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _frames_sent(sets: dict[int, QueueClient]) -> dict[int, list[frozenset[str]]]:
    """Per set, the command types of every frame the worker sends it, in order."""
    frames: dict[int, list[frozenset[str]]] = {s: [] for s in sets}
    for set_id, queue in sets.items():
        send = queue.submit_many

        async def spy(commands: Sequence[QueueCommand], set_id: int = set_id, send: Any = send) -> list[QueueResult]:
            frames[set_id].append(frozenset(type(c).__name__ for c in commands))
            return list(await send(commands))

        queue.submit_many = spy  # type: ignore[method-assign]
    return frames


async def _until_all_done(sets: dict[int, QueueClient], ids: dict[int, list[int]]) -> None:
    async def done() -> bool:
        return [set(await _states(sets[s], ids[s])) for s in sets] == [{State.DONE}] * len(sets)

    await _until(done, timeout_s=30)


def _set_of(attempt: Attempt) -> int:
    return int(attempt.ref_key.split("-")[0][1:])


async def test_a_worker_drains_every_set_and_settles_each_grant_with_its_own_set(
    sets: dict[int, QueueClient],
) -> None:
    """The three sets hold messages 1..20 each, with the same keys; set 2's attempts are refused
    (dead letters), the others succeed: an ack sent to the wrong set would show as a set 2
    message done, or another's dead."""

    def decide(attempt: Attempt) -> Decision:
        if _set_of(attempt) == 2:
            return Permanent(error_class="insufficient_funds", detail="no money", status=422)
        return Succeeded(detail="transferred")

    handler = Scripted(Kind.TRANSFER, "payment", decide=decide, delay_s=0.01)
    ids = {s: await _enqueue(queue, s, 20) for s, queue in sets.items()}
    assert ids[1] == ids[2] == ids[3]  # the same message ids in every set
    async with running(sets, handler) as worker:

        async def settled() -> bool:
            states = {s: set(await _states(sets[s], ids[s])) for s in sets}
            return states == {1: {State.DONE}, 2: {State.DEAD}, 3: {State.DONE}}

        await _until(settled)
    seen = sorted(a.ref_key for a in handler.seen)
    assert seen == sorted(f"s{s}-{i}" for s in sets for i in range(20))  # each once: none confused, none lost
    for s, queue in sets.items():
        views = (await queue.get_many(ids[s])).value
        assert all(len(v.history) == 1 for v in views)
    text = generate_latest(worker.metrics.registry).decode()
    for s in sets:
        assert f'compensator_worker_set_grants_total{{set="{s}"}} 20.0' in text
    assert 'compensator_worker_set_completions_total{action="fail",result="ok",set="2"} 20.0' in text
    assert 'compensator_worker_set_completions_total{action="ack",result="ok",set="1"} 20.0' in text


@pytest.mark.parametrize("outage", ["frozen", "stopped"])
async def test_a_set_that_does_not_answer_stalls_only_its_share_and_is_drained_when_back(
    sets: dict[int, QueueClient], stores: dict[int, StoreThread], outage: str
) -> None:
    handler = Scripted(Kind.TRANSFER, "payment", delay_s=0.02)
    async with running(sets, handler) as worker:

        async def drain(start: int) -> float:
            """Seconds to drain 30 new requests from each of sets 1 and 2."""
            began = time.monotonic()
            batch = {s: await _enqueue(sets[s], s, 30, start=start) for s in (1, 2)}

            async def done() -> bool:
                return [set(await _states(sets[s], batch[s])) for s in batch] == [{State.DONE}] * len(batch)

            await _until(done, timeout_s=20)
            return time.monotonic() - began

        healthy_s = await drain(0)
        # What set 3 holds when it stops answering: due a moment later, so that no lease of it is in
        # flight when it stops (a lease whose answer is lost waits for its expiry, lease_ms).
        waiting = await _enqueue(sets[3], 3, 10, delay_ms=1000)
        resume = threading.Event()
        if outage == "frozen":  # the node takes connections and answers nothing: every call times out
            stores[3].loop.call_soon_threadsafe(resume.wait)
        else:
            stores[3].stop_node()
        try:
            await _until(lambda: _unreachable(worker, 3), timeout_s=10)
            down_s = await drain(100)
        finally:
            if outage == "frozen":
                resume.set()
            else:
                stores[3].start_node()
        # A stalled set costs the others nothing but noise (each set has its own lane).
        assert down_s < 3 * healthy_s + 1.0, f"{down_s:.2f} s with set 3 down, {healthy_s:.2f} s before"

        async def set_3_done() -> bool:
            return set(await _states(sets[3], waiting)) == {State.DONE}

        await _until(set_3_done, timeout_s=20)  # leased again, without a restart
        assert worker.lanes[3].reachable
    assert not [a for a in handler.seen if a.attempt != 1 and _set_of(a) != 3]


async def _unreachable(worker: Worker, set_id: int) -> bool:
    return not worker.lanes[set_id].reachable


async def test_a_backlog_on_one_set_does_not_keep_another_sets_requests_waiting(sets: dict[int, QueueClient]) -> None:
    """Set 1 has 300 requests at 50 ms each, 4 at a time: 4 s of work. Set 2's three requests,
    enqueued once set 1's fill the worker, take the next slots freed: they are done while set 1
    has done only a few rounds of its backlog. (A long `idle_poll_s`: set 1's lane leases its backlog without
    reading, as a busy worker does, while set 2's must read before its first lease.)"""
    handler = Scripted(Kind.TRANSFER, "payment", delay_s=0.05)
    backlog = await _enqueue(sets[1], 1, 300)
    async with running(sets, handler, idle_poll_s=1.0) as worker:
        await _until(lambda: _full(worker))
        few = await _enqueue(sets[2], 2, 3)

        async def few_done() -> bool:
            return set(await _states(sets[2], few)) == {State.DONE}

        await _until(few_done, timeout_s=20)
        left = [state for state in await _states(sets[1], backlog) if state is not State.DONE]
        # Fair: about two rounds of set 1's (8 attempts); without shares set 2 loses most races for
        # a freed slot to set 1's backlog and waits about twenty (some 80).
        assert len(left) >= 270, f"set 2's requests waited for set 1's backlog ({300 - len(left)} of its 300 done)"


async def _full(worker: Worker) -> bool:
    return worker.running == 4


async def test_a_busy_worker_settles_with_its_leases_and_its_sets_take_turns_to_lease(
    sets: dict[int, QueueClient],
) -> None:
    """Three sets with a backlog each, one worker busy on all three: a set's lease frame carries
    the acks and fails of the attempts whose slots it refills, and the sets' leases take turns (one
    on its way at a time), so each carries what finished in its set meanwhile: fewer, fuller
    frames (log entries) per set than a stream of leases and another of settlements per set
    (services/worker/lanes.py, turns.py)."""

    def decide(attempt: Attempt) -> Decision:  # every fifth fails once: fails ride with leases too
        failing = int(attempt.ref_key.split("-")[1]) % 5 == 0 and attempt.attempt == 1
        return Retryable(error_class="timeout", detail="no answer") if failing else Succeeded(detail="transferred")

    handler = Scripted(Kind.TRANSFER, "payment", decide=decide, delay_s=0.01)
    ids = {s: await _enqueue(queue, s, 60) for s, queue in sets.items()}
    frames = _frames_sent(sets)
    async with running(sets, handler, per_kind=12) as worker:
        await _until_all_done(sets, ids)
    assert len(handler.seen) == 3 * (60 + 12)  # each set's twelve failed once, then succeeded
    for set_id in sets:
        assert [f for f in frames[set_id] if {"Lease", "AckMany"} <= f], f"set {set_id}: no lease carried acks"
        assert [f for f in frames[set_id] if {"Lease", "Fail"} <= f], f"set {set_id}: no lease carried a fail"
    assert worker.lane_turns_waited > 0  # the sets' leases took turns
    settling = [f for by_set in frames.values() for f in by_set if f & {"AckMany", "Fail"}]
    carried = [f for f in settling if "Lease" in f]
    # Settlements ride with a lease in 30-50 % of the frames that carry any (five runs; the rest
    # finish when their lane has no backlog: the last of a set, and the retries); with leases and
    # settlements sent apart (main before) in none.
    assert len(carried) >= 0.2 * len(settling), (len(carried), len(settling))


async def test_a_set_added_while_the_worker_runs_is_leased_from_without_a_restart(
    sets: dict[int, QueueClient],
) -> None:
    """The worker starts on sets 1 and 2; set 3 appears when its `discover` (the wiring's re-read of
    the control set's table) first names it: its requests are done, and the new set's maintenance
    hook is told once. A discover that fails (control set down) keeps the lanes there are."""
    handler = Scripted(Kind.TRANSFER, "payment", delay_s=0.005)
    table: dict[int, QueueClient] = {1: sets[1], 2: sets[2]}
    failing = [True]
    told: list[int] = []

    async def discover() -> dict[int, QueueClient]:
        if failing[0]:
            failing[0] = False
            raise QueueError("the control set is down")
        return dict(table)

    limits = Limits(per_kind={"transfer": 4}, per_downstream={"payment": 4}, downstream_of={"transfer": "payment"})
    worker = Worker(table, {"transfer": handler}, limits, WorkerSettings(worker_id="w1", idle_poll_s=0.05),
                    tracer=trace.NoOpTracer(), metrics=WorkerMetrics(), discover=discover,
                    discover_every_s=0.1)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, new_set=lambda set_id, _queue: told.append(set_id)))
    try:
        ids = {s: await _enqueue(sets[s], s, 10) for s in SETS}

        async def first_two_done() -> bool:
            return [set(await _states(sets[s], ids[s])) for s in (1, 2)] == [{State.DONE}] * 2

        await _until(first_two_done)
        assert set(await _states(sets[3], ids[3])) == {State.READY}  # not in the table yet: not leased
        table[3] = sets[3]  # `compensator sets add` activated set 3

        async def third_done() -> bool:
            return set(await _states(sets[3], ids[3])) == {State.DONE}

        await _until(third_done)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert told == [3]
    assert sorted(worker.lanes) == [1, 2, 3]
    assert sorted(a.ref_key for a in handler.seen) == sorted(f"s{s}-{i}" for s in SETS for i in range(10))


class Forwarder:
    """A set's node reached at another address, as after a move: real TCP, every byte passed on both
    ways; `live` counts the connections open through it, `close` cuts them all and stops listening."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.live = 0

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[:2]  # type: ignore[no-any-return]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, upstream_writer}
        self.live += 1

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()

        pipes = [asyncio.create_task(pipe(reader, upstream_writer)), asyncio.create_task(pipe(upstream_reader, writer))]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)  # one side hung up: so does the other
        finally:
            for each in pipes:
                each.cancel()
            for each_writer in (writer, upstream_writer):
                each_writer.close()
            self.live -= 1
            self._writers -= {writer, upstream_writer}

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()


async def test_a_set_whose_addresses_changed_is_leased_from_through_a_new_client_and_the_old_one_closed(
    stores: dict[int, StoreThread], sets: dict[int, QueueClient], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set 1 is first reached at one address, then the table names another (the `discover` answers a
    new client for it): the worker's lane, completions and extensions go through the new client (its
    requests are done after the old address is gone), the maintenance hook is told, and the old
    client is closed once nothing can be in flight on it (its connection through the old address ends)."""
    monkeypatch.setattr(runner, "RETIRE_MARGIN_S", 0.1)
    handler = Scripted(Kind.TRANSFER, "payment", delay_s=0.005)
    old_way, new_way = Forwarder(stores[1].address), Forwarder(stores[1].address)
    clients = [QueueClient(RaftClient([await way.start()], auth=stores[1].auth, attempt_timeout_s=0.3, deadline_s=1.0))
               for way in (old_way, new_way)]  # fmt: skip
    table: dict[int, QueueClient] = {1: clients[0]}
    told: list[int] = []

    async def discover() -> dict[int, QueueClient]:
        return dict(table)

    limits = Limits(per_kind={"transfer": 4}, per_downstream={"payment": 4}, downstream_of={"transfer": "payment"})
    worker = Worker(table, {"transfer": handler}, limits,
                    WorkerSettings(worker_id="w1", idle_poll_s=0.05, idle_wait_s=0.2), tracer=trace.NoOpTracer(),
                    metrics=WorkerMetrics(), discover=discover, discover_every_s=0.1)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, new_set=lambda set_id, _queue: told.append(set_id)))
    try:
        first = await _enqueue(sets[1], 1, 10)

        async def done(ids: list[int]) -> bool:
            return set(await _states(sets[1], ids)) == {State.DONE}

        await _until(lambda: done(first))
        assert (old_way.live, new_way.live) == (1, 0)  # the lane's calls share one connection
        table[1] = clients[1]  # the table names set 1's new addresses
        await _until(lambda: asyncio.sleep(0, worker.lanes[1].queue is clients[1]))
        await _until(lambda: asyncio.sleep(0, old_way.live == 0), timeout_s=5)  # closed after its calls could end
        await old_way.close()  # the old addresses are gone
        second = await _enqueue(sets[1], 1, 10, start=10)
        await _until(lambda: done(second))
        assert new_way.live >= 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        for client in clients:
            await client.raft.close()
        await new_way.close()
    assert told == [1] and sorted(worker.lanes) == [1]



@dataclass
class Staggered(Scripted):
    """Attempts of 5 to 40 ms, by request: they end one by one, not in waves."""

    async def handle(self, attempt: Attempt) -> Decision:
        self.delay_s = 0.005 * (1 + int(attempt.ref_key.split("-")[1]) * 7 % 8)
        return await super().handle(attempt)


async def test_a_busy_lanes_lease_waits_for_its_own_sets_settlement_to_carry(sets: dict[int, QueueClient]) -> None:
    """With several sets a slot is often freed by another set's attempt, and any lane may lease it:
    that lease would carry nothing of its own set's, an entry of its own. While the lanes take
    turns it waits (at most `lanes.CARRY_WAIT_S`) for one of its set's running attempts to end,
    and carries that settlement (services/worker/lanes.py, `_gather`)."""
    handler = Staggered(Kind.TRANSFER, "payment", decide=lambda attempt: Succeeded(detail="transferred"))
    ids = {s: await _enqueue(queue, s, 150) for s, queue in sets.items()}
    frames = _frames_sent(sets)
    async with running(sets, handler, per_kind=12):
        await _until_all_done(sets, ids)
    leases = [f for by_set in frames.values() for f in by_set if "Lease" in f]
    alone = [f for f in leases if not f & {"AckMany", "Fail"}]
    # Alone: 1.6-2.1 % of the leases in four runs; 7.5-9.5 % with leases that do not wait (main before).
    assert len(alone) <= 0.05 * len(leases), (len(alone), len(leases))
