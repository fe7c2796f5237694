"""Operator commands: redrive, discard, pauses, policies, retentions, and the purge.

Every redrive goes through `redrive_one` (a command's ids or filter, an approved proposal, a redrive
job's item), so the lifecycle check and the audited record are the same for all. Every operator
command writes its event and its audit entry in the same apply (`Entry.emit_audited`).

Must never: read a clock, or purge anything before its retention ended.
"""

from __future__ import annotations

from typing import Final

import msgspec

from delay.policy import RetryPolicy
from queues.core import dead_letters, keys, messages
from queues.core.delivery import load_current
from queues.core.entry import MIN_ROUTE_EPOCH, Entry, holders
from queues.core.port import Table
from queues.core.records import EventRow, PauseRow, encode, event_decoder
from queues.lifecycle import TERMINAL, Action, transition
from queues.model import (
    EVENTS_PURGE_MAX,
    OPERATOR_EVENT_TYPES,
    BatchResult,
    Code,
    Discard,
    ErrorResult,
    EventType,
    EventValue,
    KindResult,
    Outcome,
    PauseKind,
    Phase,
    Purge,
    QueueResult,
    Redrive,
    ResumeKind,
    RetentionResult,
    RouteFence,
    RouteResult,
    SetPolicy,
    SetRetention,
    State,
    content_hash,
    state_of,
)

KINDS_MAX: Final = 1024
PAUSE_HOLDERS_MAX: Final = 64
_OPERATOR_TYPES: Final = frozenset(t.value for t in OPERATOR_EVENT_TYPES)
_policy_encoder: Final = msgspec.msgpack.Encoder()
_replace: Final = msgspec.structs.replace


def policy_bytes(policy: RetryPolicy) -> bytes:
    """A kind's policy as the KINDS table stores it."""
    return _policy_encoder.encode(policy)


def redrive_targets(entry: Entry, command: Redrive) -> list[int] | ErrorResult:
    if command.payload is not None and (len(command.ids) != 1 or command.filter is not None):
        return ErrorResult(code=Code.INVALID, detail="an edited payload needs exactly one id")
    if bool(command.ids) == (command.filter is not None):
        return ErrorResult(code=Code.INVALID, detail="give ids or a filter, not both or neither")
    if command.filter is None:
        return list(dict.fromkeys(command.ids))
    return dead_letters.ids(entry.tx, command.filter, limit=command.limit)


def redrive(entry: Entry, command: Redrive, approval: dict[str, EventValue] | None = None) -> BatchResult | ErrorResult:
    """`approval`: the proposal and approver that released this redrive, recorded with it."""
    targets = redrive_targets(entry, command)
    if isinstance(targets, ErrorResult):
        return targets
    done: list[int] = []
    refused: list[tuple[int, Code]] = []
    for message_id in targets:
        code = redrive_one(entry, message_id, actor=command.actor, reason=command.reason, payload=command.payload,
                           approval=approval)  # fmt: skip
        if code is None:
            done.append(message_id)
        else:
            refused.append((message_id, code))
    return BatchResult(code=Code.OK, ids=tuple(done), refused=tuple(refused))


def redrive_one(
    entry: Entry, message_id: int, *, actor: str, reason: str, payload: bytes | None = None,
    approval: dict[str, EventValue] | None = None, dead_only: bool = False,
) -> Code | None:  # fmt: skip
    """Redrive one message, audited, or say why not (None: done); `dead_only` (a job) refuses a
    message that is not dead."""
    record = load_current(entry, message_id)
    if record is None:
        return Code.NOT_FOUND
    now_ms = entry.now_ms
    state = state_of(record.phase, record.due_ms, now_ms)
    if isinstance(transition(state, Action.REDRIVE), Code) or (dead_only and state is not State.DEAD):
        return Code.ILLEGAL_STATE
    after = _replace(
        record, phase=Phase.WAITING, due_ms=now_ms, budget_attempts=record.attempts, budget_start_ms=now_ms,
        token_open=False, dead_ms=None, dead_reason=None, dead_error_class=None, amount=None, currency=None,
    )  # fmt: skip
    if payload is not None:
        entry.tx.put(Table.EDITED, keys.u64(message_id), payload)
        after = _replace(after, edited=True, edited_hash=content_hash(record.kind, record.ref_key, payload),
                         payload_len=len(payload))  # fmt: skip
    messages.save(entry, record, after)
    entry.emit_audited(
        EventType.REDRIVEN, message_id, record.kind,
        {"actor": actor, "reason": reason, "from_state": state.value, "edited": payload is not None, **(approval or {})},
    )  # fmt: skip
    return None


def discard(entry: Entry, command: Discard, approval: dict[str, EventValue] | None = None) -> Outcome:
    record = load_current(entry, command.message_id)
    if record is None:
        return Outcome(code=Code.NOT_FOUND)
    now_ms = entry.now_ms
    state = state_of(record.phase, record.due_ms, now_ms)
    if isinstance(transition(state, Action.DISCARD), Code):
        return Outcome(code=Code.ILLEGAL_STATE, message_id=record.id, state=state)
    after = _replace(record, phase=Phase.DISCARDED, token_open=False, terminal_ms=now_ms,
                     purge_ms=now_ms + entry.catalog.retention(entry.tx)[0], dead_ms=None, amount=None, currency=None)  # fmt: skip
    messages.save(entry, record, after)
    data: dict[str, EventValue] = {"actor": command.actor, "reason": command.reason, "from_state": state.value}
    if command.reason_code:
        data["reason_code"] = command.reason_code
    entry.emit_audited(EventType.DISCARDED, record.id, record.kind, {**data, **(approval or {})})
    return Outcome(code=Code.OK, message_id=record.id, state=State.DISCARDED)


# ---- kinds ------------------------------------------------------------------------------------------
def pause(entry: Entry, command: PauseKind) -> QueueResult:
    tx = entry.tx
    if command.kind not in entry.catalog.kinds(tx):
        return KindResult(code=Code.UNKNOWN_KIND, kind=command.kind)
    held = holders(tx, command.kind)
    if command.holder in held:
        return KindResult(code=Code.ALREADY_PAUSED, kind=command.kind, holders=held)
    if len(held) >= PAUSE_HOLDERS_MAX:
        return KindResult(code=Code.INVALID, kind=command.kind, holders=held)
    tx.put(Table.PAUSES, keys.kind_prefix(command.kind) + command.holder.encode(),
           encode(PauseRow(command.reason, entry.now_ms)))  # fmt: skip
    entry.catalog.forget_pauses()
    entry.emit_audited(EventType.PAUSED, 0, command.kind,
                       {"holder": command.holder, "reason": command.reason, "actor": command.actor})  # fmt: skip
    return KindResult(code=Code.OK, kind=command.kind, holders=holders(tx, command.kind))


def resume(entry: Entry, command: ResumeKind) -> QueueResult:
    tx = entry.tx
    if command.kind not in entry.catalog.kinds(tx):
        return KindResult(code=Code.UNKNOWN_KIND, kind=command.kind)
    held = holders(tx, command.kind)
    if command.holder not in held:
        return KindResult(code=Code.NOT_PAUSED, kind=command.kind, holders=held)
    tx.delete(Table.PAUSES, keys.kind_prefix(command.kind) + command.holder.encode())
    entry.catalog.forget_pauses()
    held = holders(tx, command.kind)
    entry.emit_audited(EventType.RESUMED, 0, command.kind,
                       {"holder": command.holder, "still_paused": bool(held), "actor": command.actor})  # fmt: skip
    return KindResult(code=Code.OK, kind=command.kind, holders=held)


def set_policy(entry: Entry, command: SetPolicy) -> QueueResult:
    problems = command.policy.problems()
    if problems:
        return ErrorResult(code=Code.INVALID, detail="; ".join(problems)[:200])
    tx = entry.tx
    before = entry.catalog.kinds(tx).get(command.kind)
    if before is None and tx.count(Table.KINDS) >= KINDS_MAX:
        return ErrorResult(code=Code.INVALID, detail=f"more than {KINDS_MAX} kinds")
    tx.put(Table.KINDS, command.kind.encode(), policy_bytes(command.policy))
    entry.catalog.forget_kinds()
    entry.emit_audited(
        EventType.POLICY_SET, 0, command.kind,
        {"policy": msgspec.json.encode(command.policy).decode(), "actor": command.actor, "reason": command.reason,
         "policy_before": None if before is None else msgspec.json.encode(before).decode()},
    )  # fmt: skip
    return KindResult(code=Code.OK, kind=command.kind, holders=holders(tx, command.kind), policy_before=before)


def set_retention(entry: Entry, command: SetRetention) -> QueueResult:
    floor = entry.config.retention_floor_ms
    wanted = {"retention_ms": command.retention_ms, "event_retention_ms": command.event_retention_ms}
    given = {name: value for name, value in wanted.items() if value is not None}
    if not given:
        return ErrorResult(code=Code.INVALID, detail="set retention_ms, event_retention_ms or both")
    short = [name for name, value in given.items() if value < floor]
    if short:
        return ErrorResult(code=Code.INVALID, detail=f"{', '.join(short)} under the floor of {floor} ms")
    before = entry.catalog.retention(entry.tx)
    for name, value in sorted(given.items()):
        entry.tx.put(Table.SETTINGS, name.encode(), encode(value))
    entry.catalog.forget_retention()
    after = (given.get("retention_ms", before[0]), given.get("event_retention_ms", before[1]))
    entry.emit_audited(
        EventType.RETENTION_SET, 0, "",
        {"actor": command.actor, "reason": command.reason, "retention_ms": after[0],
         "event_retention_ms": after[1], "retention_ms_before": before[0], "event_retention_ms_before": before[1]},
    )  # fmt: skip
    return RetentionResult(code=Code.OK, retention_ms=after[0], event_retention_ms=after[1])


def route_fence(entry: Entry, command: RouteFence) -> QueueResult:
    """Raise the set's minimum route epoch, never lower it (a repeat, or an older fence, changes
    nothing and writes no audit entry): adding a set fences every set of the epoch before."""
    before = entry.catalog.min_route_epoch(entry.tx)
    if command.epoch <= before:
        return RouteResult(code=Code.OK, min_route_epoch=before)
    entry.tx.put(Table.SETTINGS, MIN_ROUTE_EPOCH, encode(command.epoch))
    entry.catalog.forget_route_epoch()
    entry.emit_audited(
        EventType.ROUTE_FENCED, 0, "",
        {"actor": command.actor, "reason": command.reason, "min_route_epoch": command.epoch,
         "min_route_epoch_before": before},
    )  # fmt: skip
    return RouteResult(code=Code.OK, min_route_epoch=command.epoch)


# ---- purge ------------------------------------------------------------------------------------------
def purge(entry: Entry, command: Purge) -> QueueResult:
    tx, now_ms = entry.tx, entry.now_ms
    purged = messages.purgeable(tx, now_ms, command.limit)
    for message_id in purged:
        record = messages.load(tx, message_id)
        assert record is not None and state_of(record.phase, 0, now_ms) in TERMINAL
        messages.remove(entry, record)
        entry.emit(EventType.PURGED, message_id, record.kind, {})
    return BatchResult(code=Code.OK, ids=tuple(purged), events_purged=purge_events(entry))


def purge_events(entry: Entry) -> int:
    """Delete the oldest events past their retention, at most EVENTS_PURGE_MAX: a prefix of the
    log, so a reader's gap is always at its start. O(EVENTS_PURGE_MAX): the entry time never goes
    backwards, so the events past their retention are the first ones by seq."""
    tx = entry.tx
    cutoff = entry.now_ms - entry.catalog.retention(tx)[1]
    doomed: list[tuple[bytes, EventRow]] = []
    for key, value in tx.scan(Table.EVENTS):
        row = event_decoder.decode(value)
        if row.ts_ms > cutoff or len(doomed) == EVENTS_PURGE_MAX:
            break
        doomed.append((key, row))
    for key, row in doomed:
        tx.delete(Table.EVENTS, key)
        if row.type in _OPERATOR_TYPES:
            tx.delete(Table.OPERATOR_EVENTS, keys.pair(row.message_id, keys.u64_of(key)))
    return len(doomed)
