"""The projector in this process against a real store and a real PostgreSQL: it catches up and the
ledger equals the store, a standby takes over without a gap or a duplicate, a purged stretch of
the log stops it with a line that names the gap, and a rebuild writes the same ledger again."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from projector_support import (
    SET_ID,
    Traffic,
    all_events,
    assert_ledger_matches_store,
    end_session_of,
    event_types,
    ledger_rows,
    running,
    wait_until,
)

from queues import QueueClient
from queues.model import EventType
from raft_store.testing.inprocess import StoreThread
from services.projector import ledger_writer
from services.projector.facts import FactsReader
from services.projector.ledger_writer import CursorMoved
from services.projector.metrics import ProjectorMetrics
from services.projector.rows import facts_needed, fold
from services.projector.runner import Projector, ProjectorGap, ProjectorSettings, RebuildRefused, rebuild

MESSAGE_EVENTS = {
    EventType.ENQUEUED, EventType.LEASED, EventType.SUCCEEDED, EventType.ATTEMPT_FAILED, EventType.LEASE_EXPIRED,
    EventType.DEAD_LETTERED, EventType.REDRIVEN, EventType.DISCARDED, EventType.RELEASED,
}  # fmt: skip


def projector(queue: QueueClient, dsn: str, *, owner: str = "p1", batch_max: int = 50,
              exporter: InMemorySpanExporter | None = None) -> Projector:  # fmt: skip
    provider = TracerProvider()
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = ProjectorSettings(owner=owner, batch_max=batch_max, idle_poll_s=0.02, standby_poll_s=0.05)
    return Projector({SET_ID: queue}, dsn, settings, tracer=provider.get_tracer("test"), metrics=ProjectorMetrics())


async def until(check: Callable[[], object], timeout_s: float = 15.0) -> None:
    await wait_until(check, timeout_s=timeout_s)


async def caught_up(queue: QueueClient, built: Projector) -> bool:
    return built.cursor == (await queue.events_digest(0, 0)).value.last_seq


async def test_the_projector_catches_up_and_the_ledger_equals_the_store(queue: QueueClient, pg_dsn: str) -> None:
    traffic = Traffic(queue, seed=7)
    for _ in range(40):
        await traffic.round()
    await traffic.edited_redrive()
    assert event_types(await all_events(queue)) >= MESSAGE_EVENTS, "the traffic reaches every message event"
    spans = InMemorySpanExporter()
    built = projector(queue, pg_dsn, batch_max=17, exporter=spans)
    async with running(built):
        await until(lambda: caught_up(queue, built))
        for _ in range(10):  # and it follows what comes after
            await traffic.round()
        await until(lambda: caught_up(queue, built))
    await assert_ledger_matches_store(queue, pg_dsn)
    requests, _, _ = await ledger_rows(pg_dsn)
    assert any(r["amount_minor"] is None and r["kind"] == "transfer" for r in requests.values()), "an invalid payload"
    assert any(r["amount_minor"] and r["amount_minor"] >= 7_000 for r in requests.values()), "an edited amount"
    metrics = built.metrics.registry
    assert metrics.get_sample_value("compensator_projector_unreadable_payloads_total") == 1
    assert metrics.get_sample_value("compensator_projector_cursor", {"set": str(SET_ID)}) == built.cursor
    total = sum(
        metrics.get_sample_value("compensator_projector_events_total", {"type": t.value}) or 0 for t in EventType
    )
    assert total == built.projected == built.cursor
    assert metrics.get_sample_value("compensator_projector_lag_events", {"set": str(SET_ID)}) == 0
    batches = [s for s in spans.get_finished_spans() if s.name == "projector.batch"]
    assert batches and sum(s.attributes["compensator.events"] for s in batches) == built.cursor  # type: ignore[index, misc]


async def test_a_caught_up_projector_takes_each_batch_from_its_long_poll_not_from_linearizable_reads(
    queue: QueueClient, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Light load, one enqueue after another: every batch comes in the long poll's answer, so the
    set answers one held read per batch and no linearizable read of the events (it answered a
    wake-up and two linearizable reads per batch before). Counted, not timed: the polls are held
    for up to 5 s, and each enqueue answers the one waiting."""
    calls: list[bool] = []
    facts_linearizable: list[bool] = []
    events_after, get_many = queue.events_after, queue.get_many

    async def counted(seq: int, **options: object) -> object:
        calls.append(options.get("wait") is not None)
        return await events_after(seq, **options)  # type: ignore[arg-type]

    async def facts_counted(ids: list[int], **options: object) -> object:
        facts_linearizable.append(not options.get("stale_ok"))
        return await get_many(ids, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(queue, "events_after", counted)
    monkeypatch.setattr(queue, "get_many", facts_counted)
    traffic = Traffic(queue, seed=3)
    built = projector(queue, pg_dsn, batch_max=50)
    built._lane_settings = dataclasses.replace(built._lane_settings, idle_poll_s=5.0)
    async with running(built):
        await until(lambda: caught_up(queue, built))
        before, facts_before = len(calls), len(facts_linearizable)
        for _ in range(12):
            await traffic.enqueue(1)
            await until(lambda: caught_up(queue, built))
        waits, reads = sum(calls[before:]), len(calls[before:]) - sum(calls[before:])
    assert waits >= 12, calls
    assert reads == 0, f"{reads} linearizable reads of the events for 12 batches"
    facts = facts_linearizable[facts_before:]
    assert len(facts) >= 12 and not any(facts), "the facts come from the node that answered the poll"
    await assert_ledger_matches_store(queue, pg_dsn)

    # A node behind the events' read: the facts are read again, linearizably.
    facts_linearizable.clear()
    (message_id,) = await traffic.enqueue(1)
    found = await FactsReader(queue).read({message_id: True}, applied_index=10**12)
    assert facts_linearizable == [False, True] and message_id in found


async def test_a_standby_takes_over_without_a_gap_or_a_row_twice(queue: QueueClient, pg_dsn: str) -> None:
    """The active projector's PostgreSQL session dies (as when its process is killed): the standby
    takes over from the committed cursor, and the first, reconnected, stands by in its turn; then
    the second stops and the first takes over again. Every batch is an insert of new rows under
    primary keys, so a row written twice would have failed a projector."""
    traffic = Traffic(queue, seed=11)
    first, second = projector(queue, pg_dsn, owner="a", batch_max=5), projector(queue, pg_dsn, owner="b", batch_max=5)
    async with running(first):
        await until(lambda: _holding(first))
        async with running(second):
            await asyncio.sleep(0.2)
            assert second.cursor is None, "the second waits for the lock"
            for _ in range(15):
                await traffic.round()
            await until(lambda: _at_least(first, 20))
            await end_session_of(pg_dsn, SET_ID)
            for _ in range(10):
                await traffic.round()
            await until(lambda: caught_up(queue, second))
            assert first.cursor is None, "the first lost its lock with its session and stands by"
            assert first.metrics.registry.get_sample_value("compensator_projector_active", {"set": str(SET_ID)}) == 0
        for _ in range(10):
            await traffic.round()
        await until(lambda: caught_up(queue, first))
    assert first.projected > 0 and second.projected > 0
    await assert_ledger_matches_store(queue, pg_dsn)


async def _holding(built: Projector) -> bool:
    return built.cursor is not None


async def _at_least(built: Projector, seq: int) -> bool:
    return built.cursor is not None and built.cursor >= seq


async def test_two_writers_never_both_write_a_batch(queue: QueueClient, pg_dsn: str) -> None:
    """Even without the lock (lost with a connection, or an operator's mistake), the cursor read
    under FOR UPDATE refuses the second writer of the same stretch, and nothing of it is written."""
    await Traffic(queue, seed=3).enqueue(3)
    events = (await queue.events_after(0)).value
    rows = fold(events, set_id=SET_ID, facts=await FactsReader(queue).read(facts_needed(events)))
    connection = await asyncpg.connect(pg_dsn)
    try:
        assert await ledger_writer.cursor(connection, SET_ID) == 0
        await ledger_writer.write_batch(connection, set_id=SET_ID, after=0, rows=rows, owner="a")
        with pytest.raises(CursorMoved, match="another projector wrote it"):
            await ledger_writer.write_batch(connection, set_id=SET_ID, after=0, rows=rows, owner="b")
    finally:
        await connection.close()
    requests, _, cursor = await ledger_rows(pg_dsn)
    assert (len(requests), cursor) == (3, events[-1].seq)


async def test_a_purged_stretch_of_the_log_stops_the_projector_with_the_gap_named(
    gapped: tuple[StoreThread, QueueClient], pg_dsn: str
) -> None:
    _, queue = gapped
    built = projector(queue, pg_dsn)
    with pytest.raises(ProjectorGap) as gap:
        await asyncio.wait_for(built.run(asyncio.Event()), 10)
    message = str(gap.value)
    assert "events 1..6 were purged" in message and "oldest event kept 7" in message and "docs/ledger.md" in message
    assert "\n" not in message
    requests, _, cursor = await ledger_rows(pg_dsn)
    assert (requests, cursor) == ({}, 0), "nothing written past a gap"
    with pytest.raises(ProjectorGap):
        await rebuild(queue, pg_dsn, SET_ID)  # the log cannot give the ledger back either


async def test_a_rebuild_writes_the_same_ledger_again_and_waits_for_no_one(queue: QueueClient, pg_dsn: str) -> None:
    traffic = Traffic(queue, seed=13)
    for _ in range(15):
        await traffic.round()
    built = projector(queue, pg_dsn, batch_max=100)
    async with running(built):
        await until(lambda: caught_up(queue, built))
        with pytest.raises(RebuildRefused, match="another projector is active"):
            await rebuild(queue, pg_dsn, SET_ID)
    before = await ledger_rows(pg_dsn)
    assert await rebuild(queue, pg_dsn, SET_ID) == len(before[0])
    assert await ledger_rows(pg_dsn) == ({}, {}, 0)
    again = projector(queue, pg_dsn, batch_max=100)
    async with running(again):
        await until(lambda: caught_up(queue, again))
    after = await ledger_rows(pg_dsn)
    assert _plain(after) == _plain(before)
    await assert_ledger_matches_store(queue, pg_dsn)


def _plain(rows: tuple[dict, dict, int]) -> object:  # type: ignore[type-arg]
    requests, attempts, cursor = rows
    return ({k: dict(v) for k, v in requests.items()}, {k: dict(v) for k, v in attempts.items()}, cursor)
