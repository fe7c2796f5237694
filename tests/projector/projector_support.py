"""What the projector tests share: traffic that reaches every message event type through the
real store, and the check that the ledger in PostgreSQL says what the store says."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import re
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pydantic

from delay.policy import RetryPolicy
from ledger.kinds import (
    CallbackPayload,
    Kind,
    ListUpdatePayload,
    Money,
    TransferPayload,
    decode_payload,
    encode_payload,
    money_of,
)
from ledger.request_ids import RequestId
from ledger.states import LEDGER_STATE_OF, OPEN_STATES, AttemptOutcome, LedgerState, attempt_outcome_of
from queues import Code, QueueClient, State
from queues.machine import QueueConfig
from queues.model import Enqueue, Event, EventType, MessageView
from queues.replicated import DB_NAME, ReplicatedQueueMachine
from services.projector.ledger_writer import LOCK_CLASS
from services.projector.runner import Projector

SET_ID = 1
FAST = RetryPolicy(tiers_ms=(50,), tier_jitter_ratio=0.0, attempts_max=3)
KINDS = ("transfer", "list_update", "callback")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def short_event_retention(data_dir: Path) -> ReplicatedQueueMachine:
    """A store's machine that keeps its events 200 ms: a purge after that leaves a gap in the log."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return ReplicatedQueueMachine(str(data_dir / DB_NAME), QueueConfig(event_retention_ms=200))


def payload(kind: str, index: int, amount_minor: int = 100) -> bytes:
    if kind == "transfer":
        return encode_payload(TransferPayload(transfer_id=f"t{index}", payer="a", payee="b", amount_minor=amount_minor,
                                              currency="CNY"))  # fmt: skip
    if kind == "list_update":
        return encode_payload(ListUpdatePayload(red_packet_id=f"rp{index}", receiver="u", version=1,
                                                amount_minor=amount_minor, currency="USD"))  # fmt: skip
    return encode_payload(CallbackPayload(target="merchant", body={"n": index}))


class Traffic:
    """Seeded traffic through the queue's own commands: enqueues (one with a payload that is not a
    valid transfer), leases, acks, retryable and permanent failures with HTTP statuses in their
    text, releases (plain and interrupted), expiries and a late ack, redrives (one edited) and
    discards."""

    def __init__(self, queue: QueueClient, seed: int) -> None:
        self.queue, self.rng, self.next_index = queue, random.Random(seed), 0

    async def enqueue(self, count: int) -> list[int]:
        items = []
        for _ in range(count):
            index, self.next_index = self.next_index, self.next_index + 1
            kind = ("transfer", "list_update", "callback")[index % 3]
            body = b'{"not": "a transfer"}' if index == 3 else payload(kind, index, 100 + index)
            items.append(Enqueue(kind=kind, idempotency_key=f"k-{index}", ref_key=f"ref-{index}", payload=body))
        return [result.message_id for result in await self.queue.enqueue_many(items)]

    async def round(self) -> None:
        """One round: a few new requests, and something done to everything leased."""
        rng, queue = self.rng, self.queue
        await self.enqueue(rng.randint(1, 4))
        lease_ms = 1 if rng.random() < 0.15 else 30_000
        grants = (await queue.lease(f"w{rng.randint(1, 3)}", count_max=rng.randint(1, 6), lease_ms=lease_ms)).grants
        if lease_ms == 1:
            await asyncio.sleep(0.005)
            await queue.expire_leases()
            for grant in grants[:1]:
                await queue.ack(grant.message_id, grant.token, "late")
            return
        for grant in grants:
            await self._settle(grant.message_id, grant.token)
        await self._operator()

    async def _settle(self, message_id: int, token: int) -> None:
        roll = self.rng.random()
        queue = self.queue
        if roll < 0.45:
            await queue.ack(message_id, token, "ok")
        elif roll < 0.65:
            await queue.fail(message_id, token, "http_5xx", "payment system said 503 [HTTP 503]")
        elif roll < 0.75:
            await queue.fail(message_id, token, "insufficient_funds", "no [HTTP 422]", permanent=True)
        elif roll < 0.82:
            await queue.fail(message_id, token, "timeout", "no answer within 2 s")
        elif roll < 0.9:
            await queue.release(message_id, token, interrupted=self.rng.random() < 0.5)
        # else: left leased (in flight)

    async def edited_redrive(self) -> None:
        """A transfer that went dead and was redriven with an edited amount: the one step the
        seeded rounds reach only when their timing allows, made certain."""
        index, self.next_index = self.next_index, self.next_index + 1
        (created,) = await self.queue.enqueue_many([Enqueue(
            kind="transfer", idempotency_key=f"k-{index}", ref_key=f"ref-{index}", payload=payload("transfer", index, 100))])  # fmt: skip
        message_id = created.message_id
        while True:
            grants = (await self.queue.lease("w-edit", count_max=50, lease_ms=30_000)).grants
            mine = [g for g in grants if g.message_id == message_id]
            for grant in grants:
                if grant.message_id != message_id:
                    await self.queue.release(grant.message_id, grant.token)
            if mine:
                break
        await self.queue.fail(message_id, mine[0].token, "account_closed", "closed [HTTP 422]", permanent=True)
        edited = payload("transfer", 10_000 + message_id, 7_000 + message_id)
        await self.queue.redrive("ops", "fixed upstream", ids=[message_id], payload=edited)

    async def _operator(self) -> None:
        rng, queue = self.rng, self.queue
        dead = (await queue.dead_letters(limit=5)).value.items
        if dead and rng.random() < 0.5:
            target = dead[0]
            edited = None
            if target.kind == "transfer" and rng.random() < 0.5:
                edited = payload("transfer", 10_000 + target.message_id, 7_000 + target.message_id)
            await queue.redrive("ops", "fixed upstream", ids=[target.message_id], payload=edited)
        if rng.random() < 0.2:
            candidates = [m for m in range(1, self.next_index + 1)]
            outcome = await queue.discard(rng.choice(candidates), "ops", "duplicate of another request")
            assert outcome.code in (Code.OK, Code.ILLEGAL_STATE, Code.NOT_FOUND)


async def all_events(queue: QueueClient) -> list[Event]:
    events: list[Event] = []
    while True:
        batch = (await queue.events_after(events[-1].seq if events else 0, limit=1000)).value
        if not batch:
            return events
        events.extend(batch)


async def ledger_rows(
    dsn: str, set_id: int = SET_ID
) -> tuple[dict[str, asyncpg.Record], dict[tuple[str, int], asyncpg.Record], int]:
    """One set's requests, their attempts, and its cursor."""
    connection = await asyncpg.connect(dsn)
    try:
        requests = {r["request_id"]: r for r in await connection.fetch(
            "SELECT * FROM compensation_requests WHERE set_id = $1", set_id)}  # fmt: skip
        attempts = {(r["request_id"], r["attempt_number"]): r for r in await connection.fetch(
            "SELECT a.* FROM compensation_attempts a JOIN compensation_requests r USING (request_id)"
            " WHERE r.set_id = $1", set_id)}  # fmt: skip
        cursor = await connection.fetchval("SELECT last_seq FROM projector_cursors WHERE set_id = $1", set_id)
        return requests, attempts, int(cursor or 0)
    finally:
        await connection.close()


def ms(value: dt.datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // dt.timedelta(milliseconds=1)


def expected_money(view: MessageView) -> Money | None:
    try:
        return money_of(decode_payload(Kind(view.kind), view.edited_payload or view.payload))
    except pydantic.ValidationError:
        return None


async def assert_ledger_matches_store(queue: QueueClient, dsn: str, set_id: int = SET_ID) -> None:
    """Every request the set's log enqueued has exactly one row, in the state, with the amount and
    the attempts the store has; the set's cursor is its log's last event."""
    events = await all_events(queue)
    enqueued = [e.message_id for e in events if e.type is EventType.ENQUEUED]
    requests, attempts, cursor = await ledger_rows(dsn, set_id)
    assert cursor == events[-1].seq
    assert len(enqueued) == len(set(enqueued))
    assert set(requests) == {str(RequestId(set_id, m)) for m in enqueued}
    views: list[MessageView] = []
    for start in range(0, len(enqueued), 1000):
        views += (await queue.get_many(enqueued[start : start + 1000], with_history=True)).value
    assert len(views) == len(enqueued)  # nothing purged in these tests
    expected_attempts = 0
    for view in views:
        _assert_request(requests[str(RequestId(set_id, view.message_id))], view)
        for history in view.history:
            _assert_attempt(attempts[(str(RequestId(set_id, view.message_id)), history.attempt)], history)
        expected_attempts += len(view.history)
    assert len(attempts) == expected_attempts


def _assert_request(row: asyncpg.Record, view: MessageView) -> None:
    money = expected_money(view)
    state = LedgerState(row["state"])
    finished = {State.DONE: view.terminal_ms, State.DISCARDED: view.terminal_ms, State.DEAD: view.dead_ms}
    actual = (row["kind"], row["idempotency_key"], row["ref_key"], state, row["attempt_count"], row["message_id"],
              row["amount_minor"], row["currency"], ms(row["created_at"]), ms(row["finished_at"]))  # fmt: skip
    wanted = (view.kind, view.idempotency_key, view.ref_key, LEDGER_STATE_OF[view.state.value], view.attempts,
              view.message_id, None if money is None else money.amount_minor, None if money is None else money.currency,
              view.created_ms, finished.get(view.state))  # fmt: skip
    assert actual == wanted, f"request {view.message_id}"
    assert (state in OPEN_STATES) == (row["finished_at"] is None)


def _assert_attempt(row: asyncpg.Record, history: Any) -> None:
    outcome = AttemptOutcome(row["outcome"])
    status = re.search(r"\bHTTP ([1-5][0-9]{2})\b", history.error_text or "") if history.outcome == "failed" else None
    actual = (row["token"], row["worker_id"], ms(row["started_at"]), ms(row["ended_at"]), outcome, row["error_class"],
              row["downstream_status"], row["latency_ms"])  # fmt: skip
    latency = None if history.ended_ms is None else history.ended_ms - history.leased_ms
    wanted = (history.token, history.worker_id, history.leased_ms, history.ended_ms,
              attempt_outcome_of(history.outcome, permanent=outcome is AttemptOutcome.FATAL_ERROR),
              history.error_class, None if status is None else int(status[1]), latency)  # fmt: skip
    assert actual == wanted, f"attempt {row['request_id']}#{history.attempt}"


def event_types(events: Sequence[Event]) -> set[EventType]:
    return {event.type for event in events}


async def execute(dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def running(built: Projector, stop_timeout_s: float = 30.0) -> AsyncIterator[asyncio.Task[None]]:
    """The projector runs for the block; on exit it is stopped, and whatever it raised is raised."""
    stop = asyncio.Event()
    task = asyncio.create_task(built.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_timeout_s)


async def wait_until(check: Callable[[], object], *, timeout_s: float, what: str = "condition not reached") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():  # type: ignore[misc]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


async def end_session_of(dsn: str, set_id: int) -> None:
    """End the PostgreSQL session that holds set `set_id`'s projector lock (and with it every lock it holds)."""
    connection = await asyncpg.connect(dsn)
    try:
        ended = await connection.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
            " AND objid = $2 AND granted",
            LOCK_CLASS, set_id,
        )  # fmt: skip
        assert ended
    finally:
        await connection.close()
