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
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import ValidationError
from starlette.responses import Response

from api import openapi
from api.auth import Observer, Principal, requires
from api.http import json_response
from api.ids import RequestId
from api.problems import Problem, invalid
from api.review_policy import current_payload, diff
from api.review_schemas import NAME_PATTERN, ApproveBody, DiscardBody, EditBody, RedriveBody, RejectBody
from api.schemas import REF_KEY_PATTERN, utc
from api.services import ApiServices
from api.submissions import field_errors
from api.views import audit_document
from ledger.kinds import PAYLOAD_MODELS, Kind, decode_payload, encode_payload, money_of
from queues import (
    TIME_MS_MAX,
    ClientError,
    Code,
    DeadLetterFilter,
    Discard,
    EditRedrive,
    MessageView,
    ProposalState,
    ProposalView,
    QueueError,
    Redrive,
    ReviewAction,
    ReviewResult,
    Role,
    proposal_action,
)

router = APIRouter(tags=["review"])
PROPOSED: dict[int | str, dict[str, Any]] = {202: {"description": "Proposed: four eyes are needed; the proposal waits for an approver."}}
Reviewer = Annotated[Principal, Depends(requires(Role.REVIEWER))]
Approver = Annotated[Principal, Depends(requires(Role.APPROVER))]
Decider = Annotated[Principal, Depends(requires(Role.REVIEWER, Role.APPROVER))]
RequestIdPath = Annotated[str, Path(max_length=40, description="A request id, e.g. 1-42.")]
ProposalIdPath = Annotated[int, Path(ge=1, le=(1 << 62), description="A proposal's number.")]


def _services(request: Request) -> ApiServices:
    services: ApiServices = request.app.state.services
    return services


async def _store(services: ApiServices, call: Any) -> Any:
    try:
        return await call
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None


def _public(services: ApiServices, message_id: int) -> str:
    return str(RequestId(services.settings.set_id, message_id))


def _message_id(services: ApiServices, text: str) -> int | None:
    parsed = RequestId.parse(text)
    return None if parsed is None or parsed.set_id != services.settings.set_id else parsed.message_id


async def _one(services: ApiServices, request_id: str) -> MessageView:
    message_id = _message_id(services, request_id)
    view: MessageView | None = None
    if message_id is not None:
        view = (await _store(services, services.queue.get(message_id))).value
    if view is None:
        raise Problem("not-found", f"no request {request_id}")
    return view


def _refused(services: ApiServices, refused: tuple[tuple[int, Code], ...]) -> list[dict[str, str]]:
    return [{"id": _public(services, message_id), "reason": code.name.lower()} for message_id, code in refused]


def proposal_document(services: ApiServices, view: ProposalView) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": view.proposal_id, "action": view.action, "proposer": view.proposer, "reason": view.reason,
        "targets": [_public(services, t) for t in view.targets], "state": view.state.value,
        "created_at": utc(view.created_ms), "expires_at": utc(view.expires_ms), "decided_by": view.decided_by,
        "decided_at": None if view.decided_ms is None else utc(view.decided_ms), "decision_reason": view.decision_reason,
    }  # fmt: skip
    action = proposal_action(view)
    if isinstance(action, EditRedrive):
        document["payload"] = json.loads(action.payload)
    if isinstance(action, Discard):
        document["reason_code"] = action.reason_code
    return document


async def _propose(services: ApiServices, action: ReviewAction, why: str) -> Response:
    result = await _store(services, services.queue.propose(action, ttl_ms=services.four_eyes.proposal_ttl_ms))
    _raise_for(result, "the proposal")
    (view,) = (await _store(services, services.queue.proposals(ids=[result.proposal_id]))).value
    body = {"outcome": "proposed", "why": f"needs a second person's approval: {why}",
            "proposal": proposal_document(services, view), "refused": _refused(services, result.refused)}  # fmt: skip
    return json_response(body, status=202)


def _raise_for(result: ReviewResult, what: str) -> None:
    """The problem for a review result that did nothing (OK passes)."""
    problems = {
        Code.NOT_FOUND: ("not-found", f"{what}: no such request or proposal"),
        Code.ILLEGAL_STATE: ("conflict", f"{what}: not possible in the current state"),
        Code.CONFLICT: ("conflict", f"{what}: another request already holds the new version's key"),
        Code.OWN_PROPOSAL: ("own-proposal", "the proposer cannot approve their own proposal"),
        Code.EXPIRED: ("proposal-expired", "the proposal expired; nothing was done"),
        Code.INVALID: ("invalid-request", f"{what}: {result.detail or 'refused by the store'}"),
    }
    if result.code is not Code.OK:
        name, detail = problems.get(result.code, ("conflict", f"{what}: {result.code.name.lower()}"))
        raise Problem(name, detail)


# ---- actions ------------------------------------------------------------------------------------
@router.post("/v1/review/redrive", summary="Redrive dead letters: by id, or everything a filter matches",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def redrive(request: Request, body: RedriveBody, principal: Reviewer) -> Response:
    """Answered 200 with what was redriven and what was refused (never counted as done), or 202
    with a proposal when four eyes are needed. A filter is resolved to ids first: the ids shown are
    what is redriven or approved."""
    services = _services(request)
    if body.ids is not None:
        ids = [_message_id(services, text) for text in body.ids]
        if None in ids:  # not an id this set could have issued
            raise Problem("not-found", "some of the requests do not exist")
        views = list((await _store(services, services.queue.get_many([m for m in ids if m], with_history=False))).value)
        if len(views) != len(set(ids)):
            raise Problem("not-found", "some of the requests do not exist")
    else:
        assert body.filter is not None
        dead_filter = DeadLetterFilter(kind=body.filter.kind, error_class=body.filter.error_class,
                                       ref_key=body.filter.ref_key)  # fmt: skip
        views = list((await _store(services, services.queue.dead_letters(dead_filter, limit=body.limit))).value.items)
        if not views:
            raise Problem("not-found", "no dead letter matches the filter")
    action = Redrive(actor=principal.name, reason=body.reason, ids=tuple(v.message_id for v in views))
    why = services.four_eyes.needs_approval(views)
    if why is not None:
        return await _propose(services, action, why)
    result = await _store(services, services.queue.redrive(action.actor, action.reason, ids=action.ids))
    return json_response({"outcome": "done", "redriven": [_public(services, m) for m in result.ids],
                          "refused": _refused(services, result.refused)})  # fmt: skip


@router.post("/v1/review/requests/{request_id}/edit", summary="Edit a request's payload and redrive it as a new version",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def edit(request: Request, request_id: RequestIdPath, body: EditBody, principal: Reviewer) -> Response:
    """The payload is validated against the kind's schema (a bad edit is refused naming the
    field), the diff is answered, and the edit goes out as a new version linked to the original,
    which is kept unchanged."""
    services = _services(request)
    view = await _one(services, request_id)
    try:
        model = PAYLOAD_MODELS[Kind(view.kind)]
    except ValueError:
        raise Problem("conflict", f"requests of kind {view.kind} cannot be edited here") from None
    try:
        payload = encode_payload(model.model_validate(body.payload))  # type: ignore[arg-type]
    except ValidationError as error:
        errors = field_errors(error.errors())
        raise invalid([{**e, "field": "payload" if e["field"] == "(body)" else f"payload.{e['field']}"}
                       for e in errors]) from None  # fmt: skip
    changes = diff(json.loads(current_payload(view)), json.loads(payload))
    if not changes:
        raise invalid([{"field": "payload", "message": "unchanged: redrive it instead"}])
    action = EditRedrive(message_id=view.message_id, payload=payload, actor=principal.name, reason=body.reason)
    why = services.four_eyes.needs_approval([view], [payload])
    if why is not None:
        proposed = await _propose(services, action, why)
        document = json.loads(bytes(proposed.body))
        return json_response({**document, "diff": changes}, status=202)
    result = await _store(services, services.queue.edit_redrive(view.message_id, payload, actor=principal.name,
                                                                reason=body.reason))  # fmt: skip
    _raise_for(result, "the edit")
    return json_response({"outcome": "done", "id": request_id, "new_id": _public(services, result.new_ids[0]),
                          "diff": changes})  # fmt: skip


@router.post("/v1/review/requests/{request_id}/discard", summary="Discard a request with a reason code and a comment",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def discard(request: Request, request_id: RequestIdPath, body: DiscardBody, principal: Reviewer) -> Response:
    services = _services(request)
    codes = services.four_eyes.discard_reason_codes
    if body.reason_code not in codes:
        raise invalid([{"field": "reason_code", "message": f"must be one of {', '.join(codes)}"}])
    view = await _one(services, request_id)
    action = Discard(message_id=view.message_id, actor=principal.name, reason=body.comment, reason_code=body.reason_code)
    why = services.four_eyes.needs_approval([view])
    if why is not None:
        return await _propose(services, action, why)
    outcome = await _store(services, services.queue.discard(view.message_id, principal.name, body.comment,
                                                            reason_code=body.reason_code))  # fmt: skip
    if outcome.code is not Code.OK:
        state = "its state" if outcome.state is None else f"state {outcome.state.value}"
        raise Problem("conflict", f"request {request_id} cannot be discarded in {state}")
    return json_response({"outcome": "done", "id": request_id, "state": "discarded"})


# ---- the dead-letter tier -------------------------------------------------------------------------
def _amount(view: MessageView) -> dict[str, Any] | None:
    """The amount at stake, when the payload is a valid request of a kind that has one."""
    try:
        money = money_of(decode_payload(Kind(view.kind), view.edited_payload or view.payload))
    except (ValueError, ValidationError):
        return None
    return None if money is None else {"amount_minor": money.amount_minor, "currency": money.currency}


def _ms(moment: dt.datetime | None) -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        raise invalid([{"field": "dead_from/dead_to", "message": "give a time zone (e.g. Z)"}])
    return max(0, min(TIME_MS_MAX, int(moment.timestamp() * 1000)))  # nothing is dead outside the store's times


@router.get("/v1/review/dead-letters", summary="Dead letters, oldest first, a page at a time",
            responses=openapi.problems(401, 403, 422, 503))  # fmt: skip
async def dead_letters(
    request: Request, principal: Observer,
    kind: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    error_class: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    ref_key: Annotated[str | None, Query(pattern=REF_KEY_PATTERN)] = None,
    dead_from: dt.datetime | None = None, dead_to: dt.datetime | None = None,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}\.[0-9]{1,18}$", description="next_cursor of the page before")] = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:  # fmt: skip
    """What the machines could not finish: each with its last error, attempts and amount. Pass
    `next_cursor` back for the next page (stable while new letters arrive)."""
    services = _services(request)
    dead_filter = DeadLetterFilter(kind=kind, error_class=error_class, ref_key=ref_key,
                                   dead_from_ms=_ms(dead_from), dead_to_ms=_ms(dead_to))  # fmt: skip
    try:
        page = (await services.queue.dead_letters(dead_filter, cursor=cursor, limit=limit)).value
    except QueueError:
        raise invalid([{"field": "cursor", "message": "not a cursor this list gave, or a filter the store refused"}]) from None
    except ClientError as error:
        raise services.read_failure(error) from None
    items = [{
        "id": _public(services, view.message_id), "kind": view.kind, "ref_key": view.ref_key,
        "attempts": view.attempts, "error_class": view.last_error_class, "error_text": view.last_error_text,
        "dead_at": None if view.dead_ms is None else utc(view.dead_ms), "dead_reason": view.dead_reason,
        "amount": _amount(view),
    } for view in page.items]  # fmt: skip
    return json_response({"items": items, "next_cursor": page.next_cursor})


# ---- proposals ----------------------------------------------------------------------------------
@router.get("/v1/review/proposals", summary="Four-eyes proposals, newest first",
            responses=openapi.problems(401, 403, 422, 503))  # fmt: skip
async def list_proposals(
    request: Request, principal: Observer, pending: bool = False,
    before: Annotated[int | None, Query(ge=1, le=(1 << 62))] = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:  # fmt: skip
    services = _services(request)
    views = (await _store(services, services.queue.proposals(pending_only=pending, before_id=before, limit=limit))).value
    return json_response([proposal_document(services, view) for view in views])


@router.post("/v1/review/proposals/{proposal_id}/approve", summary="Approve a proposal: it is done in the same command",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def approve(request: Request, proposal_id: ProposalIdPath, body: ApproveBody, principal: Approver) -> Response:
    services = _services(request)
    result = await _store(services, services.queue.approve(proposal_id, approver=principal.name, reason=body.reason))
    _raise_for(result, "the approval")
    (view,) = (await _store(services, services.queue.proposals(ids=[proposal_id]))).value
    return json_response({
        "proposal": proposal_document(services, view), "done": [_public(services, m) for m in result.ids],
        "new_ids": [_public(services, m) for m in result.new_ids], "refused": _refused(services, result.refused),
    })  # fmt: skip


@router.post("/v1/review/proposals/{proposal_id}/reject", summary="Reject a proposal, or withdraw your own",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def reject(request: Request, proposal_id: ProposalIdPath, body: RejectBody, principal: Decider) -> Response:
    services = _services(request)
    found = (await _store(services, services.queue.proposals(ids=[proposal_id]))).value
    if not found:
        raise Problem("not-found", f"no proposal {proposal_id}")
    if principal.role is Role.REVIEWER and found[0].proposer != principal.name:
        raise Problem("forbidden", "a reviewer may withdraw only their own proposals; approvers reject")
    result = await _store(services, services.queue.reject(proposal_id, actor=principal.name, reason=body.reason))
    _raise_for(result, "the rejection")
    (view,) = (await _store(services, services.queue.proposals(ids=[proposal_id]))).value
    assert view.state is ProposalState.REJECTED
    return json_response({"proposal": proposal_document(services, view)})


# ---- the audit chain ----------------------------------------------------------------------------
@router.get("/v1/audit", summary="The operator audit chain, newest first", responses=openapi.problems(401, 403, 422, 503))
async def audit(
    request: Request, principal: Observer, before: Annotated[int | None, Query(ge=1, le=(1 << 62))] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:  # fmt: skip
    """Who did what, when, why, and before -> after; `before` pages back (the last seq seen)."""
    services = _services(request)
    answer = (await _store(services, services.queue.audit_log(before=before, limit=limit))).value
    return json_response({"entries": [audit_document(e) for e in answer.entries], "count": answer.count,
                          "head": answer.head.hex()})  # fmt: skip
