"""``/v1/review`` and ``/v1/audit``: finance review for tooling: redrive (one, a selection, or what a
filter matches), edit and redrive, discard with a reason code and a comment; four-eyes proposals,
their approval and rejection; the audit chain, newest first.

Each action is one replicated command that also writes its audit entry (docs/review.md). An action
this deployment's four-eyes rules catch (`FourEyes`: money-moving kinds, amounts, bulk sizes) is
proposed instead and answered 202 with the proposal; a different person with the approver role
approves it, and the approval performs it in the same command. Who may: a reviewer acts and
withdraws their own proposals, an approver approves and rejects, operators, reviewers and
approvers read; admin may do everything (the store still refuses anyone's approval of their own
proposal).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from pydantic import StringConstraints
from starlette.responses import Response

from api import across_sets, openapi
from api import review_actions as actions
from api import review_groups as groups
from api import review_redrive as spanning
from api.audit_view import ACTION_PATTERN, ACTOR_PATTERN, TARGET_PATTERN, audit_filter
from api.auth import Observer, Principal, requires
from api.http import json_response, known_query
from api.money_view import money_document, money_of_payload
from api.problems import Problem, invalid
from api.review_documents import group_document, proposal_document, proposal_documents, refused_document
from api.review_policy import current_payload
from api.review_schemas import NAME_PATTERN, ApproveBody, DiscardBody, EditBody, RedriveBody, RejectBody
from api.schemas import utc
from api.services import ApiServices, of
from api.views import audit_document
from ledger.request_ids import NUMBER_MAX, PUBLIC_ID_LENGTH_MAX
from queues import (
    AuditFilter,
    DeadLetterFilter,
    MessageView,
    ProposalState,
    Role,
)
from submission.models import IDEMPOTENCY_KEY_LENGTH_MAX, REF_KEY_PATTERN

router = APIRouter(tags=["review"], dependencies=[Depends(known_query)])  # an unknown query parameter is a 422
PROPOSED: dict[int | str, dict[str, Any]] = {202: {"description": "Proposed: four eyes are needed; the proposal waits for an approver."}}
Reviewer = Annotated[Principal, Depends(requires(Role.REVIEWER))]
Approver = Annotated[Principal, Depends(requires(Role.APPROVER))]
Decider = Annotated[Principal, Depends(requires(Role.REVIEWER, Role.APPROVER))]
GroupKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=IDEMPOTENCY_KEY_LENGTH_MAX, description=(
    "Several sets: a job group (a job over several sets' dead letters, or a redrive of them that needs four eyes)"
    " is named from this key and the caller, so repeating the request with the same key after a 503"
    " partially-applied completes the same group."))]
RequestIdPath = Annotated[str, Path(max_length=PUBLIC_ID_LENGTH_MAX, description="A request id, e.g. 1-42.")]
ProposalIdPath = Annotated[int, Path(ge=1, le=NUMBER_MAX, description="A proposal's number.")]
SetQuery = Annotated[int | None, Query(alias="set", ge=1, le=99999, description=(
    "Several sets: the set the proposal lives in (its `set`); left out: the home set."))]


def _services(request: Request) -> ApiServices:
    """The services as the caller may use them: a viewer's reads masked (api/masked_reads.py)."""
    return of(request)


async def proposed_response(services: ApiServices, proposed: actions.Proposed, **extra: Any) -> Response:
    (document,) = await proposal_documents(services, [proposed.proposal])
    body = {"outcome": "proposed", "why": proposed.why, "proposal": document,
            "refused": refused_document(services, proposed.refused), **extra}  # fmt: skip
    return json_response(body, status=202)


def edit_money(checked: actions.CheckedEdit) -> dict[str, Any]:
    """What an edit pays: the money before and after (minor units, currency, and major units)."""
    return {"before": money_document(money_of_payload(current_payload(checked.view))),
            "after": money_document(money_of_payload(checked.payload))}  # fmt: skip


# ---- actions ------------------------------------------------------------------------------------
REDRIVE_PROPOSED: dict[int | str, dict[str, Any]] = {202: {"description": (
    "Proposed: four eyes are needed; nothing is redriven until an approver approves. One set: `proposal`, the"
    " proposal. Several sets: `group`, a job group with a proposed part per set (Location:"
    " /v1/review/job-groups/{group}); one approval of the group redrives every part.")}}  # fmt: skip


@router.post("/v1/review/redrive", summary="Redrive dead letters: by id, or everything a filter matches",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **REDRIVE_PROPOSED})  # fmt: skip
async def redrive(
    request: Request, body: RedriveBody, principal: Reviewer,
    idempotency_key: GroupKey = None,
) -> Response:  # fmt: skip
    """Answered 200 with what was redriven and what was refused (never counted as done), or 202
    with a proposal when four eyes are needed. A filter is resolved to ids first: the ids shown are
    what is redriven or approved. Several sets: each set's part is redriven in its set (a set that
    does not answer: 503 `partially-applied`, repeat safely); under four eyes every part is proposed
    as one job group (docs/review.md, "Several sets")."""
    services = _services(request)
    if services.sets is not None:
        return await _redrive_across(services, body, principal, idempotency_key)
    if body.ids is not None:
        views = await actions.selected(services, body.ids)
    else:
        assert body.filter is not None
        views = await actions.matching(services, _redrive_filter(body), body.limit)
    return await _redrive_in(services, principal, body.reason, views)


async def _redrive_in(services: ApiServices, principal: Principal, reason: str, views: list[MessageView]) -> Response:
    """One set's redrive (or its proposal), as it always was."""
    outcome = await actions.redrive(services, principal.name, reason, views)
    if isinstance(outcome, actions.Proposed):
        return await proposed_response(services, outcome)
    return json_response({"outcome": "done", "redriven": [actions.public(services, m) for m in outcome.ids],
                          "refused": refused_document(services, outcome.refused)})  # fmt: skip


def _redrive_filter(body: RedriveBody) -> DeadLetterFilter:
    assert body.filter is not None
    return DeadLetterFilter(kind=body.filter.kind, error_class=body.filter.error_class, ref_key=body.filter.ref_key)


async def _redrive_across(services: ApiServices, body: RedriveBody, principal: Principal,
                          idempotency_key: str | None) -> Response:  # fmt: skip
    """Several sets: each set's part of the selection redriven in its set (api/review_redrive.py);
    one set's part alone is that set's redrive, as always."""
    if body.ids is not None:
        parts = await spanning.parts_of_ids(services, body.ids)
    else:
        parts = await spanning.parts_of_filter(services, _redrive_filter(body), body.limit)
    if len(parts) == 1 and body.group is None:
        ((found, views),) = parts
        return await _redrive_in(found, principal, body.reason, views)
    group = groups.group_id(principal.name, idempotency_key, body.group)
    done = await spanning.redrive(services, principal.name, body.reason, parts, group)
    if isinstance(done, spanning.GroupProposed):
        document = await group_document(await groups.read_group(services, group))
        refused = [r for s, part in done.created.refused for r in refused_document(s, part)]
        return json_response({"outcome": "proposed", "why": f"needs a second person's approval: {done.created.proposed}",
                              "group": document, "refused": refused}, status=202,
                             headers={"Location": f"/v1/review/job-groups/{group}"})  # fmt: skip
    return json_response({
        "outcome": "done", "redriven": [actions.public(s, m) for s, part in done.parts for m in part.ids],
        "refused": [r for s, part in done.parts for r in refused_document(s, part.refused)],
        "sets": [{"set": s.settings.set_id, "redriven": len(part.ids), "refused": len(part.refused)}
                 for s, part in done.parts],
    })  # fmt: skip


@router.post("/v1/review/requests/{request_id}/edit", summary="Edit a request's payload and redrive it as a new version",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def edit(request: Request, request_id: RequestIdPath, body: EditBody, principal: Reviewer) -> Response:
    """The payload is validated against the kind's schema (a bad edit is refused naming the
    field), the diff is answered, and the edit goes out as a new version linked to the original,
    which is kept unchanged."""
    services = await actions.in_set_of(_services(request), request_id)
    checked = actions.checked_edit(await actions.request(services, request_id), body.payload)
    outcome = await actions.edit(services, principal.name, body.reason, checked)
    if isinstance(outcome, actions.Proposed):
        return await proposed_response(services, outcome, diff=checked.changes, money=edit_money(checked))
    return json_response({"outcome": "done", "id": request_id, "new_id": actions.public(services, outcome.new_ids[0]),
                          "diff": checked.changes, "money": edit_money(checked)})  # fmt: skip


@router.post("/v1/review/requests/{request_id}/discard", summary="Discard a request with a reason code and a comment",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def discard(request: Request, request_id: RequestIdPath, body: DiscardBody, principal: Reviewer) -> Response:
    services = await actions.in_set_of(_services(request), request_id)
    actions.check_reason_code(services, body.reason_code)
    view = await actions.request(services, request_id)
    outcome = await actions.discard(services, principal.name, view, body.reason_code, body.comment)
    if isinstance(outcome, actions.Proposed):
        return await proposed_response(services, outcome)
    return json_response({"outcome": "done", "id": request_id, "state": "discarded"})


# ---- the dead-letter tier -------------------------------------------------------------------------
def _amount(view: MessageView) -> dict[str, Any] | None:
    return money_document(money_of_payload(current_payload(view)))


def _ms(moment: dt.datetime | None, field: str = "dead_from/dead_to") -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        raise invalid([{"field": field, "message": "give a time zone (e.g. Z)"}])
    return actions.store_ms(moment)


@router.get("/v1/review/dead-letters", summary="Dead letters, oldest first, a page at a time",
            responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def dead_letters(
    request: Request, principal: Observer,
    kind: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    error_class: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    ref_key: Annotated[str | None, Query(pattern=REF_KEY_PATTERN)] = None,
    dead_from: dt.datetime | None = None, dead_to: dt.datetime | None = None,
    cursor: Annotated[str | None, Query(pattern=across_sets.CURSOR_PATTERN, description="next_cursor of the page before (opaque)")] = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    partial: Annotated[bool, Query(description="Several sets: answer with the sets that answer, naming those that did not "
                                               "(`partial`, `unanswered_sets`), instead of a 503.")] = False,
    set_id: Annotated[int | None, Query(alias="set", ge=1, le=99999, description="Several sets: this set's only.")] = None,
) -> Response:  # fmt: skip
    """What the machines could not finish: each with its last error, attempts and amount. Pass
    `next_cursor` back for the next page (stable while new letters arrive). With several sets,
    every set's, merged oldest first (docs/review.md, "Several sets")."""
    services = _services(request)
    dead_filter = DeadLetterFilter(kind=kind, error_class=error_class, ref_key=ref_key,
                                   dead_from_ms=_ms(dead_from), dead_to_ms=_ms(dead_to))  # fmt: skip
    if services.sets is None and set_id is not None and set_id != services.settings.set_id:
        raise Problem("not-found", f"no set {set_id}")
    page = await across_sets.dead_letter_page(services, dead_filter, cursor=cursor, limit=limit, partial=partial,
                                              only=set_id)  # fmt: skip
    items = [{
        "id": actions.public(found, view.message_id), "kind": view.kind, "ref_key": view.ref_key,
        "attempts": view.attempts, "error_class": view.last_error_class, "error_text": view.last_error_text,
        "dead_at": None if view.dead_ms is None else utc(view.dead_ms), "dead_reason": view.dead_reason,
        "amount": _amount(view),
    } for found, view in page.rows]  # fmt: skip
    body: dict[str, Any] = {"items": items, "next_cursor": page.next_cursor}
    if services.sets is not None:
        body.update(partial=bool(page.unanswered), unanswered_sets=page.unanswered)
    return json_response(body)


# ---- proposals ----------------------------------------------------------------------------------
@router.get("/v1/review/proposals", summary="Four-eyes proposals, newest first",
            responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def list_proposals(
    request: Request, principal: Observer, pending: bool = False,
    before: Annotated[int | None, Query(ge=1, le=NUMBER_MAX)] = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    set_id: SetQuery = None,
) -> Response:  # fmt: skip
    """Several sets: every set's newest proposals merged by time, each naming its `set`; with `set`,
    that set's only (`before` pages on within one set)."""
    services = _services(request)
    if services.sets is not None and before is not None and set_id is None:
        raise invalid([{"field": "before", "message": "with several sets, page on within one set: give set too"}])
    scoped = await actions.set_named(services, set_id)
    found, _ = await across_sets.proposals(scoped, pending_only=pending, before=before, limit=limit,
                                           one_set=set_id is not None)  # fmt: skip
    targets: dict[int, dict[int, MessageView]] = {}
    for set_services in {id(s): s for s, _ in found}.values():
        views = [view for s, view in found if s is set_services]
        targets[set_services.settings.set_id] = await actions.proposal_targets(set_services, views)
    return json_response([proposal_document(s, view, actions.what_is_paid(view, targets[s.settings.set_id]))
                          for s, view in found])  # fmt: skip


@router.post("/v1/review/proposals/{proposal_id}/approve", summary="Approve a proposal: it is done in the same command",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def approve(request: Request, proposal_id: ProposalIdPath, body: ApproveBody, principal: Approver,
                  set_id: SetQuery = None) -> Response:  # fmt: skip
    services = await actions.set_named(_services(request), set_id)
    view, result = await actions.approve(services, principal.name, proposal_id, body.reason)
    public = actions.public
    (document,) = await proposal_documents(services, [view])
    return json_response({
        "proposal": document, "done": [public(services, m) for m in result.ids],
        "new_ids": [public(services, m) for m in result.new_ids], "refused": refused_document(services, result.refused),
    })  # fmt: skip


@router.post("/v1/review/proposals/{proposal_id}/reject", summary="Reject a proposal, or withdraw your own",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def reject(request: Request, proposal_id: ProposalIdPath, body: RejectBody, principal: Decider,
                 set_id: SetQuery = None) -> Response:  # fmt: skip
    services = await actions.set_named(_services(request), set_id)
    view = await actions.reject(services, principal.name, proposal_id, body.reason,
                                others=principal.role is not Role.REVIEWER)  # fmt: skip
    assert view.state is ProposalState.REJECTED
    (document,) = await proposal_documents(services, [view])
    return json_response({"proposal": document})


# ---- the audit chain ----------------------------------------------------------------------------
@router.get("/v1/audit", summary="The operator audit chain, newest first, filtered",
            responses=openapi.problems(401, 403, 422, 503))  # fmt: skip
async def audit(
    request: Request, principal: Observer, before: Annotated[int | None, Query(ge=1, le=NUMBER_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    actor: Annotated[str | None, Query(pattern=ACTOR_PATTERN, description="Who acted, exactly.")] = None,
    action: Annotated[list[Annotated[str, StringConstraints(pattern=ACTION_PATTERN)]], Query(max_length=32, description="Any of these actions (repeat the parameter): "
                                       "edit_redrive, redriven, discarded, propose, approve, reject, redrive_job, "
                                       "document_put, ...")] = [],  # noqa: B006 (FastAPI copies the default)
    target: Annotated[str | None, Query(pattern=TARGET_PATTERN, description=(
        "A request id (1-42: every entry that concerns it), `proposal:7`, `job:3`, any exact target, or the start "
        "of targets ending in / or * (`document:users/`). A request id must be one of this set's."))] = None,
    since: Annotated[dt.datetime | None, Query(description="Entries at or after this time (with a time zone).")] = None,
    until: Annotated[dt.datetime | None, Query(description="Entries before this time (with a time zone); after `since` when both are given.")] = None,
    sign_ins: Annotated[bool, Query(description="false leaves out the session and login records (logins, logouts, "
                                                "failed logins); users and passwords stay.")] = True,
    cursor: Annotated[str | None, Query(pattern=across_sets.AUDIT_CURSOR_PATTERN, description=(
        "Several sets: next_cursor of the page before (opaque); `before` is one set's seq, so it is not taken."))] = None,
) -> Response:  # fmt: skip
    """Who did what, when, why, and before -> after, of the entries the filter selects (filtered in
    the store: a page is full, and `before` = the last seq seen pages on). The head is the whole
    chain's. Several sets: every set's chain merged by time, each entry naming its `set`, `heads`
    per set, paged with `cursor` (docs/review.md, "Several sets")."""
    services = _services(request)
    if services.sets is not None:
        if before is not None:
            raise invalid([{"field": "before", "message": "with several sets, page on with cursor (next_cursor)"}])
        only = across_sets.audit_scope(services, target)

        def selected_in(set_id: int) -> AuditFilter:
            return audit_filter(set_id=set_id, actor=actor, actions=action, target=target, since_ms=_ms(since, "since"),
                                until_ms=_ms(until, "until"), sign_ins=sign_ins)  # fmt: skip

        selected_in(only or services.settings.set_id)  # a bad filter is a 422 before any set is read
        page = await across_sets.audit_page(services, selected_in, cursor=cursor, limit=limit, only=only)
        return json_response({"entries": [{**audit_document(e), "set": s.settings.set_id} for s, e in page.rows],
                              "count": page.count, "heads": {str(k): v.hex() for k, v in page.heads.items()},
                              "next_cursor": page.next_cursor})  # fmt: skip
    if cursor is not None:
        raise invalid([{"field": "cursor", "message": "one set: page on with before (the last seq seen)"}])
    selected = audit_filter(set_id=services.settings.set_id, actor=actor, actions=action, target=target,
                            since_ms=_ms(since, "since"), until_ms=_ms(until, "until"), sign_ins=sign_ins)  # fmt: skip
    read = services.queue.audit_log(before=before, limit=limit, audit_filter=selected)
    answer = (await actions.store(services, read)).value
    entries = [audit_document(e) for e in answer.entries]
    return json_response({"entries": entries, "count": answer.count,
                          "head": answer.head.hex()})  # fmt: skip
