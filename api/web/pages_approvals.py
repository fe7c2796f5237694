"""``/review/approvals``: the four-eyes inbox. Each pending proposal with what approving it would
do: its targets, the money each will pay once it is done (beside what it held before where that
changes: an edit's new amount, a discard's unpaid one) and the totals per currency of what will be
paid, an edit's diff (an amount as money), a bulk job's size; and approve or reject (with a
reason); the proposer sees "withdraw" on their own instead.

The store decides the four-eyes rules it can alone (the approver is not the proposer, not
expired, the targets still in a state the action allows) and performs the action in the approving
command: this page shows what the store answered, refused targets included.

Must never: offer approval of one's own proposal as if it could work (the store refuses it
anyway), or show a refused target as done.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from starlette.responses import Response

from api import across_sets
from api import review_actions as actions
from api.money_view import WhatIsPaid, diff_rows
from api.problems import Problem, invalid
from api.review_policy import current_payload, diff
from api.services import ApiServices
from api.web.headers import page_router
from api.web.page_support import Flash, NumberPath, before_param, problem_flash, services, set_param
from api.web.rights import Right
from api.web.sessions import WebUser, checked_csrf, current_user, require
from api.web.templating import render
from queues import Discard, EditRedrive, MessageView, ProposalView, RedriveJob, proposal_action

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PostingUser = Annotated[WebUser, Depends(checked_csrf)]
PAGE_SIZE: Final = 50
TARGETS_SHOWN: Final = 20


def describe(
    found: ApiServices, view: ProposalView, paid: WhatIsPaid, targets: Mapping[int, MessageView]
) -> dict[str, Any]:
    """A proposal as the inbox shows it: what it would do, to what, and the money it would pay:
    each target's amount once done beside the amount before where that changes, and the totals
    per currency of what will be paid (api/money_view.py)."""
    action = proposal_action(view)
    described: dict[str, Any] = {
        "view": view, "targets": [actions.public(found, t) for t in view.targets[:TARGETS_SHOWN]],
        "target_count": len(view.targets), "paid": paid,
        "payments": [{"id": actions.public(found, p.message_id), "payment": p} for p in paid.payments[:TARGETS_SHOWN]],
        "changes": None, "reason_code": None, "job": isinstance(action, RedriveJob),
        "label": view.proposal_id if found.sets is None else f"{found.settings.set_id}-{view.proposal_id}",
        "query": "" if found.sets is None else f"?set={found.settings.set_id}",
        "group": action.group if isinstance(action, RedriveJob) else "", "group_set": found.settings.set_id,
    }  # fmt: skip
    if isinstance(action, EditRedrive) and action.message_id in targets:
        before, after = json.loads(current_payload(targets[action.message_id])), json.loads(action.payload)
        described["changes"] = diff_rows(before, after, diff(before, after))
    if isinstance(action, Discard):
        described["reason_code"] = action.reason_code
    return described


async def _inbox(request: Request, user: WebUser, flashes: list[Flash], status: int = 200) -> Response:
    found = services(request)
    show_all = request.query_params.get("all") == "1"
    before = before_param(request)
    unavailable = False
    if found.sets is not None:
        return await _merged_inbox(request, user, found, flashes, status, show_all)
    try:
        views = (await actions.store(found, found.queue.proposals(pending_only=not show_all, before_id=before,
                                                                  limit=PAGE_SIZE))).value  # fmt: skip
        targets = await actions.proposal_targets(found, views)
        proposals = [describe(found, view, actions.what_is_paid(view, targets), targets) for view in views]
    except Problem as problem:
        # Never "no pending proposal" when the inbox could not be read: the error, and its status.
        proposals, views, flashes, unavailable = [], (), [*flashes, problem_flash(problem)], True
        status = status if status >= 400 else problem.type.status
    older = views[-1].proposal_id if len(views) == PAGE_SIZE else None
    return render(request, "approvals.html", {"proposals": proposals, "show_all": show_all, "older": older,
                                              "flashes": flashes, "unavailable": unavailable}, user=user,
                  status=status)  # fmt: skip


async def _merged_inbox(
    request: Request, user: WebUser, found: ApiServices, flashes: list[Flash], status: int, show_all: bool
) -> Response:
    """Several sets: every set's proposals merged by time, each named `{set}-{number}`; a set that
    does not answer is named in a banner (its proposals are missing, never silently)."""
    try:
        merged, unanswered = await across_sets.proposals(found, pending_only=not show_all, before=None, limit=PAGE_SIZE,
                                                         one_set=False, partial=True)  # fmt: skip
        targets: dict[int, dict[int, MessageView]] = {}
        for set_services in {id(s): s for s, _ in merged}.values():
            views = [view for s, view in merged if s is set_services]
            targets[set_services.settings.set_id] = await actions.proposal_targets(set_services, views)
        proposals = [describe(s, view, actions.what_is_paid(view, targets[s.settings.set_id]), targets[s.settings.set_id])
                     for s, view in merged]  # fmt: skip
    except Problem as problem:
        return render(request, "approvals.html", {"proposals": [], "show_all": show_all, "older": None,
                                                  "flashes": [*flashes, problem_flash(problem)], "unavailable": True},
                      user=user, status=status if status >= 400 else problem.type.status)  # fmt: skip
    if unanswered:
        flashes = [*flashes, Flash("error", f"Set {', '.join(map(str, unanswered))} did not answer: its proposals are"
                                            " missing from this list. Reload in a moment.")]  # fmt: skip
    return render(request, "approvals.html", {"proposals": proposals, "show_all": show_all, "older": None,
                                              "flashes": flashes, "unavailable": False}, user=user, status=status)  # fmt: skip


@router.get("/review/approvals")
async def inbox(request: Request, user: User) -> Response:
    require(user, Right.VIEW)
    return await _inbox(request, user, [])


def _label(found: ApiServices, proposal_id: int) -> str:
    return str(proposal_id) if found.sets is None else f"{found.settings.set_id}-{proposal_id}"


async def _reason(request: Request) -> str:
    return str((await request.form()).get("reason") or "").strip()


@router.post("/review/approvals/{proposal_id}/approve")
async def approve(request: Request, proposal_id: NumberPath, user: PostingUser) -> Response:
    require(user, Right.APPROVE)
    found = services(request)
    try:
        found = await actions.set_named(found, set_param(request))
        _, result = await actions.approve(found, user.name, proposal_id, await _reason(request))
    except Problem as problem:
        return await _inbox(request, user, [problem_flash(problem)], problem.type.status)
    done = ", ".join(actions.public(found, m) for m in (*result.ids, *result.new_ids))
    refused = ", ".join(f"{actions.public(found, m)} ({c.name.lower()})" for m, c in result.refused)
    job = getattr(result, "job_id", 0)
    text = f"Approved proposal {_label(found, proposal_id)}" + (f": job {_label(found, job)} started" if job else f"; done: {done or 'nothing'}")
    flashes = [Flash("success", text + ".")]
    if refused:
        flashes.append(Flash("error", f"Not done (the store refused them): {refused}."))
    return await _inbox(request, user, flashes)


async def _decline(request: Request, user: WebUser, proposal_id: int, *, withdraw: bool) -> Response:
    found = services(request)
    reason = await _reason(request) or ("withdrawn by the proposer" if withdraw else "")
    try:
        if not reason:
            raise invalid([{"field": "reason", "message": "say why the proposal is rejected"}])
        found = await actions.set_named(found, set_param(request))
        await actions.reject(found, user.name, proposal_id, reason, others=not withdraw)
    except Problem as problem:
        return await _inbox(request, user, [problem_flash(problem)], problem.type.status)
    verb = "Withdrew" if withdraw else "Rejected"
    return await _inbox(request, user, [Flash("success", f"{verb} proposal {_label(found, proposal_id)}: nothing was done.")])


@router.post("/review/approvals/{proposal_id}/reject")
async def reject(request: Request, proposal_id: NumberPath, user: PostingUser) -> Response:
    require(user, Right.REJECT)
    return await _decline(request, user, proposal_id, withdraw=False)


@router.post("/review/approvals/{proposal_id}/withdraw")
async def withdraw(request: Request, proposal_id: NumberPath, user: PostingUser) -> Response:
    """The proposer takes their own proposal back (anyone else is refused: that is a rejection)."""
    require(user, Right.VIEW)
    return await _decline(request, user, proposal_id, withdraw=True)
