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
from api.auth import Observer, Principal, requires
from api.http import json_response, known_query
from api.money_view import totals_document
from api.problems import invalid
from api.review_schemas import JobBody, JobControlBody, JobFilter, JobSelection
from api.routers.review import PROPOSED, SetQuery, proposed_response
from api.schemas import utc
from api.services import ApiServices, of
from ledger.request_ids import NUMBER_MAX
from queues import DeadLetterFilter, ItemResult, JobItem, JobView, Role

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


def job_document(services: ApiServices, job: JobView) -> dict[str, Any]:
    document = {
        "id": job.job_id, "state": job.state.value, "total": job.total, "pending": job.pending,
        "redriven": job.redriven, "refused": job.refused, "not_redriven": job.not_redriven,
        "rate_per_s": job.rate_per_s, "actor": job.actor, "reason": job.reason, "proposal": job.proposal_id,
        "approved_by": job.approved_by, "controlled_by": job.controlled_by, "created_at": utc(job.created_ms),
        "last_step_at": None if job.last_step_ms is None else utc(job.last_step_ms),
        "finished_at": None if job.finished_ms is None else utc(job.finished_ms),
    }  # fmt: skip
    if services.sets is not None:
        document["set"] = services.settings.set_id  # several sets: the job's number is its set's
    return document


def item_document(services: ApiServices, item: JobItem) -> dict[str, Any]:
    return {"id": actions.public(services, item.message_id), "result": item.result.value, "code": item.code or None,
            "done_at": None if item.done_ms is None else utc(item.done_ms)}  # fmt: skip


def _selection(body: JobSelection) -> tuple[list[str] | None, DeadLetterFilter | None]:
    return body.ids, None if body.filter is None else dead_filter(body.filter)


async def _in_set_of(services: ApiServices, ids: list[str] | None, selected: DeadLetterFilter | None) -> ApiServices:
    """Several sets: the one set a job's dead letters are in (a job lives in one set; a selection or
    filter spanning sets is refused whole: docs/review.md, "Several sets")."""
    if ids is not None:
        return await actions.one_set(services, ids)
    assert selected is not None
    return await actions.filter_set(services, selected)


@router.post("/v1/review/jobs:dry-run", summary="What a redrive would act on: count, totals per currency, oldest",
             responses=openapi.problems(401, 403, 404, 422, 503))  # fmt: skip
async def dry_run(request: Request, body: JobSelection, principal: Reviewer) -> Response:
    """Changes nothing. `needs_approval` says why four eyes would be needed (null: it would start at once)."""
    selection = _selection(body)
    services = await _in_set_of(_services(request), *selection)
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
async def start(request: Request, body: JobBody, principal: Reviewer) -> Response:
    """201 with the job (its counters; `refused` ids were not dead at the start and are never
    redriven), or 202 with a proposal: the approval starts it."""
    selection = _selection(body)
    services = await _in_set_of(_services(request), *selection)
    views = await actions.targets(services, *selection)
    outcome = await actions.start_job(services, principal.name, body.reason, views, body.rate_per_s)
    if isinstance(outcome, actions.Proposed):
        return await proposed_response(services, outcome, rate_per_s=body.rate_per_s or services.settings.job_rate_per_s)
    document = {**job_document(services, outcome.job),
                "refused_ids": [{"id": actions.public(services, m), "reason": c.name.lower()} for m, c in outcome.refused]}  # fmt: skip
    located = "" if services.sets is None else f"?set={services.settings.set_id}"
    return json_response(document, status=201, headers={"Location": f"/v1/review/jobs/{outcome.job.job_id}{located}"})


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
