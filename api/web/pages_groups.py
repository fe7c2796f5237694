"""``/review/job-groups/{group}``: a redrive job over several sets' dead letters, as one (docs/review.md,
"Job groups"; api/review_groups.py): its state and counters summed over the parts, what approving it
pays per currency summed over the sets, each set's part, one approval (or rejection) of every part,
pause, resume and cancel of every part, and a new proposal of the parts whose proposal expired.

Must never: show a group as whole when a set did not answer (the set is named), or report an action
done in every set when a set missed it (the partially-applied problem says which, and the button
can be pressed again).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request
from starlette.responses import Response

from api import review_groups as groups
from api.problems import Problem, invalid
from api.web.headers import page_router
from api.web.page_support import Flash, problem_flash, problem_page, services
from api.web.rights import Right
from api.web.sessions import WebUser, checked_csrf, current_user, require
from api.web.templating import render
from queues import JobAction, JobState, ProposalState

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PostingUser = Annotated[WebUser, Depends(checked_csrf)]
GroupPath = Annotated[str, Path(pattern=groups.GROUP_PATTERN)]
DONE = {"approve": "Approved every set's part: each set's job started.", "reject": "Rejected every set's part: nothing was done.",
        "withdraw": "Withdrew every set's part: nothing was done.", "pause": "Paused every set's part.",
        "resume": "Resumed every set's part.", "cancel": "Cancelled every set's part: what was not redriven stays dead.",
        "repropose": "Proposed the expired parts again: the group waits for an approver's approval."}  # fmt: skip


async def _page(request: Request, user: WebUser, group_id: str, flashes: list[Flash], status: int = 200) -> Response:
    try:
        group = await groups.read_group(services(request), group_id, partial=True)
        whole = await groups.whole(group)
    except Problem as problem:
        return problem_page(request, user, problem)
    states = {p.job.state for p in group.parts if p.job is not None}
    controls = [action for action, able in (("pause", JobState.RUNNING in states), ("resume", JobState.PAUSED in states),
                                            ("cancel", bool(states & {JobState.RUNNING, JobState.PAUSED})))
                if able]  # fmt: skip
    first = group.parts[0] if group.parts else None
    actor = reason = ""
    if first is not None and first.job is not None:
        actor, reason = first.job.actor, first.job.reason
    elif first is not None and first.proposal is not None:
        actor, reason = first.proposal.proposer, first.proposal.reason
    own = bool(whole.proposals) and whole.proposals[0].proposer == user.name
    expired = [p.set_id for p in group.parts if p.job is None and p.proposal is not None
               and p.proposal.state is ProposalState.EXPIRED]  # fmt: skip
    if any(p.state is ProposalState.REJECTED for p in whole.proposals):
        expired = []  # a rejected group is not proposed again
    context: dict[str, Any] = {"group": group, "whole": whole, "controls": controls, "actor": actor, "reason": reason,
                               "own": own, "flashes": flashes, "expired": expired}  # fmt: skip
    return render(request, "job_group.html", context, user=user, status=status)


@router.get("/review/job-groups/{group}")
async def page(request: Request, group: GroupPath, user: User) -> Response:
    require(user, Right.VIEW)
    return await _page(request, user, group, [])


def flash_of(problem: Problem) -> Flash:
    """A set that missed the action: say what was done where (not "nothing was done")."""
    if problem.type.name == "partially-applied":
        return Flash("error", f"{problem.type.title}: {problem.detail}")
    return problem_flash(problem)


@router.post("/review/job-groups/{group}/{action}")
async def act(request: Request, group: GroupPath, action: str, user: PostingUser) -> Response:
    """approve, reject, withdraw (the proposer's own), pause, resume or cancel, on every set's part;
    repropose, of every part whose proposal expired."""
    rights = {"approve": Right.APPROVE, "reject": Right.REJECT, "withdraw": Right.VIEW, "pause": Right.MANAGE_JOBS,
              "resume": Right.MANAGE_JOBS, "cancel": Right.MANAGE_JOBS, "repropose": Right.MANAGE_JOBS}  # fmt: skip
    if action not in rights:
        return problem_page(request, user, Problem("not-found", f"no action {action[:20]} on a job group"))
    require(user, rights[action])
    reason = str((await request.form()).get("reason") or "").strip()
    found = services(request)
    try:
        if action in ("pause", "resume", "cancel", "repropose") and not reason:
            raise invalid([{"field": "reason", "message": "say why, for the audit"}])
        if action == "repropose":
            await groups.propose_again(found, user.name, group, reason)
        elif action in ("pause", "resume", "cancel"):
            await groups.control(found, user.name, group, JobAction(action), reason)
        elif action == "approve":
            await groups.decide(found, user.name, group, reason, approve=True)
        else:
            reason = reason or ("withdrawn by the proposer" if action == "withdraw" else "")
            if not reason:
                raise invalid([{"field": "reason", "message": "say why the proposal is rejected"}])
            await groups.decide(found, user.name, group, reason, approve=False, others=action == "reject")
    except Problem as problem:
        return await _page(request, user, group, [flash_of(problem)], problem.type.status)
    return await _page(request, user, group, [Flash("success", DONE[action])])
