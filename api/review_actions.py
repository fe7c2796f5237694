"""The review actions, once: what the JSON API (api/routers/review.py) and the review pages
(api/web/) both do when someone redrives, edits, discards, approves or rejects.

The rules live here so the two front ends cannot drift apart: which ids a selection or a filter
stands for, the edit's schema check and diff, the discard's reason code, the four-eyes decision
(an action `FourEyes` catches becomes a proposal, never a silent success), and what a store
refusal means for a person. A front end only turns the outcome into JSON or HTML.

Must never: know about HTTP requests, sessions or templates (a `Problem` is plain data that each
front end renders its own way); count as done what the store refused.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from api import money_view
from api.money_view import money_of_payload
from api.problems import Problem, invalid
from api.review_policy import current_payload, diff
from api.services import ApiServices
from ledger.kinds import PAYLOAD_MODELS, Kind, encode_payload
from ledger.request_ids import RequestId
from queues import (
    JOB_IDS_MAX,
    JOB_RATE_MAX,
    TIME_MS_MAX,
    ClientError,
    Code,
    DeadLetterFilter,
    Discard,
    EditRedrive,
    JobAction,
    JobView,
    MessageView,
    ProposalView,
    QueueError,
    Redrive,
    RedriveJob,
    ReviewAction,
    ReviewResult,
    proposal_action,
)
from submission.rules import field_errors

T = TypeVar("T")
Refused = tuple[tuple[int, Code], ...]
PAGE_MAX: Final = 1000
"""The store's largest dead-letter page: a filter is resolved to ids this many at a time."""


@dataclass(frozen=True, slots=True)
class Done:
    """The store did it: `ids` were acted on, `refused` were not (each with why)."""

    ids: tuple[int, ...]
    refused: Refused = ()
    new_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Proposed:
    """Four eyes: nothing was done yet; the proposal waits for a second person."""

    proposal: ProposalView
    why: str
    refused: Refused = ()


@dataclass(frozen=True, slots=True)
class JobStarted:
    """A redrive job runs; `refused`: ids that were not dead when it started (never redriven)."""

    job: JobView
    refused: Refused = ()


@dataclass(frozen=True, slots=True)
class DryRun:
    """What a redrive would act on, before anyone confirms it: nothing is changed to learn it."""

    count: int
    by_currency: tuple[tuple[str, int, int], ...]
    """(currency, count, total amount_minor)."""
    without_amount: int
    oldest_dead_ms: int | None
    oldest_id: int | None
    needs_approval: str | None
    """Why four eyes would be needed, or None when it would start at once."""


@dataclass(frozen=True, slots=True)
class CheckedEdit:
    """An edit that passed the kind's schema, with what it changes."""

    view: MessageView
    payload: bytes
    changes: dict[str, dict[str, Any]]


async def store(services: ApiServices, call: Awaitable[T]) -> T:
    """The store's answer, or the problem a person or a tool can act on (503 or 422)."""
    try:
        return await call
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None


def store_ms(moment: dt.datetime) -> int:
    """An aware time as the store's milliseconds, clamped to its range: nothing is dead, or
    audited, outside the store's times, so a bound beyond them selects the same as the edge."""
    return max(0, min(TIME_MS_MAX, int(moment.timestamp() * 1000)))


def public(services: ApiServices, message_id: int) -> str:
    return str(RequestId(services.settings.set_id, message_id))


def message_id(services: ApiServices, text: str) -> int | None:
    """The store's id behind a public id, or None for one this set could not have issued."""
    parsed = RequestId.parse(text)
    return None if parsed is None or parsed.set_id != services.settings.set_id else parsed.message_id


async def in_set_of(services: ApiServices, request_id: str) -> ApiServices:
    """The services of the set a request id names (docs/review.md, "Several sets"): a request of
    any set is read and acted on in its own set, and a proposal of it lives there. One set: these
    services (an id of another set is then `request`'s 404, as always)."""
    parsed = RequestId.parse(request_id)
    if services.sets is None or parsed is None:
        return services
    found = await services.in_set(parsed.set_id)
    if found is None:
        raise Problem("not-found", f"no request {request_id}")
    return found


async def set_named(services: ApiServices, set_id: int | None) -> ApiServices:
    """The services of a set a proposal or a job names (`?set=3`); None: these (the home set)."""
    if set_id is None:
        return services
    found = await services.in_set(set_id)
    if found is None:
        raise Problem("not-found", f"no set {set_id}")
    return found


async def request(services: ApiServices, request_id: str) -> MessageView:
    found = message_id(services, request_id)
    view = None if found is None else (await store(services, services.queue.get(found))).value
    if view is None:
        raise Problem("not-found", f"no request {request_id}")
    return view


async def selected(services: ApiServices, request_ids: Sequence[str]) -> list[MessageView]:
    """The requests of a selection: all of them exist, or the whole selection is refused."""
    ids = [message_id(services, text) for text in request_ids]
    known = [m for m in ids if m is not None]
    if len(known) != len(ids):
        raise Problem("not-found", "some of the requests do not exist")
    views = await views_of(services, known)
    if len(views) != len(set(known)):
        raise Problem("not-found", "some of the requests do not exist")
    return views


async def views_of(services: ApiServices, ids: Sequence[int]) -> list[MessageView]:
    """The requests with these ids (those that exist), a store query of at most PAGE_MAX ids at a
    time: a job's selection or a bulk proposal may name up to 100,000."""
    views: list[MessageView] = []
    for start in range(0, len(ids), PAGE_MAX):
        chunk = ids[start:start + PAGE_MAX]
        views.extend((await store(services, services.queue.get_many(chunk, with_history=False))).value)
    return views


async def matching(services: ApiServices, dead_filter: DeadLetterFilter, limit: int) -> list[MessageView]:
    """The dead letters a filter matches now, oldest first, up to `limit`: what is shown is what
    is acted on (a letter that matches later is not included)."""
    views: list[MessageView] = []
    cursor: str | None = None
    while len(views) < limit:
        page = (await store(services, services.queue.dead_letters(
            dead_filter, cursor=cursor, limit=min(PAGE_MAX, limit - len(views))))).value  # fmt: skip
        views.extend(page.items)
        cursor = page.next_cursor
        if cursor is None or not page.items:
            break
    if not views:
        raise Problem("not-found", "no dead letter matches the filter")
    return views


async def targets(services: ApiServices, ids: Sequence[str] | None, dead_filter: DeadLetterFilter | None) -> list[MessageView]:
    """A job's dead letters: a selection, or everything a filter matches now (at most a job's size)."""
    if ids is not None:
        return await selected(services, ids)
    assert dead_filter is not None
    summary = (await store(services, services.queue.dead_letter_summary(dead_filter))).value
    if summary.count > JOB_IDS_MAX:
        raise invalid([{"field": "filter", "message": f"matches {summary.count} dead letters; a job holds at most "
                                                      f"{JOB_IDS_MAX}: narrow it"}])  # fmt: skip
    return await matching(services, dead_filter, JOB_IDS_MAX)


async def dry_run(services: ApiServices, ids: Sequence[str] | None, dead_filter: DeadLetterFilter | None) -> DryRun:
    """Count, totals per currency and the oldest, for a selection or a filter; and whether four
    eyes would be needed (decided on the same requests a start would resolve)."""
    try:
        views = await targets(services, ids, dead_filter)
    except Problem as problem:
        if ids is not None or problem.type.name != "not-found":
            raise
        return DryRun(count=0, by_currency=(), without_amount=0, oldest_dead_ms=None, oldest_id=None, needs_approval=None)
    return dry_run_of(services, views)


def dry_run_of(services: ApiServices, views: Sequence[MessageView]) -> DryRun:
    """The dry run's figures for requests already read (at least one)."""
    by_currency, without = totals(views)
    oldest = min(views, key=lambda v: (v.dead_ms if v.dead_ms is not None else 1 << 62, v.message_id))
    return DryRun(count=len(views), by_currency=by_currency, without_amount=without, oldest_dead_ms=oldest.dead_ms,
                  oldest_id=oldest.message_id, needs_approval=services.four_eyes.needs_approval(views))  # fmt: skip


def totals(views: Sequence[MessageView]) -> tuple[tuple[tuple[str, int, int], ...], int]:
    """(currency, count, amount_minor total) per currency, sorted, and how many have no amount."""
    return money_view.totals(money_of_payload(current_payload(view)) for view in views)


async def proposal_targets(services: ApiServices, proposals: Sequence[ProposalView]) -> dict[int, MessageView]:
    """The targets of these proposals as they are now, read once for all (a page of proposals may
    share targets, and a job's proposal may name 100,000)."""
    ids = sorted({target for view in proposals for target in view.targets})
    return {view.message_id: view for view in await views_of(services, ids)}


def what_is_paid(proposal: ProposalView, targets: Mapping[int, MessageView]) -> money_view.WhatIsPaid:
    """What approving the proposal would pay, from its targets as read (`proposal_targets`)."""
    return money_view.what_is_paid(proposal_action(proposal), [targets[t] for t in proposal.targets if t in targets])


async def start_job(
    services: ApiServices, actor: str, reason: str, views: Sequence[MessageView], rate_per_s: int | None
) -> JobStarted | Proposed:
    """A tracked redrive job of these dead letters, or its proposal (a bulk above the configured
    count always needs a second person, as do money-moving kinds)."""
    rate = rate_per_s or services.settings.job_rate_per_s
    if not 1 <= rate <= JOB_RATE_MAX:
        raise invalid([{"field": "rate_per_s", "message": f"must be in 1..{JOB_RATE_MAX}"}])
    action = RedriveJob(actor=actor, reason=reason, ids=tuple(v.message_id for v in views), rate_per_s=rate)
    why = services.four_eyes.needs_approval(views)
    if why is not None:
        return await _propose(services, action, why)
    result = await store(services, services.queue.start_job(action))
    raise_for(result, "the job")
    assert result.job_id is not None
    return JobStarted(await job(services, result.job_id), refused=result.refused)


async def job(services: ApiServices, job_id: int) -> JobView:
    found = (await store(services, services.queue.jobs(ids=[job_id]))).value
    if not found:
        raise Problem("not-found", f"no job {job_id}")
    return found[0]


async def control_job(services: ApiServices, actor: str, job_id: int, action: str, reason: str) -> JobView:
    """Pause, resume or cancel; a cancel leaves every item not yet redriven dead, listed as such."""
    await job(services, job_id)
    result = await store(services, services.queue.control_job(job_id, JobAction(action), actor=actor, reason=reason))
    raise_for(result, f"the job's {action}")
    return await job(services, job_id)


def amount(view: MessageView) -> tuple[int, str] | None:
    """The amount at stake (minor units, currency), when the payload has one (a masked payload too)."""
    money = money_of_payload(current_payload(view))
    return None if money is None else (money.amount_minor, money.currency)


async def _propose(services: ApiServices, action: ReviewAction, why: str) -> Proposed:
    result = await store(services, services.queue.propose(action, ttl_ms=services.four_eyes.proposal_ttl_ms))
    raise_for(result, "the proposal")
    return Proposed(await proposal(services, result.proposal_id), why=f"needs a second person's approval: {why}",
                    refused=result.refused)  # fmt: skip


async def proposal(services: ApiServices, proposal_id: int) -> ProposalView:
    found = (await store(services, services.queue.proposals(ids=[proposal_id]))).value
    if not found:
        raise Problem("not-found", f"no proposal {proposal_id}")
    return found[0]


def raise_for(result: ReviewResult, what: str) -> None:
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


async def redrive(services: ApiServices, actor: str, reason: str, views: Sequence[MessageView]) -> Done | Proposed:
    action = Redrive(actor=actor, reason=reason, ids=tuple(v.message_id for v in views))
    why = services.four_eyes.needs_approval(views)
    if why is not None:
        return await _propose(services, action, why)
    result = await store(services, services.queue.redrive(actor, reason, ids=action.ids))
    return Done(ids=result.ids, refused=result.refused)


def checked_edit(view: MessageView, document: Any) -> CheckedEdit:
    """The edited payload validated against the kind's schema: a bad one is refused naming the
    field (`payload.amount_minor`), an unchanged one naming `payload`."""
    try:
        model = PAYLOAD_MODELS[Kind(view.kind)]
    except ValueError:
        raise Problem("conflict", f"requests of kind {view.kind} cannot be edited here") from None
    try:
        payload = encode_payload(model.model_validate(document))  # type: ignore[arg-type]
    except ValidationError as error:
        errors = field_errors(error.errors())
        raise invalid([{**e, "field": "payload" if e["field"] == "(body)" else f"payload.{e['field']}"}
                       for e in errors]) from None  # fmt: skip
    changes = diff(json.loads(current_payload(view)), json.loads(payload))
    if not changes:
        raise invalid([{"field": "payload", "message": "unchanged: redrive it instead"}])
    return CheckedEdit(view, payload, changes)


async def edit(services: ApiServices, actor: str, reason: str, checked: CheckedEdit) -> Done | Proposed:
    """A new version linked to the original, which is kept unchanged (or a proposal of it)."""
    view = checked.view
    action = EditRedrive(message_id=view.message_id, payload=checked.payload, actor=actor, reason=reason)
    why = services.four_eyes.needs_approval([view], [checked.payload])
    if why is not None:
        return await _propose(services, action, why)
    result = await store(services, services.queue.edit_redrive(view.message_id, checked.payload, actor=actor,
                                                               reason=reason))  # fmt: skip
    raise_for(result, "the edit")
    return Done(ids=(view.message_id,), new_ids=result.new_ids)


def check_reason_code(services: ApiServices, reason_code: str) -> None:
    codes = services.four_eyes.discard_reason_codes
    if reason_code not in codes:
        raise invalid([{"field": "reason_code", "message": f"must be one of {', '.join(codes)}"}])


async def discard(services: ApiServices, actor: str, view: MessageView, reason_code: str, comment: str) -> Done | Proposed:
    """Both a listed reason code and a comment, or nothing happens."""
    check_reason_code(services, reason_code)
    if not comment.strip():
        raise invalid([{"field": "comment", "message": "say why, for the audit"}])
    action = Discard(message_id=view.message_id, actor=actor, reason=comment, reason_code=reason_code)
    why = services.four_eyes.needs_approval([view])
    if why is not None:
        return await _propose(services, action, why)
    outcome = await store(services, services.queue.discard(view.message_id, actor, comment, reason_code=reason_code))
    if outcome.code is not Code.OK:
        state = "its state" if outcome.state is None else f"state {outcome.state.value}"
        raise Problem("conflict", f"request {public(services, view.message_id)} cannot be discarded in {state}")
    return Done(ids=(view.message_id,))


async def approve(services: ApiServices, approver: str, proposal_id: int, reason: str) -> tuple[ProposalView, ReviewResult]:
    """Approve and perform, in one store command; the proposer's own approval is refused."""
    if services.sets is not None:
        refuse_part(services, await proposal(services, proposal_id), "approve")
    result = await store(services, services.queue.approve(proposal_id, approver=approver, reason=reason))
    raise_for(result, "the approval")
    return await proposal(services, proposal_id), result


async def reject(services: ApiServices, actor: str, proposal_id: int, reason: str, *, others: bool) -> ProposalView:
    """Reject, or withdraw one's own; `others`: whether this person may reject someone else's."""
    found = await proposal(services, proposal_id)
    refuse_part(services, found, "reject")
    if not others and found.proposer != actor:
        raise Problem("forbidden", "you may withdraw only your own proposals; approvers reject")
    result = await store(services, services.queue.reject(proposal_id, actor=actor, reason=reason))
    raise_for(result, "the rejection")
    return await proposal(services, proposal_id)


def refuse_part(services: ApiServices, view: ProposalView, what: str) -> None:
    """A job group's part is decided with its group, never alone: one approval of the whole
    (api/review_groups.py)."""
    action = proposal_action(view)
    if isinstance(action, RedriveJob) and action.group:
        raise Problem("conflict", f"proposal {view.proposal_id} of set {services.settings.set_id} is a part of job group"
                                  f" {action.group}: {what} the whole group (POST /v1/review/job-groups/{action.group}"
                                  f"/{what}, or its page)")  # fmt: skip


def filter_of(
    *, kind: str | None = None, error_class: str | None = None, ref_key: str | None = None,
    dead_from_ms: int | None = None, dead_to_ms: int | None = None, currency: str | None = None,
    amount_min_minor: int | None = None, amount_max_minor: int | None = None,
    attempts_min: int | None = None, attempts_max: int | None = None,
) -> DeadLetterFilter:  # fmt: skip
    """A dead-letter filter, or the problem naming the field that makes it impossible: an empty
    range would match nothing and a person would read "no dead letters" as good news."""
    errors = []
    if (amount_min_minor is not None or amount_max_minor is not None) and currency is None:
        errors.append({"field": "currency", "message": "an amount range needs a currency"})
    for low, high, name in ((amount_min_minor, amount_max_minor, "amount_max"), (attempts_min, attempts_max, "attempts_max"),
                            (dead_from_ms, dead_to_ms, "dead_to")):  # fmt: skip
        if low is not None and high is not None and low > high:
            errors.append({"field": name, "message": "below the range's minimum"})
    if errors:
        raise invalid(errors)
    return DeadLetterFilter(
        kind=kind, error_class=error_class, ref_key=ref_key, dead_from_ms=dead_from_ms, dead_to_ms=dead_to_ms,
        currency=currency, amount_min_minor=amount_min_minor, amount_max_minor=amount_max_minor,
        attempts_min=attempts_min, attempts_max=attempts_max,
    )  # fmt: skip
