"""Bulk redrives from the review pages: the dry run, the confirmation that starts a tracked job
(or proposes it under four eyes), the jobs list, and a job's page with its progress (htmx polls
it while the job runs), its items a page at a time, and pause, resume and cancel.

A job redrives at its rate as the maintenance driver steps it, so a page shows a job as the store
has it now: an item counts as redriven only once the store redrove it; a cancel leaves the rest
dead and lists them as not redriven.

Must never: start a job nobody saw the dry run of (the confirmation carries the same selection the
dry run showed), or show a pending or refused item as done.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import Depends, Path, Request
from starlette.datastructures import FormData
from starlette.responses import RedirectResponse, Response

from api import across_sets
from api import review_actions as actions
from api import review_groups as groups
from api.problems import Problem, invalid
from api.services import ApiServices
from api.web import pages_groups
from api.web.headers import page_router
from api.web.page_support import (
    FILTER_LABELS,
    Flash,
    NumberPath,
    before_param,
    parse_filter,
    problem_flash,
    problem_page,
    services,
    set_param,
)
from api.web.rights import Right
from api.web.sessions import WebUser, checked_csrf, current_user, require
from api.web.templating import render
from queues import DeadLetterFilter, ItemResult, JobState, MessageView

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PostingUser = Annotated[WebUser, Depends(checked_csrf)]
ITEMS_PAGE: Final = 100
JOBS_PAGE: Final = 50
CONTROLS: Final = {JobState.RUNNING: ("pause", "cancel"), JobState.PAUSED: ("resume", "cancel")}


def _selection(form: FormData, *, sets: bool) -> tuple[list[str] | None, DeadLetterFilter | None, dict[str, Any]]:
    """The ids or the filter a form carries, and what to carry into the next form."""
    filter_form = parse_filter(form, sets=sets)
    if form.get("scope") == "filter":
        if filter_form.dead_filter is None:
            raise invalid([{"field": k, "message": v} for k, v in filter_form.errors.items()])
        return None, filter_form.dead_filter, {"scope": "filter", "values": filter_form.values, "ids": []}
    ids = [str(i) for i in form.getlist("ids") if isinstance(i, str) and i]
    if not ids:
        raise invalid([{"field": "ids", "message": "select at least one dead letter"}])
    return ids, None, {"scope": "selection", "values": {}, "ids": ids}


def _dry_run_context(found: ApiServices, result: actions.DryRun, carried: dict[str, Any]) -> dict[str, Any]:
    """The dry run's figures, and what it acts on as the person chose it: the selected ids, or
    the filter's fields as they were typed (with a link back to the list under that filter)."""
    oldest = None if result.oldest_id is None else actions.public(found, result.oldest_id)
    typed = {name: value for name, value in carried.get("values", {}).items() if value}
    return {"dry": result, "oldest_id": oldest, "carried": carried, "default_rate": found.settings.job_rate_per_s,
            "filter_fields": [(name, FILTER_LABELS[name], value) for name, value in typed.items() if name in FILTER_LABELS],
            "filter_query": urlencode(typed)}  # fmt: skip


@router.post("/review/redrive/dry-run")
async def dry_run(request: Request, user: PostingUser) -> Response:
    """Count, totals per currency and the oldest of what the redrive would act on; nothing changes."""
    require(user, Right.REDRIVE)
    found = services(request)
    try:
        ids, dead_filter, carried = _selection(await request.form(), sets=found.sets is not None)
        each = await _sets_of(found, ids, dead_filter, carried)
        if len(each) > 1:
            parts = await groups.targets(each, ids, dead_filter)
            return render(request, "dry_run.html", _group_dry_run(parts, carried, secrets.token_hex(16)), user=user)
        (found,) = each
        result = await actions.dry_run(found, ids, dead_filter)
    except Problem as problem:
        return problem_page(request, user, problem)
    return render(request, "dry_run.html", _dry_run_context(found, result, carried), user=user)


def _group_dry_run(
    parts: list[tuple[ApiServices, list[MessageView]]], carried: dict[str, Any], group: str
) -> dict[str, Any]:
    """The dry run of a job over several sets: the whole (four eyes decided on it) and each set's
    part; the confirmation carries the group id, so confirming twice creates each part once."""
    every = [view for _, views in parts for view in views]
    first = parts[0][0]
    summed = actions.dry_run_of(first, every)
    oldest_set, oldest = min(((s, v) for s, views in parts for v in views),
                             key=lambda sv: (sv[1].dead_ms if sv[1].dead_ms is not None else 1 << 62,
                                             sv[0].settings.set_id, sv[1].message_id))  # fmt: skip
    context = _dry_run_context(first, summed, {**carried, "group": group})
    context["oldest_id"] = actions.public(oldest_set, oldest.message_id)
    context["per_set"] = [(s.settings.set_id, len(views), actions.totals(views)[0]) for s, views in parts]
    return context


@router.post("/review/redrive")
async def start(request: Request, user: PostingUser) -> Response:
    """The confirmation: the same selection as the dry run, a reason and a rate; a job starts (its
    page follows) or a proposal waits for an approver."""
    require(user, Right.MANAGE_JOBS)
    found = services(request)
    form = await request.form()
    reason = str(form.get("reason") or "").strip()
    rate_text = str(form.get("rate_per_s") or "").strip()
    carried: dict[str, Any] = {}
    parts: list[tuple[ApiServices, list[MessageView]]] = []
    try:
        ids, dead_filter, carried = _selection(form, sets=found.sets is not None)
        if not reason:
            raise invalid([{"field": "reason", "message": "say why, for the audit"}])
        if rate_text and not rate_text.isdigit():
            raise invalid([{"field": "rate_per_s", "message": "a whole number of dead letters per second"}])
        each = await _sets_of(found, ids, dead_filter, carried)
        if len(each) > 1:
            group = str(form.get("group") or "")
            if re.fullmatch(groups.GROUP_PATTERN, group) is None:
                raise invalid([{"field": "group", "message": "confirm from the dry run's page"}])
            parts = await groups.targets(each, ids, dead_filter)
            await groups.start(found, user.name, reason, parts, int(rate_text) if rate_text else None, group)
            return RedirectResponse(f"/review/job-groups/{group}", status_code=303)
        (found,) = each
        views = await actions.targets(found, ids, dead_filter)
        outcome = await actions.start_job(found, user.name, reason, views, int(rate_text) if rate_text else None)
    except Problem as problem:
        if not carried:
            return problem_page(request, user, problem)
        group = str(form.get("group") or "")
        if parts and re.fullmatch(groups.GROUP_PATTERN, group):  # a group's start: the same group again
            context = {**_group_dry_run(parts, carried, group), "flashes": [pages_groups.flash_of(problem)],
                       "reason": reason}  # fmt: skip
            return render(request, "dry_run.html", context, user=user, status=problem.type.status)
        try:
            result = await actions.dry_run(found, carried["ids"] or None, None if carried["ids"] else dead_filter_of(carried))
        except Problem:
            return problem_page(request, user, problem)
        context = {**_dry_run_context(found, result, carried), "flashes": [problem_flash(problem)], "reason": reason}
        return render(request, "dry_run.html", context, user=user, status=problem.type.status)
    if isinstance(outcome, actions.Proposed):
        flash = Flash("proposed", f"Proposal {_label(found, outcome.proposal.proposal_id)} created: no job runs until an approver "
                                  f"approves it ({outcome.why}).")  # fmt: skip
        context = _dry_run_context(found, actions.dry_run_of(found, views), carried)
        return render(request, "dry_run.html", {**context, "flashes": [flash], "proposal_id": outcome.proposal.proposal_id},
                      user=user)  # fmt: skip
    located = "" if found.sets is None else f"&set={found.settings.set_id}"
    return RedirectResponse(f"/review/jobs/{outcome.job.job_id}?started=1{located}", status_code=303)


async def _sets_of(
    found: ApiServices, ids: list[str] | None, dead_filter: DeadLetterFilter | None, carried: dict[str, Any]
) -> list[ApiServices]:
    """The sets a job's dead letters are in: the filter's `set`, or the sets a selection or filter
    matches (several: a job group, one part per set: docs/review.md, "Job groups")."""
    chosen = carried.get("values", {}).get("set")
    if found.sets is not None and ids is None and chosen:
        return [await actions.set_named(found, int(chosen))]
    if found.sets is None:
        return [found]
    return await groups.holding(found, ids, dead_filter)


def _label(found: ApiServices, number: int) -> str:
    """A proposal's or a job's number as the pages show it: `3-4` with several sets (its set's number)."""
    return str(number) if found.sets is None else f"{found.settings.set_id}-{number}"


def _set_q(found: ApiServices) -> str:
    return "" if found.sets is None else f"set={found.settings.set_id}"


def dead_filter_of(carried: dict[str, Any]) -> DeadLetterFilter | None:
    return parse_filter(carried["values"], sets="set" in carried["values"]).dead_filter


@router.get("/review/jobs")
async def jobs(request: Request, user: User) -> Response:
    require(user, Right.VIEW)
    found = services(request)
    before = before_param(request)
    if found.sets is not None:
        return await _merged_jobs(request, user, found)
    try:
        listed = (await actions.store(found, found.queue.jobs(before_id=before, limit=JOBS_PAGE))).value
    except Problem as problem:
        return problem_page(request, user, problem)
    older = listed[-1].job_id if len(listed) == JOBS_PAGE else None
    return render(request, "jobs.html", {"jobs": listed, "older": older}, user=user)


async def _merged_jobs(request: Request, user: WebUser, found: ApiServices) -> Response:
    """Several sets: every set's newest jobs merged by time, each named `{set}-{number}`; a set that
    does not answer is named in a banner."""
    try:
        merged, unanswered = await across_sets.jobs(found, active_only=False, before=None, limit=JOBS_PAGE,
                                                    one_set=False, partial=True)  # fmt: skip
    except Problem as problem:
        return problem_page(request, user, problem)
    flashes = [Flash("error", f"Set {', '.join(map(str, unanswered))} did not answer: its jobs are missing from this"
                              " list. Reload in a moment.")] if unanswered else []  # fmt: skip
    return render(request, "jobs.html", {"jobs": [job for _, job in merged], "older": None, "flashes": flashes,
                                         "labels": [_label(s, job.job_id) for s, job in merged],
                                         "queries": [f"?{_set_q(s)}" for s, _ in merged]}, user=user)  # fmt: skip


async def _job_context(request: Request, job_id: int) -> dict[str, Any]:
    found = await actions.set_named(services(request), set_param(request))
    job = await actions.job(found, job_id)
    result_text = request.query_params.get("result", "")
    result = ItemResult(result_text) if result_text in {r.value for r in ItemResult} else None
    after = actions.message_id(found, request.query_params.get("after", "")) or 0
    items = (await actions.store(found, found.queue.job_items(job_id, after_message_id=after, limit=ITEMS_PAGE,
                                                              result=result))).value  # fmt: skip
    return {
        "job": job, "controls": CONTROLS.get(job.state, ()), "result": result_text if result else "",
        "items": [{"id": actions.public(found, i.message_id), "result": i.result.value, "code": i.code,
                   "done_ms": i.done_ms} for i in items],
        "next_after": actions.public(found, items[-1].message_id) if len(items) == ITEMS_PAGE else None,
        "first_page": after == 0, "results": [r.value for r in ItemResult],
        **({} if found.sets is None else {"label": _label(found, job_id), "set_q": _set_q(found)}),
    }  # fmt: skip


@router.get("/review/jobs/{job_id}")
async def job_page(request: Request, job_id: NumberPath, user: User) -> Response:
    require(user, Right.VIEW)
    try:
        context = await _job_context(request, job_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    if request.query_params.get("started") == "1":
        context["flashes"] = [Flash("success", f"Job {context.get('label', job_id)} started: it redrives {context['job'].total} dead letters "
                                               f"at {context['job'].rate_per_s} a second.")]  # fmt: skip
    return render(request, "job.html", context, user=user)


@router.get("/review/jobs/{job_id}/progress")
async def progress(request: Request, job_id: NumberPath, user: User) -> Response:
    """The counters alone, for htmx to poll while the job runs (it stops polling once it ends)."""
    require(user, Right.VIEW)
    try:
        found = await actions.set_named(services(request), set_param(request))
        job = await actions.job(found, job_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    return render(request, "job_progress.html", {"job": job, **({} if found.sets is None else {"set_q": _set_q(found)})},
                  user=user)  # fmt: skip


@router.post("/review/jobs/{job_id}/{action}")
async def control(request: Request, job_id: NumberPath, action: Annotated[str, Path(max_length=16)], user: PostingUser) -> Response:
    """Pause, resume or cancel, with a reason for the audit."""
    require(user, Right.MANAGE_JOBS)
    found = services(request)
    reason = str((await request.form()).get("reason") or "").strip()
    try:
        if action not in {"pause", "resume", "cancel"}:
            raise Problem("not-found", f"a job cannot {action}")
        if not reason:
            raise invalid([{"field": "reason", "message": f"say why you {action} the job"}])
        found = await actions.set_named(found, set_param(request))
        job = await actions.control_job(found, user.name, job_id, action, reason)
        flash = Flash("success", f"Job {_label(found, job_id)} is {job.state.value}." + (
            f" {job.not_redriven} dead letters were not redriven and stay dead." if job.state is JobState.CANCELLED else ""))
    except Problem as problem:
        flash = problem_flash(problem)
        status = problem.type.status
    else:
        status = 200
    try:
        context = await _job_context(request, job_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    return render(request, "job.html", {**context, "flashes": [flash]}, user=user, status=status)
