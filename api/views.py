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
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from api.ids import RequestId
from api.schemas import utc
from api.submissions import (
    HEADER_FAILURE_CLASS,
    HEADER_FAILURE_STATUS,
    HEADER_FAILURE_TEXT,
    client_key,
)
from ledger.masking import mask_payload, mask_payload_text
from ledger.states import LEDGER_STATE_OF
from queues import AuditEntry, Event, EventType, MessageView

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


def _masked_detail(detail: Any) -> Any:
    if not isinstance(detail, dict):
        return detail
    return {key: mask_payload_text(value) if key == "payload" and isinstance(value, str) else value
            for key, value in detail.items()}  # fmt: skip


def masked_audit(document: dict[str, Any]) -> dict[str, Any]:
    """An audit entry as a viewer reads it: payloads in it masked (ledger/masking.py). Its hash
    is of the unmasked entry: a viewer can check the chain's links, not recompute an entry."""
    return {**document, "before": _masked_detail(document["before"]), "after": _masked_detail(document["after"])}


def masked_request(document: dict[str, Any], kind: str) -> dict[str, Any]:
    """`request_document` as a viewer reads it: the payloads' personal fields masked, in the
    request itself, its operator actions and its audit entries."""
    edited = document["edited_payload"]
    return {
        **document, "payload": mask_payload(kind, document["payload"]),
        "edited_payload": None if edited is None else mask_payload(kind, edited),
        "operator_actions": [{**a, "detail": _masked_detail(a["detail"])} for a in document["operator_actions"]],
        "audit": [masked_audit(entry) for entry in document["audit"]],
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
        "state": view.state.value, "ledger_state": LEDGER_STATE_OF[view.state].value,
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


def timeline_entries(views: Sequence[MessageView], events: Iterable[Event], public_id: Callable[[int], str]) -> list[dict[str, Any]]:
    """Every step of these requests in time order; at one millisecond, in the order they happened
    to one request (intake, then attempts by number), and operator events by log sequence."""
    entries: list[tuple[int, int, int, dict[str, Any]]] = []
    for view in views:
        rid = public_id(view.message_id)
        base = {"request_id": rid, "kind": view.kind}
        intake = {"error_class": view.headers.get(HEADER_FAILURE_CLASS)} if HEADER_FAILURE_CLASS in view.headers else {}
        entries.append((view.created_ms, 0, 0, {**base, "at": utc(view.created_ms), "type": "intake", "detail": intake}))
        for a in view.history:
            entries.append((a.leased_ms, 1, a.attempt, {**base, "at": utc(a.leased_ms), "type": "attempt_started",
                                                         "attempt": a.attempt, "detail": {"worker": a.worker_id}}))
            if a.ended_ms is not None and a.outcome is not None:
                detail = {k: v for k, v in (("error_class", a.error_class), ("error_text", a.error_text)) if v}
                entries.append((a.ended_ms, 2, a.attempt, {**base, "at": utc(a.ended_ms),
                                                            "type": _ATTEMPT_END.get(a.outcome, "attempt_failed"),
                                                            "attempt": a.attempt, "detail": detail}))
    kinds = {view.message_id: view.kind for view in views}
    for event in events:
        if event.type in (EventType.DEAD_LETTERED, EventType.REDRIVEN, EventType.DISCARDED):
            action = operator_action(event)
            detail = dict(action["detail"], actor=action["actor"], reason=action["reason"])
            entries.append((event.ts_ms, 3, event.seq, {"request_id": public_id(event.message_id),
                                                         "kind": kinds.get(event.message_id, event.kind),
                                                         "at": action["at"], "type": event.type.value,
                                                         "detail": detail}))
    entries.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in entries]
