"""Queries and the scenarios behind the issue's complaints, driven through apply_batch bytes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from local_reads import LocalReads
from queue_node import T0, CountingView, CountingWrite, Node

from delay.policy import DAY_MS, HOUR_MS, RetryPolicy
from queues.client import EventsPurged, QueueClient
from queues.core import messages, operator
from queues.core import reads as queries
from queues.core.entry import Catalog, Entry
from queues.core.port import Table
from queues.machine import QueueConfig
from queues.model import (
    EVENTS_PURGE_MAX,
    Ack,
    BatchResult,
    Code,
    DeadLetterFilter,
    Enqueue,
    EnqueueResult,
    EventType,
    Fail,
    PauseKind,
    Purge,
    Redrive,
    ResumeKind,
    RetentionResult,
    SetPolicy,
    SetRetention,
    State,
    content_hash,
)
from queues.replicated import ReplicatedQueueMachine


def test_by_id_and_by_ref_key_with_history() -> None:
    node = Node()
    first = node.enqueue("a", ref="packet-1")
    node.enqueue("b", ref="packet-2")
    (grant,) = node.lease(1).grants
    node.now_ms += 1000
    node.apply(Fail(message_id=grant.message_id, token=grant.token, error_class="timeout", error_text="slow"))
    view = queries.get_message(node.machine.view, first, now_ms=node.now_ms)
    assert view is not None and view.state is State.DELAYED and view.attempts == 1
    assert view.history[0].outcome == "failed" and view.history[0].error_text == "slow"
    assert queries.get_message(node.machine.view, 999, now_ms=node.now_ms) is None
    second = node.enqueue("c", ref="packet-1")
    by_ref = queries.by_ref_key(node.machine.view, "packet-1", now_ms=node.now_ms)
    assert [m.message_id for m in by_ref] == [first, second]
    assert len(by_ref[0].history) == 1


def test_dedup_window_is_days_not_minutes() -> None:
    node = Node()
    message_id = node.enqueue("pay-1")
    (grant,) = node.lease().grants
    assert node.apply(Ack(message_id=message_id, token=grant.token)).code is Code.OK
    node.now_ms += 6 * DAY_MS
    again = node.apply(Enqueue(kind="transfer", idempotency_key="pay-1", ref_key="order-1", payload=b"pay-1"))
    assert again == EnqueueResult(code=Code.EXISTS, message_id=message_id, state=State.DONE, due_ms=T0)
    other = node.apply(Enqueue(kind="transfer", idempotency_key="pay-1", ref_key="order-1", payload=b"other"))
    assert other.code is Code.CONFLICT
    node.now_ms += DAY_MS + 1
    purged = node.apply(Purge(limit=100))
    assert isinstance(purged, BatchResult) and purged.ids == (message_id,)
    fresh = node.apply(Enqueue(kind="transfer", idempotency_key="pay-1", ref_key="order-1", payload=b"pay-1"))
    assert fresh.code is Code.OK and fresh.message_id != message_id  # type: ignore[union-attr]


def test_dead_letters_filters_and_cursor_pagination() -> None:
    node = Node()
    for i in range(7):
        node.enqueue(f"t{i}", kind="transfer" if i % 2 else "callback", ref=f"r{i % 3}")
    for grant in node.lease(7).grants:
        node.now_ms += 10
        node.kill(grant.message_id, grant.token, "insufficient_funds" if grant.message_id < 5 else "bad_url")
    conn = node.machine.view
    everything = DeadLetterFilter()
    seen: list[int] = []
    cursor = None
    while True:
        page = queries.dead_letters(conn, everything, now_ms=node.now_ms, cursor=cursor, limit=3)
        seen.extend(m.message_id for m in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
        node.enqueue(f"late-{cursor}")  # new traffic does not disturb the pages
    assert sorted(seen) == list(range(1, 8)) and len(seen) == 7
    assert all(m.state is State.DEAD and m.dead_reason == "permanent_error" for m in page.items)

    def ids(**kwargs: object) -> list[int]:
        found = queries.dead_letters(conn, DeadLetterFilter(**kwargs), now_ms=node.now_ms, limit=100)  # type: ignore[arg-type]
        return sorted(m.message_id for m in found.items)

    assert ids(kind="transfer") == [2, 4, 6]
    assert ids(error_class="bad_url") == [5, 6, 7]
    assert ids(ref_key="r0") == [1, 4, 7]
    dead_ms = {m: queries.get_message(conn, m, now_ms=node.now_ms).dead_ms for m in range(1, 8)}  # type: ignore[union-attr]
    assert ids(dead_from_ms=dead_ms[3], dead_to_ms=dead_ms[5]) == [3, 4]

    redriven = node.apply(
        Redrive(
            actor="ops", reason="funds topped up", filter=DeadLetterFilter(error_class="insufficient_funds")
        )
    )
    assert isinstance(redriven, BatchResult) and redriven.ids == (1, 2, 3, 4)
    assert ids() == [5, 6, 7]


def test_edited_payload_is_kept_beside_the_original() -> None:
    node = Node()
    message_id = node.enqueue("x")
    (grant,) = node.lease().grants
    assert grant.payload_hash == content_hash("transfer", "order-1", b"x")
    node.kill(message_id, grant.token)
    node.apply(Redrive(actor="ops", reason="fix account", ids=(message_id,), payload=b"corrected"))
    (again,) = node.lease().grants
    assert again.payload == b"corrected" and again.attempt == 2
    assert again.payload_hash == content_hash("transfer", "order-1", b"corrected")  # the edit's own hash
    view = queries.get_message(node.machine.view, message_id, now_ms=node.now_ms)
    assert view is not None and view.payload == b"x" and view.edited_payload == b"corrected"
    invalid = node.apply(Redrive(actor="o", reason="r", filter=DeadLetterFilter(), payload=b"no"))
    assert invalid.code is Code.INVALID


def test_counts_and_oldest_due_age() -> None:
    node = Node()
    node.enqueue("a")
    node.enqueue("b", delay_ms=60_000)
    node.enqueue("c", kind="callback")
    node.now_ms += 5000
    conn = node.machine.view
    counts = {(c.kind, c.state): c.count for c in queries.counts(conn, now_ms=node.now_ms)}
    assert counts == {
        ("callback", State.READY): 1,
        ("transfer", State.DELAYED): 1,
        ("transfer", State.READY): 1,
    }
    assert queries.oldest_due_age_ms(conn, now_ms=node.now_ms) == {"callback": 5000, "transfer": 5000}
    node.lease(1, kinds=("callback",))
    counts = {(c.kind, c.state): c.count for c in queries.counts(conn, now_ms=node.now_ms + 60_000)}
    assert counts[("callback", State.LEASED)] == 1 and counts[("transfer", State.READY)] == 2


def test_fair_across_kinds_a_flood_does_not_starve_the_rest() -> None:
    node = Node()
    node.apply_many(
        [Enqueue(kind="transfer", idempotency_key=f"t{i}", ref_key="r", payload=b"") for i in range(500)]
    )
    node.now_ms += 1
    node.enqueue("cb", kind="callback")
    node.enqueue("lu", kind="list_update")
    kinds = [g.kind for g in node.lease(3).grants]
    assert sorted(kinds) == ["callback", "list_update", "transfer"]


def test_pause_holders_do_not_undo_each_other() -> None:
    node = Node()
    node.enqueue("a")
    node.apply(PauseKind(kind="transfer", holder="alice", reason="bank outage"))
    node.apply(PauseKind(kind="transfer", holder="bob", reason="audit"))
    assert node.lease().grants == ()
    node.apply(ResumeKind(kind="transfer", holder="alice"))
    assert node.lease().grants == ()  # bob still holds it
    assert node.apply(ResumeKind(kind="transfer", holder="alice")).code is Code.NOT_PAUSED
    node.apply(ResumeKind(kind="transfer", holder="bob"))
    assert len(node.lease().grants) == 1


def test_burst_due_in_one_second_is_drained_oldest_first_in_batches() -> None:
    node = Node()
    node.apply_many(
        [
            Enqueue(kind="transfer", idempotency_key=f"b{i}", ref_key="r", payload=b"", delay_ms=10_000)
            for i in range(3000)
        ]
    )
    assert node.lease().grants == ()  # delayed: invisible to lease, visible to counts
    node.now_ms += 10_000
    leased: list[int] = []
    while batch := node.lease(1000).grants:
        leased.extend(g.message_id for g in batch)
        assert all(g.due_ms <= node.now_ms for g in batch)
    assert leased == list(range(1, 3001))


def test_lease_and_expiry_scans_read_their_batch_not_the_backlog() -> None:
    node = Node()
    node.apply_many([Enqueue(kind="transfer", idempotency_key=f"later{i}", ref_key="r", payload=b"", delay_ms=HOUR_MS)
                     for i in range(1000)])  # fmt: skip
    for i in range(5):
        node.enqueue(f"now{i}")
    counting = CountingView(node.machine.view)
    due = list(messages.due(counting, "transfer", node.now_ms))
    assert len(due) == 5 and counting.scans == {Table.DUE: 5}  # O(batch): the 1000 delayed are never read
    node.lease(3)
    node.now_ms += 60_000  # the three leases are past their deadline
    counting = CountingView(node.machine.view)
    assert len(messages.expired_leases(counting, node.now_ms, limit=2)) == 2
    assert counting.scans == {Table.LEASES: 2} and counting.gets == {}


def test_events_after_a_sequence_number() -> None:
    node = Node()
    node.enqueue("a")
    node.apply(SetPolicy(kind="refund", policy=RetryPolicy(tiers_ms=(1000,), attempts_max=2)))
    node.enqueue("r", kind="refund")
    (_, g2) = node.lease().grants
    node.apply(Fail(message_id=g2.message_id, token=g2.token, error_class="timeout"))
    events = queries.events_after(node.machine.view, 0)
    assert [e.type for e in events] == [
        EventType.ENQUEUED, EventType.POLICY_SET, EventType.ENQUEUED, EventType.LEASED, EventType.LEASED,
        EventType.ATTEMPT_FAILED,
    ]  # fmt: skip
    assert [e.seq for e in queries.events_after(node.machine.view, 4)] == [5, 6]


def test_events_past_their_retention_are_purged_oldest_first_and_the_gap_shows() -> None:
    node = Node(config=QueueConfig(event_retention_ms=60_000))
    conn = node.machine.view
    node.apply_many([Enqueue(kind="transfer", idempotency_key=f"a{i}", ref_key="r", payload=b"") for i in range(3)])
    node.now_ms += 30_000
    node.enqueue("b")
    assert queries.first_event_seq(conn) == 1
    node.now_ms += 29_999
    assert node.apply(Purge()) == BatchResult(code=Code.OK)  # 1 ms short of their retention: kept
    node.now_ms += 1  # the first three are exactly at their retention: purged
    assert node.apply(Purge()) == BatchResult(code=Code.OK, events_purged=3)
    assert queries.first_event_seq(conn) == 4
    assert [e.seq for e in queries.events_after(conn, 0)] == [4]
    assert node.apply(Purge()) == BatchResult(code=Code.OK)  # b is 30 s old: kept
    node.now_ms += 30_000
    assert node.apply(Purge()).events_purged == 1  # type: ignore[union-attr]
    assert queries.events_after(conn, 0) == []
    assert queries.first_event_seq(conn) == 5  # none kept: the next one to be written


def test_event_purge_is_bounded_per_command_and_reads_no_more_than_it_deletes() -> None:
    node = Node(config=QueueConfig(event_retention_ms=1_000))
    count = EVENTS_PURGE_MAX + 5
    for start in range(0, count, 1000):
        node.apply_many([
            Enqueue(kind="transfer", idempotency_key=f"k{i}", ref_key="r", payload=b"")
            for i in range(start, min(count, start + 1000))
        ])  # fmt: skip
    node.now_ms += 1_000
    assert node.apply(Purge()).events_purged == EVENTS_PURGE_MAX  # type: ignore[union-attr]
    assert node.apply(Purge()).events_purged == 5  # type: ignore[union-attr]
    node.apply_many([Enqueue(kind="transfer", idempotency_key=f"n{i}", ref_key="r", payload=b"") for i in range(50)])
    node.now_ms += 1_000
    node.apply_many([Enqueue(kind="transfer", idempotency_key=f"m{i}", ref_key="r", payload=b"") for i in range(50)])
    node.index += 1
    with node.machine.store.write() as tx:  # a purge by hand, its reads counted: the prefix it deletes, and one more
        counting = CountingWrite(tx)
        assert operator.purge_events(Entry(counting, node.index, node.now_ms, Catalog(node.machine.config),
                                           responding=True)) == 50  # fmt: skip
    assert counting.scans[Table.EVENTS] == 51


def test_retention_is_set_at_runtime_on_every_replica_alike_and_audited(tmp_path: Path) -> None:
    node = Node(str(tmp_path / "a.db"))
    conn = node.machine.view
    assert node.apply(SetRetention(actor="ops", reason="r")).code is Code.INVALID  # nothing to set
    short = node.apply(SetRetention(actor="ops", reason="r", retention_ms=DAY_MS - 1))
    assert short.code is Code.INVALID and "floor" in short.detail  # type: ignore[union-attr]
    assert conn.count(Table.SETTINGS) == 0
    early = node.enqueue("early")
    (grant,) = node.lease().grants
    node.apply(Ack(message_id=early, token=grant.token))  # a tombstone under the 7 days in force
    changed = node.apply(SetRetention(actor="ops", reason="disk", retention_ms=2 * DAY_MS, event_retention_ms=DAY_MS))
    assert changed == RetentionResult(code=Code.OK, retention_ms=2 * DAY_MS, event_retention_ms=DAY_MS)
    (audit,) = [e for e in queries.events_after(conn, 0) if e.type is EventType.RETENTION_SET]
    assert audit.data == {
        "actor": "ops", "reason": "disk", "retention_ms": 2 * DAY_MS, "event_retention_ms": DAY_MS,
        "retention_ms_before": 7 * DAY_MS, "event_retention_ms_before": 7 * DAY_MS,
    }  # fmt: skip
    late = node.enqueue("late")
    (grant,) = node.lease().grants
    node.apply(Ack(message_id=late, token=grant.token))  # a tombstone under the new 2 days

    index = node.machine.write_snapshot(tmp_path / "snap.db")  # the setting travels with the state
    node = Node(str(tmp_path / "b.db"))
    node.machine.restore_snapshot(tmp_path / "snap.db", index)
    node.index = index
    conn = node.machine.view
    node.now_ms += DAY_MS  # events are a day old: past the new event retention
    purged = node.apply(Purge())
    assert isinstance(purged, BatchResult) and purged.ids == () and purged.events_purged > 0
    node.now_ms += DAY_MS  # 2 days: the late tombstone goes, the early one keeps its 7 days
    assert node.apply(Purge()).ids == (late,)  # type: ignore[union-attr]
    assert node.apply(SetRetention(actor="ops", reason="more", event_retention_ms=3 * DAY_MS)) == RetentionResult(
        code=Code.OK, retention_ms=2 * DAY_MS, event_retention_ms=3 * DAY_MS
    )  # one value changed, the other kept
    node.now_ms += 5 * DAY_MS
    assert node.apply(Purge()).ids == (early,)  # type: ignore[union-attr]


def test_snapshot_of_a_file_store_restores_into_a_fresh_node(tmp_path: Path) -> None:
    node = Node(str(tmp_path / "a.db"))
    for i in range(20):
        node.enqueue(f"k{i}", delay_ms=i * 1000)
    node.lease(5)
    index = node.machine.write_snapshot(tmp_path / "snap.db")
    other = Node(str(tmp_path / "b.db"))
    other.machine.restore_snapshot(tmp_path / "snap.db", index)
    assert other.machine.store_digest() == node.machine.store_digest()  # every table, byte for byte
    other.index = index
    other.now_ms += 10_000
    assert [g.token for g in other.lease(2).grants] == [2, 3]  # the token counter survived (1 was granted)


def test_a_reader_behind_the_event_retention_is_told_not_skipped() -> None:
    clock = [T0]
    machine = ReplicatedQueueMachine(":memory:", QueueConfig(event_retention_ms=60_000), clock_ms=lambda: clock[0])
    node = Node()
    node.machine.close()
    node.machine = machine
    node.apply_many([Enqueue(kind="transfer", idempotency_key=f"a{i}", ref_key="r", payload=b"") for i in range(3)])
    node.now_ms += 60_000
    node.enqueue("b")
    assert node.apply(Purge()).events_purged == 3  # type: ignore[union-attr]
    client = QueueClient(LocalReads(machine))  # type: ignore[arg-type]

    with pytest.raises(EventsPurged) as gap:
        asyncio.run(client.events_after(0))
    assert (gap.value.after, gap.value.first_seq) == (0, 4)
    with pytest.raises(EventsPurged):
        asyncio.run(client.events_after(2))
    assert [e.seq for e in asyncio.run(client.events_after(3)).value] == [4]  # no gap after 3
    assert asyncio.run(client.events_after(4)).value == ()
    in_force = asyncio.run(client.retention()).value
    assert (in_force.retention_ms, in_force.event_retention_ms, in_force.floor_ms) == (7 * DAY_MS, 60_000, DAY_MS)
    node.apply(SetRetention(actor="ops", reason="r", event_retention_ms=2 * DAY_MS))
    assert asyncio.run(client.retention()).value.event_retention_ms == 2 * DAY_MS
