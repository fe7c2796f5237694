"""From a batch of the store's committed events to the compensation ledger's row changes.

Owns: the mapping of each event type onto the ledger (docs/ledger.md has the table), folded over
one batch so that a request touched by many events in the batch is written once, in its state
after the batch's last event. A batch is a prefix of the log after the cursor, so the ledger it
leaves is the ledger of that prefix.

Must never: do I/O or read a clock. What the events do not carry (a request's amount, a failed
call's HTTP status) arrives as `MessageFacts` read by the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final

from ledger.kinds import Money
from ledger.request_ids import RequestId
from ledger.states import LEDGER_STATE_OF, AttemptOutcome, LedgerState, attempt_outcome_of
from queues.model import Event, EventType, State

_STATE_AFTER: Final[Mapping[EventType, State]] = {
    EventType.ENQUEUED: State.READY,
    EventType.LEASED: State.LEASED,
    EventType.SUCCEEDED: State.DONE,
    EventType.RELEASED: State.READY,
    EventType.DEAD_LETTERED: State.DEAD,
    EventType.REDRIVEN: State.READY,
    EventType.DISCARDED: State.DISCARDED,
}
"""The queue state a message is in after the event (READY stands for "waiting": delayed or ready
are one ledger state). A failed or expired attempt leaves it waiting when the event has its next
due time, else its dead_lettered event follows."""

_FINISHING: Final = frozenset({EventType.SUCCEEDED, EventType.DEAD_LETTERED, EventType.DISCARDED})
_ENDING: Final = frozenset({EventType.SUCCEEDED, EventType.ATTEMPT_FAILED, EventType.LEASE_EXPIRED, EventType.RELEASED})


class ProjectionError(RuntimeError):
    """The batch cannot be projected faithfully (a fact it needs is gone): stop, never guess."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageFacts:
    """What the ledger needs about a message that its events do not carry."""

    money: Money | None
    """Of the payload it was enqueued with (None: the kind has no amount, or no valid payload, or
    the batch did not need it)."""
    edited_money: Money | None
    """Of the payload an operator's redrive replaced it with (None when never edited)."""
    statuses: Mapping[int, int]
    """attempt -> the downstream's HTTP status, for failed attempts whose answer had one."""


@dataclasses.dataclass(slots=True, kw_only=True)
class RequestRow:
    """A request enqueued in this batch: a new row."""

    request_id: str
    set_id: int
    message_id: int
    kind: str
    idempotency_key: str
    ref_key: str
    money: Money | None
    state: LedgerState
    created_ms: int
    finished_ms: int | None
    attempt_count: int
    updated_ms: int
    event_seq: int


@dataclasses.dataclass(slots=True, kw_only=True)
class RequestChange:
    """A request enqueued before this batch: the columns its events changed."""

    message_id: int
    state: LedgerState | None = None
    finished_ms: int | None = None
    """Meaningful when `state` is set: finished exactly when the state is not open."""
    attempt_count: int | None = None
    money_changed: bool = False
    money: Money | None = None
    updated_ms: int = 0
    event_seq: int = 0


@dataclasses.dataclass(slots=True, kw_only=True)
class AttemptRow:
    """An attempt begun in this batch (perhaps also ended in it)."""

    request_id: str
    attempt: int
    token: int
    worker_id: str
    started_ms: int
    lateness_ms: int
    ended_ms: int | None = None
    outcome: AttemptOutcome = AttemptOutcome.IN_PROGRESS
    error_class: str | None = None
    status: int | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class AttemptEnd:
    """An attempt begun before this batch that ended (or ended again: a late ack) in it."""

    request_id: str
    attempt: int
    ended_ms: int
    outcome: AttemptOutcome
    error_class: str | None
    """None keeps the recorded one (an ack after an expiry keeps "lease_expired", as the queue does)."""
    status: int | None


@dataclasses.dataclass(slots=True, kw_only=True)
class BatchRows:
    new_requests: dict[int, RequestRow] = dataclasses.field(default_factory=dict)
    changes: dict[int, RequestChange] = dataclasses.field(default_factory=dict)
    new_attempts: dict[tuple[int, int], AttemptRow] = dataclasses.field(default_factory=dict)
    attempt_ends: dict[tuple[int, int], AttemptEnd] = dataclasses.field(default_factory=dict)
    events: int = 0
    last_seq: int = 0
    last_ts_ms: int = 0


def facts_needed(events: Iterable[Event]) -> dict[int, bool]:
    """The messages whose facts the batch needs, in first-seen order: True when it needs their
    amounts (a new or edited request), False when only their attempts' statuses."""
    wanted: dict[int, bool] = {}
    for event in events:
        if event.type is EventType.ENQUEUED or (event.type is EventType.REDRIVEN and event.data.get("edited")):
            wanted[event.message_id] = True
        elif event.type is EventType.ATTEMPT_FAILED:
            wanted.setdefault(event.message_id, False)
    return wanted


def fold(events: Iterable[Event], *, set_id: int, facts: Mapping[int, MessageFacts]) -> BatchRows:
    """The row changes of `events` (consecutive, in seq order) for the set `set_id`."""
    rows = BatchRows()
    for event in events:
        assert rows.last_seq == 0 or event.seq == rows.last_seq + 1, "a batch is a dense run of the log"
        rows.events += 1
        rows.last_seq, rows.last_ts_ms = event.seq, event.ts_ms
        if event.message_id:
            _apply(rows, event, set_id, facts)
    return rows


def _apply(rows: BatchRows, event: Event, set_id: int, facts: Mapping[int, MessageFacts]) -> None:
    if event.type is EventType.ENQUEUED:
        _enqueued(rows, event, set_id, facts)
        return
    if event.type is EventType.PURGED:
        return  # the ledger keeps what the store forgets
    request_id = str(RequestId(set_id, event.message_id))
    target = rows.new_requests.get(event.message_id) or rows.changes.setdefault(
        event.message_id, RequestChange(message_id=event.message_id)
    )
    target.updated_ms, target.event_seq = event.ts_ms, event.seq
    state = _STATE_AFTER.get(event.type)
    if state is None and event.type in (EventType.ATTEMPT_FAILED, EventType.LEASE_EXPIRED) and "due_ms" in event.data:
        state = State.READY
    if state is not None:
        target.state = LEDGER_STATE_OF[state.value]
        target.finished_ms = event.ts_ms if event.type in _FINISHING else None
    if event.type is EventType.LEASED:
        target.attempt_count = _int(event, "attempt")
        _leased(rows, event, request_id)
    elif event.type in _ENDING:
        _ended(rows, event, request_id, facts)
    elif event.type is EventType.REDRIVEN and event.data.get("edited"):
        money = _facts(facts, event).edited_money
        if isinstance(target, RequestRow):
            target.money = money
        else:
            target.money_changed, target.money = True, money


def _enqueued(rows: BatchRows, event: Event, set_id: int, facts: Mapping[int, MessageFacts]) -> None:
    if event.message_id in rows.new_requests:
        raise ProjectionError(f"event {event.seq} enqueues message {event.message_id} a second time")
    rows.new_requests[event.message_id] = RequestRow(
        request_id=str(RequestId(set_id, event.message_id)),
        set_id=set_id,
        message_id=event.message_id,
        kind=event.kind,
        idempotency_key=_text(event, "idempotency_key"),
        ref_key=_text(event, "ref_key"),
        money=_facts(facts, event).money,
        state=LEDGER_STATE_OF[State.READY.value],
        created_ms=event.ts_ms,
        finished_ms=None,
        attempt_count=0,
        updated_ms=event.ts_ms,
        event_seq=event.seq,
    )


def _leased(rows: BatchRows, event: Event, request_id: str) -> None:
    attempt = _int(event, "attempt")
    rows.new_attempts[(event.message_id, attempt)] = AttemptRow(
        request_id=request_id,
        attempt=attempt,
        token=_int(event, "token"),
        worker_id=_text(event, "worker_id"),
        started_ms=event.ts_ms,
        lateness_ms=_int(event, "lateness_ms"),
    )


def _ended(rows: BatchRows, event: Event, request_id: str, facts: Mapping[int, MessageFacts]) -> None:
    attempt = _int(event, "attempt")
    outcome, error_class, status = _ending(event, facts)
    begun = rows.new_attempts.get((event.message_id, attempt))
    if begun is not None:
        begun.ended_ms, begun.outcome = event.ts_ms, outcome
        begun.error_class = error_class or begun.error_class
        begun.status = status if status is not None else begun.status
        return
    key = (event.message_id, attempt)
    earlier = rows.attempt_ends.get(key)
    if earlier is not None:  # ended twice in one batch: an expiry, then a late ack
        error_class = error_class or earlier.error_class
        status = status if status is not None else earlier.status
    rows.attempt_ends[key] = AttemptEnd(request_id=request_id, attempt=attempt, ended_ms=event.ts_ms,
                                        outcome=outcome, error_class=error_class, status=status)  # fmt: skip


def _ending(event: Event, facts: Mapping[int, MessageFacts]) -> tuple[AttemptOutcome, str | None, int | None]:
    if event.type is EventType.SUCCEEDED:
        return AttemptOutcome.SUCCEEDED, None, None
    if event.type is EventType.RELEASED:
        return (
            attempt_outcome_of("interrupted" if event.data.get("interrupted") else "released", permanent=False),
            None,
            None,
        )
    error_class = _text(event, "error_class")
    if event.type is EventType.LEASE_EXPIRED:
        return attempt_outcome_of("expired", permanent=False), error_class, None
    status = _facts(facts, event).statuses.get(_int(event, "attempt"))
    return attempt_outcome_of("failed", permanent=bool(event.data.get("permanent"))), error_class, status


def _facts(facts: Mapping[int, MessageFacts], event: Event) -> MessageFacts:
    found = facts.get(event.message_id)
    if found is None:
        raise ProjectionError(
            f"message {event.message_id} (event {event.seq}, {event.type.value}) is no longer in the store:"
            " the projector fell behind the store's message retention; see docs/ledger.md ('A gap')"
        )
    return found


def _int(event: Event, name: str) -> int:
    value = event.data.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProjectionError(f"event {event.seq} ({event.type.value}) has no integer {name!r}")
    return value


def _text(event: Event, name: str) -> str:
    value = event.data.get(name)
    if not isinstance(value, str):
        raise ProjectionError(f"event {event.seq} ({event.type.value}) has no text {name!r}")
    return value
