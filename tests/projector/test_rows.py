"""The fold from events to ledger rows, on hand-made events: what each event type does to a
request and its attempts, within one batch and across two, and what stops it."""

from __future__ import annotations

import pytest

from ledger.kinds import Money
from ledger.states import AttemptOutcome, LedgerState, attempt_outcome_of
from queues.model import Event, EventType, EventValue
from services.projector.rows import (
    AttemptEnd,
    MessageFacts,
    ProjectionError,
    RequestChange,
    facts_needed,
    fold,
)

FACTS = {7: MessageFacts(money=Money(500, "CNY"), edited_money=Money(450, "CNY"), statuses={2: 503})}


def event(seq: int, type_: EventType, message_id: int = 7, **data: EventValue) -> Event:
    return Event(seq=seq, log_index=seq, ts_ms=1_000 * seq, type=type_, message_id=message_id, kind="transfer",
                 data=dict(data))  # fmt: skip


def history() -> list[Event]:
    return [
        event(1, EventType.ENQUEUED, idempotency_key="k", ref_key="r", due_ms=1_000),
        event(2, EventType.LEASED, token=1, attempt=1, worker_id="w1", deadline_ms=9_000, lateness_ms=1_000),
        event(
            3, EventType.LEASE_EXPIRED, token=1, attempt=1, error_class="lease_expired", permanent=False, due_ms=4_000
        ),
        event(4, EventType.SUCCEEDED, token=1, attempt=1, summary="late", late=True),
        event(5, EventType.PAUSED, message_id=0, holder="h", reason="", actor=""),
    ]


def test_one_batch_folds_a_request_and_its_attempt_into_their_final_rows() -> None:
    rows = fold(history(), set_id=2, facts=FACTS)
    (request,) = rows.new_requests.values()
    assert (request.request_id, request.money, request.state, request.finished_ms) == (
        "2-7", Money(500, "CNY"), LedgerState.SUCCEEDED, 4_000)  # fmt: skip
    assert (request.attempt_count, request.event_seq, rows.last_seq, rows.events) == (1, 4, 5, 5)
    (attempt,) = rows.new_attempts.values()
    assert (attempt.outcome, attempt.error_class, attempt.started_ms, attempt.ended_ms, attempt.worker_id) == (
        AttemptOutcome.SUCCEEDED, "lease_expired", 2_000, 4_000, "w1")  # fmt: skip
    assert not rows.changes and not rows.attempt_ends


def test_split_across_batches_the_second_changes_what_the_first_created() -> None:
    events = history()
    first, second = fold(events[:2], set_id=1, facts=FACTS), fold(events[2:], set_id=1, facts={})
    assert first.new_requests[7].state is LedgerState.IN_FLIGHT
    assert second.changes == {7: RequestChange(message_id=7, state=LedgerState.SUCCEEDED, finished_ms=4_000,
                                               updated_ms=4_000, event_seq=4)}  # fmt: skip
    assert second.attempt_ends == {(7, 1): AttemptEnd(request_id="1-7", attempt=1, ended_ms=4_000,
                                                      outcome=AttemptOutcome.SUCCEEDED, error_class="lease_expired",
                                                      status=None)}  # fmt: skip


def test_failures_dead_letters_edited_redrives_and_discards() -> None:
    events = [
        event(10, EventType.LEASED, token=2, attempt=2, worker_id="w2", deadline_ms=1, lateness_ms=0),
        event(11, EventType.ATTEMPT_FAILED, token=2, attempt=2, error_class="insufficient_funds", permanent=True),
        event(12, EventType.DEAD_LETTERED, reason="permanent", attempt=2),
    ]
    rows = fold(events, set_id=1, facts=FACTS)
    assert (rows.changes[7].state, rows.changes[7].finished_ms, rows.changes[7].attempt_count) == (
        LedgerState.DEAD_LETTERED, 12_000, 2)  # fmt: skip
    attempt = rows.new_attempts[(7, 2)]
    assert (attempt.outcome, attempt.status, attempt.error_class) == (
        AttemptOutcome.FATAL_ERROR,
        503,
        "insufficient_funds",
    )
    redriven = fold([event(13, EventType.REDRIVEN, actor="a", reason="r", from_state="dead", edited=True),
                     event(14, EventType.DISCARDED, actor="a", reason="r", from_state="ready")], set_id=1, facts=FACTS)  # fmt: skip
    change = redriven.changes[7]
    assert (change.money_changed, change.money, change.state, change.finished_ms) == (
        True, Money(450, "CNY"), LedgerState.CANCELLED, 14_000)  # fmt: skip
    assert facts_needed([*events, *history()]) == {7: True}
    assert facts_needed(events) == {7: False}


def test_a_missing_fact_or_a_hole_in_the_batch_stops_the_fold() -> None:
    with pytest.raises(ProjectionError, match="no longer in the store"):
        fold(history()[:1], set_id=1, facts={})
    with pytest.raises(AssertionError, match="dense"):
        fold([history()[0], history()[2]], set_id=1, facts=FACTS)


def test_the_queues_attempt_outcomes_map_onto_the_ledgers() -> None:
    assert {attempt_outcome_of(o, permanent=False) for o in (None, "succeeded", "succeeded_late", "failed", "expired",
            "released", "interrupted")} | {attempt_outcome_of("failed", permanent=True)} == set(AttemptOutcome)  # fmt: skip
