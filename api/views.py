"""Documents for people and tools: one request with everything that happened to it, and the
timeline of a business id (every request of one ref key, intake to the last operator action).

Hermes and CMQ traced messages by business id; neither put operator actions beside attempts.
Here a timeline interleaves, in time order: the intake, each attempt's start and end with the
downstream's answer as the worker recorded it, each dead-lettering with its reason, and each
redrive or discard with who did it and why.

Must never: show a header that is not trace context or the original failure (the fingerprint
and producer are bookkeeping), or a stored key's producer prefix to anyone but its producer's
readers (the producer is shown as its own field).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from api.schemas import utc
from ledger.request_ids import RequestId
from ledger.states import LEDGER_STATE_OF
from queues import AuditEntry, Event, EventType, MessageView
from submission.rules import (
    HEADER_FAILURE_CLASS,
    HEADER_FAILURE_STATUS,
    HEADER_FAILURE_TEXT,
    client_key,
)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
_EVENT_DETAIL_SKIP: Final = frozenset({"actor", "reason"})


def _json(payload: bytes | None) -> dict[str, Any] | None:
    if payload is None:
        return None
    try:
        document = json.loads(payload)
    except ValueError:
        return {"undecodable_bytes": len(payload)}
    return document if isinstance(document, dict) else {"value": document}


def _failure(headers: dict[str, str]) -> dict[str, Any] | None:
    if HEADER_FAILURE_CLASS not in headers:
        return None
    status = headers.get(HEADER_FAILURE_STATUS)
    return {
        "error_class": headers[HEADER_FAILURE_CLASS], "text": headers.get(HEADER_FAILURE_TEXT),
        "http_status": int(status) if status and status.isdigit() else None,
    }  # fmt: skip


def operator_action(event: Event) -> dict[str, Any]:
    actor, reason = event.data.get("actor"), event.data.get("reason")
    return {
        "type": event.type.value, "at": utc(event.ts_ms),
        "actor": None if actor is None else str(actor), "reason": None if reason is None else str(reason),
        "detail": {k: v for k, v in event.data.items() if k not in _EVENT_DETAIL_SKIP},
    }  # fmt: skip


def audit_document(entry: AuditEntry) -> dict[str, Any]:
    """One entry of the operator audit chain (docs/review.md): who, when, what, why, before -> after."""
    return {
        "seq": entry.seq, "at": utc(entry.ts_ms), "actor": entry.actor, "action": entry.action,
        "target": entry.target, "reason": entry.reason, "before": json.loads(entry.before),
        "after": json.loads(entry.after), "hash": entry.hash.hex(),
    }  # fmt: skip


def _sibling(public_id: str, message_id: int | None) -> str | None:
    """Another version's public id: the same set as this one's."""
    parsed = RequestId.parse(public_id)
    return None if message_id is None or parsed is None else str(RequestId(parsed.set_id, message_id))


def request_document(
    view: MessageView, public_id: str, events: Iterable[Event], audit: Iterable[AuditEntry] = ()
) -> dict[str, Any]:
    producer, key = client_key(view.idempotency_key)
    lease = None
    if view.lease_worker is not None and view.lease_deadline_ms is not None:
        lease = {"worker": view.lease_worker, "deadline": utc(view.lease_deadline_ms)}
    return {
        "id": public_id, "kind": view.kind, "ref_key": view.ref_key, "idempotency_key": key, "producer": producer,
        "state": view.state.value, "ledger_state": LEDGER_STATE_OF[view.state.value].value,
        "created_at": utc(view.created_ms), "due_at": utc(view.due_ms),
        "finished_at": None if view.terminal_ms is None else utc(view.terminal_ms),
        "attempts": view.attempts,
        "last_error": None if view.last_error_class is None
        else {"error_class": view.last_error_class, "text": view.last_error_text},
        "lease": lease,
        "dead": None if view.dead_ms is None else {"at": utc(view.dead_ms), "reason": view.dead_reason},
        "payload": _json(view.payload) or {}, "edited_payload": _json(view.edited_payload),
        "original_failure": _failure(view.headers),
        "trace": {name: view.headers[name] for name in TRACE_HEADERS if name in view.headers},
        "history": [
            {"attempt": a.attempt, "worker": a.worker_id, "started_at": utc(a.leased_ms),
             "ended_at": None if a.ended_ms is None else utc(a.ended_ms), "outcome": a.outcome,
             "error_class": a.error_class, "error_text": a.error_text}
            for a in view.history
        ],
        "operator_actions": [operator_action(e) for e in events if e.message_id == view.message_id],
        "audit": [audit_document(entry) for entry in audit],
        "version": view.version, "previous_version": _sibling(public_id, view.previous_id),
        "superseded_by": _sibling(public_id, view.superseded_by),
    }  # fmt: skip


_ATTEMPT_END: Final = {"succeeded": "attempt_succeeded", "failed": "attempt_failed", "expired": "attempt_expired"}
_REPLACED_BY_AUDIT: Final = frozenset({EventType.REDRIVEN, EventType.DISCARDED})
AuditWithIds = tuple[AuditEntry, tuple[int, ...]]
"""An audit entry and the messages it concerns (`QueueClient.message_audit_with_ids`)."""


def _audit_requests(entry: AuditEntry, concerned: Sequence[int], present: Mapping[int, MessageView]) -> list[int]:
    """The requests of this timeline an entry is about: its target first (the edited original),
    then the others it is indexed under; a node that did not say which, the target alone."""
    target = int(entry.target[8:]) if entry.target.startswith("message:") and entry.target[8:].isdigit() else None
    ordered = [target] if target is not None else []
    ordered += sorted(m for m in concerned if m != target)
    return [m for m in ordered if m in present]


def timeline_entries(
    views: Sequence[MessageView], events: Iterable[Event], public_id: Callable[[int], str],
    audit: Iterable[AuditWithIds] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """Every step of these requests in time order; at one millisecond, in the order they happened
    to one request (intake, then attempts by number), operator actions in log order, and an edited
    version's intake after the edit that made it.

    An operator action is its audit entry (type `audit`, the entry as `GET /v1/audit` gives it):
    entries are kept for ever, events only for their retention, so a request's actions stay on
    its timeline after its events are purged. The redriven and discarded events an audited
    action also wrote (same log entry, same request) are left out, so no action shows twice; one
    from before the audit chain has no entry and shows as its event."""
    entries: list[tuple[int, int, int, int, dict[str, Any]]] = []
    for view in views:
        rid = public_id(view.message_id)
        base = {"request_id": rid, "kind": view.kind}
        intake = {"error_class": view.headers.get(HEADER_FAILURE_CLASS)} if HEADER_FAILURE_CLASS in view.headers else {}
        rank = 0 if view.previous_id is None else 4  # an edit's new version: after the edit, made in its apply
        entries.append((view.created_ms, rank, 0, 0, {**base, "at": utc(view.created_ms), "type": "intake",
                                                       "detail": intake}))  # fmt: skip
        for a in view.history:
            entries.append((a.leased_ms, 1, a.attempt, 0, {**base, "at": utc(a.leased_ms), "type": "attempt_started",
                                                            "attempt": a.attempt, "detail": {"worker": a.worker_id}}))
            if a.ended_ms is not None and a.outcome is not None:
                detail = {k: v for k, v in (("error_class", a.error_class), ("error_text", a.error_text)) if v}
                entries.append((a.ended_ms, 2, a.attempt, 0, {**base, "at": utc(a.ended_ms),
                                                               "type": _ATTEMPT_END.get(a.outcome, "attempt_failed"),
                                                               "attempt": a.attempt, "detail": detail}))
    present = {view.message_id: view for view in views}
    audited: set[tuple[int, int]] = set()
    for entry, concerned in audit:
        requests = _audit_requests(entry, concerned, present)
        audited.update((entry.log_index, m) for m in requests)
        first = present[requests[0]] if requests else None
        entries.append((entry.ts_ms, 3, entry.log_index, 1, {
            "request_id": None if first is None else public_id(first.message_id),
            "kind": None if first is None else first.kind, "at": utc(entry.ts_ms), "type": "audit",
            "requests": [public_id(m) for m in requests], "audit": audit_document(entry),
        }))  # fmt: skip
    for event in events:
        if event.type in _REPLACED_BY_AUDIT and (event.log_index, event.message_id) in audited:
            continue
        if event.type in (EventType.DEAD_LETTERED, *_REPLACED_BY_AUDIT):
            action = operator_action(event)
            detail = dict(action["detail"], actor=action["actor"], reason=action["reason"])
            kind = present[event.message_id].kind if event.message_id in present else event.kind
            entries.append((event.ts_ms, 3, event.log_index, 0, {"request_id": public_id(event.message_id),
                                                                  "kind": kind, "at": action["at"],
                                                                  "type": event.type.value, "detail": detail}))
    entries.sort(key=lambda entry: entry[:4])
    return [entry[4] for entry in entries]
