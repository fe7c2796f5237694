"""``/review/requests/{id}``: one request and everything known about it, for deciding what to do
with it; and its single-request actions, redrive and discard.

The page puts side by side what a reviewer otherwise gathers from four places: the payload (masked
for a viewer, as everything a viewer reads: api/masked_reads.py), the original failure and trace headers, every attempt with the downstream's answer,
the whole timeline of its business id (the same entries `GET /v1/refs/{ref_key}/timeline` gives:
lifecycle steps and, interleaved by time, the audit entries of every operator action on any of
its requests, kept after the events' retention), and its earlier and later versions with what
each edit changed. The audit entries are in the timeline only: a separate list would repeat them.

Must never: show an action's success unless the store did it (a proposal says it waits for an
approver; a refusal says nothing was done).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from starlette.responses import Response

from api import review_actions as actions
from api.money_view import diff_rows
from api.problems import Problem, invalid
from api.review_policy import current_payload, diff
from api.services import ApiServices
from api.views import AuditWithIds, request_document, timeline_entries
from api.web.headers import page_router
from api.web.page_support import (
    Flash,
    RequestIdPath,
    field_messages,
    problem_flash,
    problem_page,
    services,
    shown_entry,
)
from api.web.rights import Right
from api.web.sessions import WebUser, checked_csrf, current_user, require
from api.web.templating import render
from queues import AuditEntry, EventType, MessageView, State

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PostingUser = Annotated[WebUser, Depends(checked_csrf)]
VERSIONS_SHOWN: Final = 20
EXCERPT_CHARS: Final = 300
REDRIVABLE: Final = frozenset({"dead", "delayed"})


def _document(payload: bytes | None) -> dict[str, Any]:
    try:
        document = json.loads(payload or b"{}")
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {"value": document}


async def _versions(found: ApiServices, view: MessageView) -> list[dict[str, Any]]:
    """Every version of this request, first to last, each with what its edit changed (as this user
    may see the payloads: a changed account of a viewer's is two masked values)."""
    chain = [view]
    while chain[0].previous_id is not None and len(chain) < VERSIONS_SHOWN:
        earlier = (await actions.store(found, found.queue.get(chain[0].previous_id))).value
        if earlier is None:
            break
        chain.insert(0, earlier)
    while chain[-1].superseded_by is not None and len(chain) < VERSIONS_SHOWN:
        later = (await actions.store(found, found.queue.get(chain[-1].superseded_by))).value
        if later is None:
            break
        chain.append(later)
    if len(chain) == 1:
        return []
    versions = []
    for before, after in zip([None, *chain], chain, strict=False):
        old, new = (None, None) if before is None else (_document(current_payload(before)), _document(current_payload(after)))
        changes = [] if old is None or new is None else diff_rows(old, new, diff(old, new))
        versions.append({"id": actions.public(found, after.message_id), "version": after.version,
                         "state": after.state.value, "created_ms": after.created_ms, "changes": changes,
                         "current": after.message_id == view.message_id})  # fmt: skip
    return versions


def _timeline(found: ApiServices, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ref key's timeline with each audit entry's changes and links (`shown_entry`)."""
    return [{**entry, "audit": shown_entry(found, entry["audit"])} if "audit" in entry else entry for entry in entries]


def _discard(view: MessageView, audit: Sequence[AuditWithIds]) -> AuditEntry | None:
    """Who discarded a discarded request, when and why: the tier forgets its dead time when the
    request leaves it, so the page's "Dead" fact reads the audit entry instead of a bare dash."""
    if view.state is not State.DISCARDED:
        return None
    found = [entry for entry, ids in audit if entry.action == EventType.DISCARDED.value and view.message_id in ids]
    return found[-1] if found else None


async def detail_context(found: ApiServices, user: WebUser, request_id: str) -> dict[str, Any]:
    found = await actions.in_set_of(found, request_id)  # several sets: the request's own set (docs/review.md)
    view = await actions.request(found, request_id)
    siblings = (await actions.store(found, found.queue.by_ref_key(view.ref_key))).value
    ids = [v.message_id for v in siblings]
    events = (await actions.store(found, found.queue.message_events(ids))).value
    audit = (await actions.store(found, found.queue.message_audit_with_ids(ids))).value
    document = request_document(view, request_id, events)
    money = actions.amount(view)
    return {
        "request": document, "view": view, "discard": _discard(view, audit),
        "payload": document["payload"], "edited_payload": document["edited_payload"],
        "amount_minor": None if money is None else money[0], "currency": None if money is None else money[1],
        "attempts": [{**a, "excerpt": (a["error_text"] or "")[:EXCERPT_CHARS], "started_ms": h.leased_ms,
                      "took_ms": None if h.ended_ms is None else h.ended_ms - h.leased_ms}
                     for a, h in zip(document["history"], view.history, strict=True)],
        "timeline": _timeline(found, timeline_entries(siblings, events, lambda m: actions.public(found, m), audit)),
        "versions": await _versions(found, view),
        "redrivable": view.state.value in REDRIVABLE,
        "four_eyes_why": found.four_eyes.needs_approval([view]),
        "reason_codes": found.four_eyes.discard_reason_codes,
    }  # fmt: skip


@router.get("/review/requests/{request_id}")
async def detail(request: Request, request_id: RequestIdPath, user: User) -> Response:
    require(user, Right.VIEW)
    try:
        context = await detail_context(services(request), user, request_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    return render(request, "detail.html", context, user=user)


def outcome_flash(found: ApiServices, outcome: actions.Done | actions.Proposed, done: str) -> Flash:
    """The one sentence an action's result page leads with: done (and only what was), proposed,
    or refused whole."""
    if isinstance(outcome, actions.Proposed):
        return Flash("proposed", f"Proposal {outcome.proposal.proposal_id} created: nothing is done until an approver "
                                 f"approves it ({outcome.why}).")  # fmt: skip
    if not outcome.ids:
        refused = ", ".join(f"{actions.public(found, m)} ({c.name.lower()})" for m, c in outcome.refused)
        return Flash("error", f"Nothing was done: {refused or 'no request could be acted on'}.")
    return Flash("success", done)


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {key: value for key, value in form.items() if isinstance(value, str)}


async def _after_action(
    request: Request, user: WebUser, request_id: str, outcome: Flash | Problem, form: dict[str, str] | None = None
) -> Response:
    """The request's page again, leading with what the action did; a refusal keeps what was typed
    and names the field next to it."""
    try:
        context = await detail_context(services(request), user, request_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    if isinstance(outcome, Problem):
        context.update(errors=field_messages(outcome), typed=form or {})
        return render(request, "detail.html", {**context, "flashes": [problem_flash(outcome)]}, user=user,
                      status=outcome.type.status)  # fmt: skip
    return render(request, "detail.html", {**context, "flashes": [outcome]}, user=user)


@router.post("/review/requests/{request_id}/redrive")
async def redrive_one(request: Request, request_id: RequestIdPath, user: PostingUser) -> Response:
    """One request, through the direct path (no job): done at once or proposed."""
    require(user, Right.REDRIVE)
    found = services(request)
    form = await _form(request)
    reason = form.get("reason", "").strip()
    try:
        if not reason:
            raise invalid([{"field": "reason", "message": "say why, for the audit"}])
        found = await actions.in_set_of(found, request_id)
        view = await actions.request(found, request_id)
        outcome = await actions.redrive(found, user.name, reason, [view])
    except Problem as problem:
        return await _after_action(request, user, request_id, problem, form)
    return await _after_action(request, user, request_id, outcome_flash(found, outcome, f"Redriven: {request_id} is ready for a worker again."))


@router.post("/review/requests/{request_id}/discard")
async def discard(request: Request, request_id: RequestIdPath, user: PostingUser) -> Response:
    """A listed reason code and a comment, both required: the audit says why, for ever."""
    require(user, Right.DISCARD)
    found = services(request)
    form = await _form(request)
    try:
        found = await actions.in_set_of(found, request_id)
        view = await actions.request(found, request_id)
        outcome = await actions.discard(found, user.name, view, form.get("reason_code", ""), form.get("comment", ""))
    except Problem as problem:
        return await _after_action(request, user, request_id, problem, form)
    return await _after_action(request, user, request_id, outcome_flash(found, outcome, f"Discarded: {request_id} will not be delivered."))

