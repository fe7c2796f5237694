"""Delivery: leases with fairness and limits, their expiry, and the workers' extend, ack, fail and
release, fenced by tokens.

Lease expiry is applied in three places, all deterministic and all driven by the entry's time:
  * `ExpireLeases(limit)`: the leader proposes it periodically; it expires the earliest-deadline
    leases first, bounded by `limit`;
  * lazily inside every `Lease`, before granting (bounded by `QueueConfig.expire_per_lease_max`),
    so a message whose lease expired is leasable again without waiting for the periodic command;
  * lazily for the one message a command addresses (ack, fail, extend, redrive, discard), so a
    command never acts on a lease that is already past its deadline.
An expiry is a failed attempt (error class `lease_expired`, retryable) run through the kind's retry
policy. The expired token stays "open" for an ack only until the next grant: a late ack from the
worker that did the work is accepted (no needless duplicate), a late fail or extend is refused
with LEASE_EXPIRED, and anything else with a token older than the latest grant is STALE_TOKEN
(after NOT_FOUND, DONE_ELSEWHERE and ILLEGAL_STATE in the documented precedence: docs/queue.md).

Fairness: the eligible kinds (registered, unpaused, of those asked) by name, rotated by a
replicated offset that moves at every lease; grants are taken one per kind per round, oldest due
first within a kind, so a flooded kind gets at most its share of a batch.

Must never: read a clock, or grant a message that is not due.
"""

from __future__ import annotations

from typing import Final

import msgspec

from delay.policy import DeadLetter, RetryPolicy, decide
from queues import codec
from queues.core import in_doubt, messages
from queues.core.entry import Entry, holders
from queues.core.records import Attempt, MessageRecord
from queues.lifecycle import Action, transition
from queues.model import (
    ERROR_CLASS_INTERRUPTED,
    ERROR_CLASS_LEASE_EXPIRED,
    LEASE_RESULT_BYTES_MAX,
    VERSION_MAX,
    Ack,
    AckMany,
    Code,
    EventType,
    EventValue,
    ExtendLease,
    Fail,
    Grant,
    Lease,
    LeaseResult,
    Outcome,
    Outcomes,
    Phase,
    QueueResult,
    Release,
    State,
    state_of,
)

_replace: Final = msgspec.structs.replace
WAITING: Final = Phase.WAITING
LEASED: Final = Phase.LEASED
DONE: Final = Phase.DONE
DEAD: Final = Phase.DEAD


def policy(entry: Entry, kind: str) -> RetryPolicy:
    found = entry.catalog.kinds(entry.tx).get(kind)
    assert found is not None, f"message of unregistered kind {kind}"
    return found


def load_current(entry: Entry, message_id: int) -> MessageRecord | None:
    """The message, with its lease expired first if the deadline passed."""
    record = messages.load(entry.tx, message_id)
    deadline = None if record is None or record.phase is not LEASED else record.lease_deadline_ms
    if record is not None and deadline is not None and deadline <= entry.now_ms:
        return expire_one(entry, record)
    return record


def _ended(history: tuple[Attempt, ...], attempt: int, **changes: object) -> tuple[Attempt, ...]:
    """The history with attempt `attempt` (the last) closed."""
    if history and history[-1].attempt == attempt:
        return (*history[:-1], _replace(history[-1], **changes))
    return history


# ---- lease --------------------------------------------------------------------------------------------
def eligible_kinds(entry: Entry, requested: tuple[str, ...], probe: str | None = None) -> list[str]:
    """Registered kinds (of those requested), by name, that are unpaused, or paused by the probing
    holder alone."""
    paused = entry.catalog.paused(entry.tx)
    wanted = set(requested)
    return [
        kind
        for kind in entry.catalog.kinds(entry.tx)
        if (not requested or kind in wanted)
        and (kind not in paused or (probe is not None and holders(entry.tx, kind) == (probe,)))
    ]


def pick_fair(entry: Entry, kinds: list[str], count_max: int) -> list[int]:
    """Round-robin over kinds (rotating start), oldest due first within a kind: O(kinds + count)."""
    meta = entry.meta
    start = meta.rr_offset % len(kinds)
    meta.rr_offset += 1
    order = kinds[start:] + kinds[:start]
    cursors = [messages.due(entry.tx, kind, entry.now_ms) for kind in order]
    picks: list[int] = []
    while cursors and len(picks) < count_max:
        still_open = []
        for cursor in cursors:
            if len(picks) == count_max:
                break
            found = next(cursor, None)
            if found is not None:
                picks.append(found[1])
                still_open.append(cursor)
        cursors = still_open
    return picks


def _predecessors_in_doubt(entry: Entry, record: MessageRecord) -> int | None:
    """The latest in-doubt deadline still ahead among the versions an edit replaced. An edited
    version is a new message, but a request an earlier version sent may still be in flight: its
    first delivery must wait for it and look the transfer up like any re-send (issue 20). Only a
    deadline still ahead counts, so a version edited after its predecessors' requests could no
    longer land is granted as before."""
    until: int | None = None
    previous_id = record.previous_id
    for _ in range(VERSION_MAX):
        previous = None if previous_id is None else messages.load(entry.tx, previous_id)
        if previous is None:
            break
        if previous.in_doubt_until_ms is not None and previous.in_doubt_until_ms > entry.now_ms:
            until = in_doubt.fold(until, previous.in_doubt_until_ms)
        previous_id = previous.previous_id
    return until


def grant_of(entry: Entry, record: MessageRecord, *, token: int, attempt: int, deadline_ms: int) -> Grant:
    payload_hash = (record.edited_hash or b"") if record.edited else record.content_hash
    in_doubt_until = record.in_doubt_until_ms
    if record.previous_id is not None:
        in_doubt_until = in_doubt.fold(in_doubt_until, _predecessors_in_doubt(entry, record))
    return Grant(
        message_id=record.id, token=token, kind=record.kind, idempotency_key=record.idempotency_key,
        ref_key=record.ref_key, payload=messages.payload(entry.tx, record), headers=codec.decode_headers(record.headers),
        attempt=attempt, due_ms=record.due_ms, deadline_ms=deadline_ms, payload_hash=payload_hash,
        previous_error_class=record.last_error_class,
        in_doubt_ms=None if in_doubt_until is None else in_doubt_until - entry.now_ms,
        budget_attempt=attempt - record.budget_attempts,
    )  # fmt: skip


def lease(entry: Entry, command: Lease) -> QueueResult:
    expired = expire_due(entry, entry.config.expire_per_lease_max)
    kinds = eligible_kinds(entry, command.kinds, command.probe)
    if not kinds:
        return LeaseResult(code=Code.OK, expired=len(expired))
    now_ms, worker_id, meta, tx = entry.now_ms, command.worker_id, entry.meta, entry.tx
    deadline_ms = now_ms + command.lease_ms
    respond = entry.responding
    grants: list[Grant] = []
    result_bytes = 0
    for message_id in pick_fair(entry, kinds, command.count_max):
        record = messages.load(tx, message_id)
        assert record is not None and record.phase is WAITING, f"due index names message {message_id}"
        size = record.payload_len
        if grants and result_bytes + size > LEASE_RESULT_BYTES_MAX:
            break
        token = meta.next_token
        meta.next_token = token + 1
        attempt = record.attempts + 1
        if respond:
            grant = grant_of(entry, record, token=token, attempt=attempt, deadline_ms=deadline_ms)
        else:  # what the state and the session record need, without the payload
            grant = Grant(message_id=message_id, token=token, kind=record.kind, idempotency_key="", ref_key="",
                          payload=b"", headers={}, attempt=attempt, due_ms=record.due_ms, deadline_ms=deadline_ms)  # fmt: skip
        leased = _replace(
            record, phase=LEASED, attempts=attempt, token=token, token_open=True, lease_worker=worker_id,
            lease_deadline_ms=deadline_ms, history=(*record.history, Attempt(attempt, token, worker_id, now_ms)),
        )  # fmt: skip
        messages.save(entry, record, leased)
        entry.emit(
            EventType.LEASED, message_id, record.kind,
            {"token": token, "attempt": attempt, "worker_id": worker_id, "deadline_ms": deadline_ms,
             "lateness_ms": now_ms - record.due_ms},
        )  # fmt: skip
        grants.append(grant)
        result_bytes += size
    return LeaseResult(code=Code.OK, grants=tuple(grants), expired=len(expired))


def regrant(entry: Entry, message_id: int, token: int) -> Grant | None:
    """The grant of `token` if it is still the message's live lease, for a retried Lease."""
    record = messages.load(entry.tx, message_id)
    if record is None or record.phase is not LEASED or record.token != token:
        return None
    deadline = record.lease_deadline_ms
    if deadline is None or deadline <= entry.now_ms:
        return None
    return grant_of(entry, record, token=token, attempt=record.attempts, deadline_ms=deadline)


# ---- expiry and failure ------------------------------------------------------------------------------
def expire_due(entry: Entry, limit: int) -> list[int]:
    ids = messages.expired_leases(entry.tx, entry.now_ms, limit)
    for message_id in ids:
        record = messages.load(entry.tx, message_id)
        assert record is not None
        expire_one(entry, record)
    return ids


def expire_one(entry: Entry, record: MessageRecord) -> MessageRecord:
    assert record.phase is LEASED
    return fail_attempt(entry, record, error_class=ERROR_CLASS_LEASE_EXPIRED, error_text="lease deadline passed",
                        permanent=False, not_before_ms=None, expired=True, in_doubt_ms=None)[1]  # fmt: skip


def fail_attempt(
    entry: Entry, record: MessageRecord, *, error_class: str, error_text: str, permanent: bool,
    not_before_ms: int | None, expired: bool, in_doubt_ms: int | None,
) -> tuple[Outcome, MessageRecord]:  # fmt: skip
    """Run the retry policy for the attempt that just failed (or expired) and record it, with its
    in-doubt deadline (queues/core/in_doubt.py; a reported one also holds the retry back)."""
    allowed = transition(State.LEASED, Action.EXPIRE if expired else Action.FAIL)
    assert not isinstance(allowed, Code)
    now_ms = entry.now_ms
    decision = decide(
        policy(entry, record.kind), message_id=record.id, attempt=record.attempts - record.budget_attempts,
        budget_start_ms=record.budget_start_ms, now_ms=now_ms, error_class=error_class, permanent=permanent,
        not_before_ms=not_before_ms,
    )  # fmt: skip
    history = _ended(record.history, record.attempts, ended_ms=now_ms, outcome="expired" if expired else "failed",
                     error_class=error_class, error_text=error_text)  # fmt: skip
    data: dict[str, EventValue] = {"token": record.token, "attempt": record.attempts, "error_class": error_class,
                                   "permanent": permanent}  # fmt: skip
    event = EventType.LEASE_EXPIRED if expired else EventType.ATTEMPT_FAILED
    delivery_until = in_doubt.until(lease_deadline_ms=record.lease_deadline_ms, now_ms=now_ms, in_doubt_ms=in_doubt_ms)
    in_doubt_until = in_doubt.fold(record.in_doubt_until_ms, delivery_until)
    # An expired token stays open for a late ack; an explicit fail consumes it.
    if isinstance(decision, DeadLetter):
        after = _replace(
            record, phase=DEAD, token_open=expired, lease_worker=None, lease_deadline_ms=None,
            last_error_class=error_class, last_error_text=error_text, dead_ms=now_ms, dead_reason=decision.reason.value,
            dead_error_class=error_class, history=history, in_doubt_until_ms=in_doubt_until,
        )  # fmt: skip
        after = messages.with_money(entry.tx, after)
        messages.save(entry, record, after)
        entry.emit(event, record.id, record.kind, data)
        entry.emit(EventType.DEAD_LETTERED, record.id, record.kind,
                   {"reason": decision.reason.value, "attempt": record.attempts})  # fmt: skip
        assert State.DEAD in allowed
        return Outcome(code=Code.OK, message_id=record.id, state=State.DEAD), after
    due_ms = decision.due_ms
    if in_doubt_ms is not None and delivery_until is not None:  # a reported deadline holds the retry back
        due_ms = max(due_ms, delivery_until)
    after = _replace(
        record, phase=WAITING, due_ms=due_ms, token_open=expired, lease_worker=None, lease_deadline_ms=None,
        last_error_class=error_class, last_error_text=error_text, history=history, in_doubt_until_ms=in_doubt_until,
    )  # fmt: skip
    messages.save(entry, record, after)
    data["due_ms"] = due_ms
    entry.emit(event, record.id, record.kind, data)
    state = state_of(WAITING, due_ms, now_ms)
    assert state in allowed
    return Outcome(code=Code.OK, message_id=record.id, state=state, due_ms=due_ms), after


# ---- per-message commands from workers ----------------------------------------------------------------
def check_token(entry: Entry, record: MessageRecord | None, token: int, action: Action) -> Outcome | None:
    """Refusal precedence: not found, done under another lease, expired lease, illegal state,
    stale token."""
    if record is None:
        return Outcome(code=Code.NOT_FOUND)
    phase = record.phase
    if phase is LEASED and record.token_open and token == record.token:
        # The common case, a live lease used by its holder (callers expire a lease past its
        # deadline first); the lifecycle allows every worker action from LEASED.
        return None
    state = state_of(phase, record.due_ms, entry.now_ms)
    if phase is DONE and token < record.token:
        return Outcome(code=Code.DONE_ELSEWHERE, message_id=record.id, state=state)
    if action is not Action.ACK and phase is not LEASED and token == record.token and record.token_open:
        return Outcome(code=Code.LEASE_EXPIRED, message_id=record.id, state=state)
    if isinstance(transition(state, action), Code):
        return Outcome(code=Code.ILLEGAL_STATE, message_id=record.id, state=state)
    if token != record.token or not record.token_open:
        return Outcome(code=Code.STALE_TOKEN, message_id=record.id, state=state)
    return None


def extend(entry: Entry, command: ExtendLease) -> QueueResult:
    record = load_current(entry, command.message_id)
    refusal = check_token(entry, record, command.token, Action.EXTEND)
    if refusal is not None:
        return refusal
    assert record is not None
    deadline_ms = entry.now_ms + command.lease_ms
    messages.save(entry, record, _replace(record, lease_deadline_ms=deadline_ms))
    entry.emit(EventType.LEASE_EXTENDED, record.id, record.kind, {"token": record.token, "deadline_ms": deadline_ms})
    return Outcome(code=Code.OK, message_id=record.id, state=State.LEASED, deadline_ms=deadline_ms)


def ack(entry: Entry, command: Ack) -> QueueResult:
    return ack_record(entry, load_current(entry, command.message_id), command)


def ack_many(entry: Entry, command: AckMany) -> QueueResult:
    """Each ack judged as a lone Ack would be, in order, against the rows as the command found
    them (a message accepted earlier in the command is done)."""
    tx, now_ms = entry.tx, entry.now_ms
    rows = {message_id: messages.load(tx, message_id) for message_id in dict.fromkeys(a.message_id for a in command.acks)}
    acked: set[int] = set()
    outcomes: list[Outcome] = []
    for one in command.acks:
        record = rows.get(one.message_id)
        if record is not None and record.id in acked:
            record = _replace(record, phase=DONE, token_open=False)
        elif (
            record is not None
            and record.phase is LEASED
            and record.lease_deadline_ms is not None
            and record.lease_deadline_ms <= now_ms
        ):
            record = load_current(entry, record.id)  # lazily expired, as for a lone ack
        outcome = ack_record(entry, record, one)
        if outcome.code is Code.OK:
            acked.add(one.message_id)
        outcomes.append(outcome)
    return Outcomes(code=Code.OK, outcomes=tuple(outcomes))


def ack_record(entry: Entry, record: MessageRecord | None, command: Ack) -> Outcome:
    """Judge one ack against its message's current row, and apply it."""
    if record is not None and record.phase is DONE and command.token == record.token:
        return Outcome(code=Code.ALREADY_ACKED, message_id=record.id, state=State.DONE)
    refusal = check_token(entry, record, command.token, Action.ACK)
    if refusal is not None:
        return refusal
    assert record is not None
    late = record.phase is not LEASED
    now_ms = entry.now_ms
    after = _replace(
        record, phase=DONE, token_open=False, lease_worker=None, lease_deadline_ms=None, terminal_ms=now_ms,
        purge_ms=now_ms + entry.catalog.retention(entry.tx)[0], dead_ms=None, amount=None, currency=None,
        history=_ended(record.history, record.attempts, ended_ms=now_ms, outcome="succeeded_late" if late else "succeeded"),
    )  # fmt: skip
    messages.save(entry, record, after)
    entry.emit(EventType.SUCCEEDED, record.id, record.kind,
               {"token": record.token, "attempt": record.attempts, "summary": command.summary, "late": late})  # fmt: skip
    return Outcome(code=Code.OK, message_id=record.id, state=State.DONE)


def fail(entry: Entry, command: Fail) -> QueueResult:
    record = load_current(entry, command.message_id)
    refusal = check_token(entry, record, command.token, Action.FAIL)
    if refusal is not None:
        return refusal
    assert record is not None
    not_before_ms = command.not_before_ms  # an older worker's Retry-After, as an absolute time
    if command.retry_after_ms is not None:  # a duration from the entry's time, on the log's clock
        not_before_ms = max(not_before_ms or 0, entry.now_ms + command.retry_after_ms)
    return fail_attempt(entry, record, error_class=command.error_class, error_text=command.error_text,
                        permanent=command.permanent, not_before_ms=not_before_ms, expired=False,
                        in_doubt_ms=command.in_doubt_ms)[0]  # fmt: skip


def release(entry: Entry, command: Release) -> QueueResult:
    record = load_current(entry, command.message_id)
    refusal = check_token(entry, record, command.token, Action.RELEASE)
    if refusal is not None:
        return refusal
    assert record is not None
    now_ms = entry.now_ms
    due_ms, delivery_until = now_ms, None
    if command.interrupted:  # it may have sent: in doubt as a failed attempt is
        delivery_until = in_doubt.until(lease_deadline_ms=record.lease_deadline_ms, now_ms=now_ms,
                                        in_doubt_ms=command.in_doubt_ms)  # fmt: skip
        if command.in_doubt_ms is not None and delivery_until is not None:
            due_ms = max(due_ms, delivery_until)
    # budget_attempts + 1: the next delivery is judged by the policy as if this one never was.
    after = _replace(
        record, phase=WAITING, due_ms=due_ms, token_open=False, lease_worker=None, lease_deadline_ms=None,
        budget_attempts=record.budget_attempts + 1,
        last_error_class=ERROR_CLASS_INTERRUPTED if command.interrupted else record.last_error_class,
        history=_ended(record.history, record.attempts, ended_ms=now_ms,
                       outcome="interrupted" if command.interrupted else "released"),
        in_doubt_until_ms=in_doubt.fold(record.in_doubt_until_ms, delivery_until),
    )  # fmt: skip
    messages.save(entry, record, after)
    entry.emit(EventType.RELEASED, record.id, record.kind,
               {"token": record.token, "attempt": record.attempts, "interrupted": command.interrupted})  # fmt: skip
    return Outcome(code=Code.OK, message_id=record.id, state=state_of(WAITING, due_ms, now_ms), due_ms=due_ms)
