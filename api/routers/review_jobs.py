"""``/v1/review/jobs``: tracked bulk redrives for tooling, as the review pages run them.

A dry run says what a redrive would act on (count, totals per currency, the oldest, whether four
eyes are needed) and changes nothing. Starting a job resolves the selection or the filter to ids
first (what is shown is what runs), then starts it (201) or proposes it (202) under the same
four-eyes rules as every review action: a bulk above `review.bulk_count_max` always needs a second
person. The store steps the job at its rate (the maintenance driver proposes the steps); each item
ends redriven, refused (no longer dead) or, after a cancel, not redriven.

Who may: reviewers start, dry-run and control jobs; operators, reviewers and approvers read them;
admin may do everything.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from api import across_sets, openapi
from api import review_actions as actions
from api import review_groups as groups
from api.auth import Observer, Principal, requires
from api.http import json_response, known_query
from api.money_view import totals_document
from api.problems import invalid
from api.review_documents import group_document, job_document
from api.review_schemas import ApproveBody, JobBody, JobControlBody, JobFilter, JobSelection, RejectBody
from api.routers.review import PROPOSED, Approver, Decider, GroupKey, SetQuery, proposed_response
from api.schemas import utc
from api.services import ApiServices, of
from ledger.request_ids import NUMBER_MAX
from queues import DeadLetterFilter, ItemResult, JobAction, JobItem, Role

router = APIRouter(tags=["review"], dependencies=[Depends(known_query)])  # an unknown query parameter is a 422
Reviewer = Annotated[Principal, Depends(requires(Role.REVIEWER))]
JobIdPath = Annotated[int, Path(ge=1, le=NUMBER_MAX, description="A redrive job's number.")]


def _services(request: Request) -> ApiServices:
    return of(request)


def dead_filter(query: JobFilter) -> DeadLetterFilter:
    def ms(moment: dt.datetime | None) -> int | None:
        return None if moment is None else actions.store_ms(moment)

    return actions.filter_of(
        kind=query.kind, error_class=query.error_class, ref_key=query.ref_key, dead_from_ms=ms(query.dead_from),
        dead_to_ms=ms(query.dead_to), currency=query.currency, amount_min_minor=query.amount_min_minor,
        amount_max_minor=query.amount_max_minor, attempts_min=query.attempts_min, attempts_max=query.attempts_max,
    )  # fmt: skip


def item_document(services: ApiServices, item: JobItem) -> dict[str, Any]:
    return {"id": actions.public(services, item.message_id), "result": item.result.value, "code": item.code or None,
            "done_at": None if item.done_ms is None else utc(item.done_ms)}  # fmt: skip


def _selection(body: JobSelection) -> tuple[list[str] | None, DeadLetterFilter | None]:
    return body.ids, None if body.filter is None else dead_filter(body.filter)


async def _scoped(services: ApiServices, body: JobSelection) -> ApiServices:
    """The services a filter's `set` names (404 for a set that does not exist); these otherwise."""
    set_id = None if body.filter is None else body.filter.set_id
    if set_id is not None and set_id != services.settings.set_id:
        return await actions.set_named(services, set_id)
    return services


async def _sets_of(services: ApiServices, body: JobSelection) -> list[ApiServices]:
    """The sets a job's dead letters are in: one (a job there, as always), or several (a job
    group, one part per set: api/review_groups.py). One set: these services."""
    scoped = await _scoped(services, body)
    if scoped.sets is None or (body.filter is not None and body.filter.set_id is not None):
        return [scoped]
    return await groups.holding(scoped, *_selection(body))


@router.post("/v1/review/jobs:dry-run", summary="What a redrive would act on: count, totals per currency, oldest",
             responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def dry_run(request: Request, body: JobSelection, principal: Reviewer) -> Response:
    """Changes nothing. `needs_approval` says why four eyes would be needed (null: it would start at once)."""
    selection = _selection(body)
    each = await _sets_of(_services(request), body)
    if len(each) > 1:
        parts = await groups.targets(each, *selection)
        views = [view for _, found in parts for view in found]
        return json_response(groups.dry_run_document(parts, each[0].four_eyes.needs_approval(views)))
    (services,) = each
    result = await actions.dry_run(services, *selection)
    return json_response({
        "count": result.count, "without_amount": result.without_amount, "needs_approval": result.needs_approval,
        "totals": totals_document(result.by_currency),
        "oldest": None if result.oldest_id is None else {
            "id": actions.public(services, result.oldest_id),
            "dead_at": None if result.oldest_dead_ms is None else utc(result.oldest_dead_ms)},
    })  # fmt: skip


@router.post("/v1/review/jobs", status_code=201, summary="Start a tracked redrive job (or propose it)",
             responses={**openapi.problems(401, 403, 404, 409, 422, 503), **PROPOSED})  # fmt: skip
async def start(request: Request, body: JobBody, principal: Reviewer, idempotency_key: GroupKey = None) -> Response:
    """201 with the job (its counters; `refused` ids were not dead at the start and are never
    redriven), or 202 with a proposal: the approval starts it."""
    selection = _selection(body)
    each = await _sets_of(_services(request), body)
    if len(each) > 1:
        return await _start_group(request, body, principal, each, idempotency_key)
    (services,) = each
    views = await actions.targets(services, *selection)
    outcome = await actions.start_job(services, principal.name, body.reason, views, body.rate_per_s)
    if isinstance(outcome, actions.Proposed):
        return await proposed_response(services, outcome, rate_per_s=body.rate_per_s or services.settings.job_rate_per_s)
    document = {**job_document(services, outcome.job),
                "refused_ids": [{"id": actions.public(services, m), "reason": c.name.lower()} for m, c in outcome.refused]}  # fmt: skip
    located = "" if services.sets is None else f"?set={services.settings.set_id}"
    return json_response(document, status=201, headers={"Location": f"/v1/review/jobs/{outcome.job.job_id}{located}"})


async def _start_group(request: Request, body: JobBody, principal: Principal, each: list[ApiServices],
                       idempotency_key: str | None) -> Response:  # fmt: skip
    """A job over several sets' dead letters: a part per set, one group (api/review_groups.py)."""
    parts = await groups.targets(each, *_selection(body))
    group = groups.group_id(principal.name, idempotency_key, body.group)
    created = await groups.start(_services(request), principal.name, body.reason, parts, body.rate_per_s, group)
    document = await group_document(await groups.read_group(_services(request), group))
    document["refused_ids"] = [{"id": actions.public(s, m), "reason": c.name.lower()}
                               for s, refused in created.refused for m, c in refused]  # fmt: skip
    headers = {"Location": f"/v1/review/job-groups/{group}"}
    if created.proposed is not None:
        return json_response({"outcome": "proposed", "why": f"needs a second person's approval: {created.proposed}",
                              "group": document}, status=202, headers=headers)  # fmt: skip
    return json_response(document, status=201, headers=headers)


@router.get("/v1/review/jobs", summary="Redrive jobs, newest first", responses=openapi.problems(401, 403, 404, 422, 503))
async def list_jobs(
    request: Request, principal: Observer, active: bool = False,
    before: Annotated[int | None, Query(ge=1, le=NUMBER_MAX)] = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    set_id: SetQuery = None,
) -> Response:  # fmt: skip
    """Several sets: every set's newest jobs merged by time, each naming its `set`; with `set`, that
    set's only (`before` pages on within one set)."""
    services = _services(request)
    if services.sets is not None and before is not None and set_id is None:
        raise invalid([{"field": "before", "message": "with several sets, page on within one set: give set too"}])
    scoped = await actions.set_named(services, set_id)
    jobs, _ = await across_sets.jobs(scoped, active_only=active, before=before, limit=limit, one_set=set_id is not None)
    return json_response([job_document(s, job) for s, job in jobs])


@router.get("/v1/review/jobs/{job_id}", summary="One redrive job and its counters",
            responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def get_job(request: Request, job_id: JobIdPath, principal: Observer, set_id: SetQuery = None) -> Response:
    services = await actions.set_named(_services(request), set_id)
    return json_response(job_document(services, await actions.job(services, job_id)))


@router.get("/v1/review/jobs/{job_id}/items", summary="A job's items and their results, a page at a time",
            responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def job_items(
    request: Request, job_id: JobIdPath, principal: Observer, result: ItemResult | None = None,
    after: Annotated[str | None, Query(pattern=r"^[1-9][0-9]{0,4}-[1-9][0-9]{0,18}$",
                                       description="next_after of the page before")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100, set_id: SetQuery = None,
) -> Response:  # fmt: skip
    """In request order; `result` keeps one kind (pending, redriven, refused, not_redriven)."""
    services = await actions.set_named(_services(request), set_id)
    await actions.job(services, job_id)
    after_id = 0 if after is None else actions.message_id(services, after)
    if after_id is None:
        raise invalid([{"field": "after", "message": "not a request id this list gave"}])
    items = (await actions.store(services, services.queue.job_items(job_id, after_message_id=after_id, limit=limit,
                                                                    result=result))).value  # fmt: skip
    next_after = actions.public(services, items[-1].message_id) if len(items) == limit else None
    return json_response({"items": [item_document(services, item) for item in items], "next_after": next_after})


async def _control(request: Request, job_id: int, action: str, body: JobControlBody, principal: Principal,
                   set_id: int | None) -> Response:  # fmt: skip
    services = await actions.set_named(_services(request), set_id)
    job = await actions.control_job(services, principal.name, job_id, action, body.reason)
    return json_response(job_document(services, job))


CONTROL_RESPONSES = openapi.problems(401, 403, 404, 409, 422, 503)


@router.post("/v1/review/jobs/{job_id}/pause", summary="Pause a running job", responses=CONTROL_RESPONSES)
async def pause(request: Request, job_id: JobIdPath, body: JobControlBody, principal: Reviewer,
               set_id: SetQuery = None) -> Response:  # fmt: skip
    return await _control(request, job_id, "pause", body, principal, set_id)


@router.post("/v1/review/jobs/{job_id}/resume", summary="Resume a paused job", responses=CONTROL_RESPONSES)
async def resume(request: Request, job_id: JobIdPath, body: JobControlBody, principal: Reviewer,
                set_id: SetQuery = None) -> Response:  # fmt: skip
    return await _control(request, job_id, "resume", body, principal, set_id)


@router.post("/v1/review/jobs/{job_id}/cancel", summary="Cancel a job: what is not redriven yet stays dead",
             responses=CONTROL_RESPONSES)  # fmt: skip
async def cancel(request: Request, job_id: JobIdPath, body: JobControlBody, principal: Reviewer,
                set_id: SetQuery = None) -> Response:  # fmt: skip
    return await _control(request, job_id, "cancel", body, principal, set_id)


# ---- job groups: a job over several sets' dead letters ------------------------------------------
GroupPath = Annotated[str, Path(pattern=groups.GROUP_PATTERN, description="A job group's id (32 hex digits).")]
GROUP_RESPONSES = openapi.problems(401, 403, 404, 409, 422, 503)


@router.get("/v1/review/job-groups/{group}", summary="A job over several sets: the whole and each set's part",
            responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def get_group(
    request: Request, group: GroupPath, principal: Observer,
    partial: Annotated[bool, Query(description="Answer with the sets that answer, naming those that did not, "
                                               "instead of a 503.")] = False,
) -> Response:  # fmt: skip
    """Counters summed over the sets' parts, the group's state (running while any part runs), the
    proposal's money summed per currency, and `sets`: each set's job and proposal."""
    return json_response(await group_document(await groups.read_group(_services(request), group, partial=partial)))


async def _control_group(request: Request, group: str, action: JobAction, body: JobControlBody,
                         principal: Principal) -> Response:  # fmt: skip
    found = await groups.control(_services(request), principal.name, group, action, body.reason)
    return json_response(await group_document(found))


@router.post("/v1/review/job-groups/{group}/pause", summary="Pause every set's part", responses=GROUP_RESPONSES)
async def pause_group(request: Request, group: GroupPath, body: JobControlBody, principal: Reviewer) -> Response:
    return await _control_group(request, group, JobAction.PAUSE, body, principal)


@router.post("/v1/review/job-groups/{group}/resume", summary="Resume every set's paused part", responses=GROUP_RESPONSES)
async def resume_group(request: Request, group: GroupPath, body: JobControlBody, principal: Reviewer) -> Response:
    return await _control_group(request, group, JobAction.RESUME, body, principal)


@router.post("/v1/review/job-groups/{group}/cancel", summary="Cancel every set's part: what is not redriven stays dead",
             responses=GROUP_RESPONSES)  # fmt: skip
async def cancel_group(request: Request, group: GroupPath, body: JobControlBody, principal: Reviewer) -> Response:
    """A part ended already (done or cancelled) counts as done; repeating the call after a set did
    not answer (503 partially-applied) is safe."""
    return await _control_group(request, group, JobAction.CANCEL, body, principal)


@router.post("/v1/review/job-groups/{group}/approve", summary="Approve every set's part: one approval of the whole",
             responses=GROUP_RESPONSES)  # fmt: skip
async def approve_group(request: Request, group: GroupPath, body: ApproveBody, principal: Approver) -> Response:
    """Each set's proposal approved by this approver in its set (its job starts in the same
    command); a part approved already counts as approved. A set that does not answer: the 503
    `partially-applied`; repeating the approval is safe."""
    found, _ = await groups.decide(_services(request), principal.name, group, body.reason, approve=True)
    return json_response(await group_document(found))


@router.post("/v1/review/job-groups/{group}/reject", summary="Reject every set's part, or withdraw your own group",
             responses=GROUP_RESPONSES)  # fmt: skip
async def reject_group(request: Request, group: GroupPath, body: RejectBody, principal: Decider) -> Response:
    found, _ = await groups.decide(_services(request), principal.name, group, body.reason, approve=False,
                                   others=principal.role is not Role.REVIEWER)  # fmt: skip
    return json_response(await group_document(found))


@router.post("/v1/review/job-groups/{group}/repropose", summary="Propose again every set's part whose proposal expired",
             responses=GROUP_RESPONSES)  # fmt: skip
async def repropose_group(request: Request, group: GroupPath, body: JobControlBody, principal: Reviewer) -> Response:
    """A part whose proposal expired unapproved (its set was down until then, the others approved)
    is proposed again in its set with the same targets, by the caller, audited there (`propose`
    naming the group and the proposal it `renews`); the group then waits for its approval
    (`.../approve`: four eyes as before). Repeating is safe: the new proposals are answered. A group
    with no expired part is answered as it is; a rejected one is a 409."""
    found = await groups.propose_again(_services(request), principal.name, group, body.reason)
    return json_response(await group_document(found))
