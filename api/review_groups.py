"""A redrive job over dead letters of several sets: one part per set, one group (docs/review.md,
"Several sets").

A job lives in one set (its `StepJob`s redrive its items in that set's log), so a job over several
sets' dead letters is a job per set, each a `RedriveJob` carrying the same group id, stored and
audited in its set. What makes the parts one action:
- four eyes decide on the whole: the bulk size and the amounts of every set's targets (a bulk of
  30 over three sets is a bulk of 30); if a second person is needed every part is proposed, else
  every part starts;
- creation is concurrent over the sets and never a silent partial success: a set that does not
  answer leaves the group without its part, and the answer is the 503 `partially-applied` naming
  the sets that hold their part and those that do not, with the group id. A set holds at most one
  job and one proposal of a group (the store's JOB_GROUPS), so repeating the request with the same
  group (`group` in the body, or the same `Idempotency-Key`) answers the parts that exist and
  creates only the missing ones;
- one approval approves every part, each recorded in its set by the approver (the store refuses
  the proposer); a set that missed it is approved by repeating the approval (a part approved
  already counts as approved, by whom the store says);
- one view: the summed counters, state and money of every part, and each set's part; pause,
  resume and cancel act on every part.

Must never: start a part of a group whose whole needs four eyes without its approval, answer done
when a set did not do its part, or create a second part in a set that holds one.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import msgspec

from api import money_view
from api import review_actions as actions
from api.across_sets import RETRY_AFTER_S, set_down
from api.problems import Problem, invalid
from api.schemas import utc
from api.services import ApiServices
from ledger.request_ids import RequestId
from queues import (
    JOB_IDS_MAX,
    JOB_RATE_MAX,
    ClientError,
    Code,
    DeadLetterFilter,
    JobAction,
    JobState,
    JobView,
    MessageView,
    ProposalState,
    ProposalView,
    QueueError,
    RedriveJob,
    ReviewResult,
    proposal_action,
)

GROUP_PATTERN: Final = r"^[0-9a-f]{32}$"
T = TypeVar("T")


def group_id(actor: str, idempotency_key: str | None, given: str | None) -> str:
    """The group of a creation: the one given (a repeat), else one derived from the caller and
    the Idempotency-Key (the same key repeats the same group), else a new one."""
    if given is not None:
        return given
    if idempotency_key:
        return hashlib.blake2b(f"{actor}\x00{idempotency_key}".encode(), digest_size=16).hexdigest()
    return secrets.token_hex(16)


def _down(error: BaseException) -> bool:
    """A set that did not answer (as opposed to one that answered no)."""
    return isinstance(error, ClientError) or (isinstance(error, Problem) and error.type.name == "not-ready")


async def each_set(
    each: Sequence[ApiServices], call: Callable[[ApiServices], Awaitable[T]]
) -> tuple[list[tuple[ApiServices, T]], list[int]]:
    """`call` in every set at once: the answers in set order, and the sets that did not answer.
    Any other failure is raised (the first, in set order)."""
    found = await asyncio.gather(*(call(s) for s in each), return_exceptions=True)
    answered: list[tuple[ApiServices, T]] = []
    unanswered: list[int] = []
    for set_services, answer in zip(each, found, strict=True):
        if isinstance(answer, QueueError):
            raise set_services.read_failure(answer)
        if isinstance(answer, BaseException):
            if not _down(answer):
                raise answer
            unanswered.append(set_services.settings.set_id)
        else:
            answered.append((set_services, answer))
    return answered, unanswered


# ---- which sets, which targets ------------------------------------------------------------------
async def holding(services: ApiServices, ids: Sequence[str] | None, dead_filter: DeadLetterFilter | None) -> list[ApiServices]:
    """The sets a selection names, or whose dead letters the filter matches (at least one: the home
    set when the filter matches nothing). Several sets only. A set that does not answer the count
    is a 503 naming it: nothing is created without knowing the whole."""
    if ids is not None:
        parsed = [RequestId.parse(text) for text in ids]
        if any(p is None for p in parsed):
            raise Problem("not-found", "some of the requests do not exist")
        found = [await services.in_set(set_id) for set_id in sorted({p.set_id for p in parsed if p is not None})]
        if any(s is None for s in found):
            raise Problem("not-found", "some of the requests do not exist")
        return [s for s in found if s is not None]
    assert dead_filter is not None
    counts, unanswered = await each_set(await services.every_set(),
                                        lambda s: s.queue.dead_letter_summary(dead_filter))  # fmt: skip
    if unanswered:
        raise set_down(unanswered, "the filter's matches")
    total = sum(read.value.count for _, read in counts)
    if total > JOB_IDS_MAX:
        raise invalid([{"field": "filter", "message": f"matches {total} dead letters over the sets; a job holds at most "
                                                      f"{JOB_IDS_MAX}: narrow it"}])  # fmt: skip
    held = [s for s, read in counts if read.value.count]
    return held or [services]


async def targets(
    each: Sequence[ApiServices], ids: Sequence[str] | None, dead_filter: DeadLetterFilter | None
) -> list[tuple[ApiServices, list[MessageView]]]:
    """Each set's part of a selection or of what a filter matches now (sets with none left out)."""

    async def of_set(s: ApiServices) -> list[MessageView]:
        mine = None if ids is None else [i for i in ids if i.startswith(f"{s.settings.set_id}-")]
        try:
            return await actions.targets(s, mine, dead_filter)
        except Problem as problem:
            if ids is None and problem.type.name == "not-found":
                return []  # matched nothing since it was counted
            raise

    found, unanswered = await each_set(each, of_set)
    if unanswered:
        raise set_down(unanswered, "the targets")
    parts = [(s, views) for s, views in found if views]
    if not parts:
        raise Problem("not-found", "no dead letter matches the filter")
    if sum(len(views) for _, views in parts) > JOB_IDS_MAX:
        raise invalid([{"field": "filter", "message": f"a job holds at most {JOB_IDS_MAX} dead letters: narrow it"}])
    return parts


def dry_run_document(parts: Sequence[tuple[ApiServices, Sequence[MessageView]]], needs_approval: str | None) -> dict[str, Any]:
    """The dry run of a job over several sets: the whole (summed) and each set's part."""
    every = [view for _, views in parts for view in views]
    by_currency, without = actions.totals(every)
    oldest_set, oldest = min(((s, v) for s, views in parts for v in views),
                             key=lambda sv: (sv[1].dead_ms if sv[1].dead_ms is not None else 1 << 62,
                                             sv[0].settings.set_id, sv[1].message_id))  # fmt: skip
    return {
        "count": len(every), "without_amount": without, "needs_approval": needs_approval,
        "totals": money_view.totals_document(by_currency),
        "oldest": {"id": actions.public(oldest_set, oldest.message_id),
                   "dead_at": None if oldest.dead_ms is None else utc(oldest.dead_ms)},
        "sets": [{"set": s.settings.set_id, "count": len(views),
                  "totals": money_view.totals_document(actions.totals(views)[0])} for s, views in parts],
    }  # fmt: skip


# ---- the parts of a group -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Part:
    services: ApiServices
    job: JobView | None
    proposal: ProposalView | None

    @property
    def set_id(self) -> int:
        return self.services.settings.set_id


@dataclass(frozen=True, slots=True)
class Group:
    group: str
    parts: list[Part]
    """In set order; only the sets that hold a part."""
    unanswered: list[int] = field(default_factory=list)


async def _part(services: ApiServices, group: str) -> Part | None:
    job_id, proposal_id = (await services.queue.job_group(group)).value
    job = None if job_id is None else (await services.queue.jobs(ids=[job_id])).value[0]
    proposal = None if proposal_id is None else (await services.queue.proposals(ids=[proposal_id])).value[0]
    return None if job is None and proposal is None else Part(services, job, proposal)


async def read_group(services: ApiServices, group: str, *, partial: bool = False) -> Group:
    """Every set's part of the group (404 when no set holds one). A set that does not answer is a
    503 naming it unless `partial` (then `unanswered` names it)."""
    found, unanswered = await each_set(await services.every_set(), lambda s: _part(s, group))
    if unanswered and not partial:
        raise set_down(unanswered, "the group")
    parts = [part for _, part in found if part is not None]
    if not parts and not unanswered:
        raise Problem("not-found", f"no job group {group}")
    return Group(group, parts, unanswered)


def state_of(parts: Sequence[Part]) -> str:
    """The group's state: proposed while a part waits for approval (an approval some set missed is
    not complete, whatever the other parts do); running while any part runs; paused while any is
    paused; done when every part is; else cancelled (or ended unapproved)."""
    jobs = [p.job.state for p in parts if p.job is not None]
    proposals = [p.proposal.state for p in parts if p.proposal is not None and p.job is None]
    if ProposalState.PENDING in proposals:
        return "proposed"
    if JobState.RUNNING in jobs:
        return "running"
    if JobState.PAUSED in jobs:
        return "paused"
    if jobs and len(jobs) == len(parts) and all(state is JobState.DONE for state in jobs):
        return "done"
    if proposals and not jobs:
        return next(s.value for s in proposals)  # rejected or expired, nothing started
    return "cancelled" if JobState.CANCELLED in jobs else "ended"


@dataclass(frozen=True, slots=True)
class Whole:
    """A group as one job: its counters summed over the parts, and its proposal's money summed
    per currency over the sets (what approving every part would pay, from the targets as they are now)."""

    state: str
    counters: dict[str, int]
    """total, pending, redriven, refused, not_redriven."""
    proposals: list[ProposalView]
    proposed: int
    """The proposals' targets, counted over the sets."""
    pays: money_view.Totals
    without_amount: int
    paid: dict[int, money_view.WhatIsPaid]
    """Each proposed set's own (its set id -> what approving its part pays)."""

    @property
    def pending_approval(self) -> bool:
        return any(p.state is ProposalState.PENDING for p in self.proposals)


async def whole(group: Group) -> Whole:
    counters = dict.fromkeys(("total", "pending", "redriven", "refused", "not_redriven"), 0)
    paid: dict[str, tuple[int, int]] = {}
    without = proposed = 0
    each: dict[int, money_view.WhatIsPaid] = {}
    for part in group.parts:
        if part.job is not None:
            for name in counters:
                counters[name] += getattr(part.job, name)
        if part.proposal is not None:
            targets = await actions.proposal_targets(part.services, [part.proposal])
            pays = each[part.set_id] = actions.what_is_paid(part.proposal, targets)
            for currency, count, amount in pays.totals:
                before = paid.get(currency, (0, 0))
                paid[currency] = (before[0] + count, before[1] + amount)
            without += pays.without_amount
            proposed += len(part.proposal.targets)
    return Whole(
        state=state_of(group.parts), counters=counters, proposals=[p.proposal for p in group.parts if p.proposal],
        proposed=proposed, pays=tuple((c, n, a) for c, (n, a) in sorted(paid.items())), without_amount=without,
        paid=each,
    )  # fmt: skip


# ---- creating a group ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Created:
    group: str
    proposed: str | None
    """Why four eyes are needed (every part is a proposal), or None (every part started)."""
    refused: list[tuple[ApiServices, actions.Refused]]


async def start(
    services: ApiServices, actor: str, reason: str, parts: Sequence[tuple[ApiServices, Sequence[MessageView]]],
    rate_per_s: int | None, group: str,
) -> Created:  # fmt: skip
    """Each set's part started, or proposed when the whole needs four eyes, concurrently. Raises
    the 503 `partially-applied` when a set did not answer (the others hold their part), the 409
    when a set refused its part for another reason than its targets no longer being dead."""
    rate = rate_per_s or services.settings.job_rate_per_s
    if not 1 <= rate <= JOB_RATE_MAX:
        raise invalid([{"field": "rate_per_s", "message": f"must be in 1..{JOB_RATE_MAX}"}])
    why = services.four_eyes.needs_approval([view for _, views in parts for view in views])
    existing, _ = await each_set([s for s, _ in parts], lambda s: s.queue.job_group(group))
    if any(read.value[1] is not None for _, read in existing):
        why = why or "the group was proposed when it was first asked for"  # a repeat: the parts stay proposals

    async def create(s: ApiServices, views: Sequence[MessageView]) -> ReviewResult:
        action = RedriveJob(actor=actor, reason=reason, ids=tuple(v.message_id for v in views), rate_per_s=rate,
                            group=group)  # fmt: skip
        if why is not None:
            return await s.queue.propose(action, ttl_ms=services.four_eyes.proposal_ttl_ms)
        return await s.queue.start_job(action)

    views_of = {id(s): views for s, views in parts}
    done, unanswered = await each_set([s for s, _ in parts], lambda s: create(s, views_of[id(s)]))
    applied = [s.settings.set_id for s, result in done if result.code is Code.OK]
    refused: list[tuple[ApiServices, actions.Refused]] = [(s, r.refused) for s, r in done if r.refused]
    failed = [(s, r) for s, r in done if r.code is not Code.OK and r.code not in (Code.NOT_FOUND, Code.ILLEGAL_STATE)]
    extra = {"group": group, "applied_sets": applied,
             "unapplied_sets": sorted(unanswered + [s.settings.set_id for s, _ in failed])}  # fmt: skip
    if unanswered:
        raise Problem("partially-applied", (
            f"set {', '.join(map(str, unanswered))} did not answer: the job group {group} has its part in "
            f"{_sets(applied)} only. Repeat the same request with \"group\": \"{group}\" (or the same "
            "Idempotency-Key): the parts that exist are answered, the missing ones created. Or cancel the group."
        ), headers={"Retry-After": RETRY_AFTER_S}, extra=extra)  # fmt: skip
    if failed:
        said = "; ".join(f"set {s.settings.set_id}: {r.detail or r.code.name.lower()}" for s, r in failed)
        raise Problem("conflict", f"the job group {group} has its part in {_sets(applied)} only ({said}). Repeat the"
                                  f" request with \"group\": \"{group}\" once it can be done, or cancel the group.",
                      extra=extra)  # fmt: skip
    if not applied:
        raise Problem("conflict", "none of the dead letters is dead any more: nothing was started")
    return Created(group, why, refused)


def _sets(set_ids: Sequence[int]) -> str:
    return "no set" if not set_ids else "set " + ", ".join(map(str, set_ids))


# ---- acting on a group --------------------------------------------------------------------------
def _partial(group: str, what: str, applied: Sequence[int], unanswered: Sequence[int]) -> Problem:
    return Problem("partially-applied", (
        f"set {', '.join(map(str, unanswered))} did not answer: the {what} of job group {group} is done in "
        f"{_sets(applied)} only. Repeating the same call is safe: a part done already counts as done."
    ), headers={"Retry-After": RETRY_AFTER_S},
        extra={"group": group, "applied_sets": list(applied), "unapplied_sets": list(unanswered)})  # fmt: skip


async def control(services: ApiServices, actor: str, group: str, action: JobAction, reason: str) -> Group:
    """Pause, resume or cancel every started part. A part already in the state asked for (or, for
    a cancel, ended) counts as done; a part that cannot (resume of a done job) is left as it is.
    A set that does not answer: the 503 `partially-applied` naming it."""
    read = await read_group(services, group, partial=True)
    started = [p for p in read.parts if p.job is not None]
    if not started and not read.unanswered:
        raise Problem("conflict", f"job group {group} has no started part: its proposal is decided by the approval"
                                  " or withdrawn (reject)")  # fmt: skip

    async def one(part: Part) -> ReviewResult:
        assert part.job is not None
        return await part.services.queue.control_job(part.job.job_id, action, actor=actor, reason=reason)

    by_set = {p.set_id: p for p in started}
    done, unanswered = await each_set([p.services for p in started], lambda s: one(by_set[s.settings.set_id]))
    unanswered = sorted(unanswered + read.unanswered)
    if unanswered:
        raise _partial(group, action.value, [s.settings.set_id for s, _ in done], unanswered)
    return await read_group(services, group)


async def decide(
    services: ApiServices, actor: str, group: str, reason: str, *, approve: bool, others: bool = True
) -> tuple[Group, list[tuple[int, ReviewResult]]]:
    """Approve (or reject) every set's pending part, concurrently, each in its set by `actor`.
    Refused whole before any set is asked when `actor` proposed it (approve) or, without `others`,
    when a reviewer rejects someone else's. A part decided already the same way counts as done. A
    set that does not answer: the 503 `partially-applied` naming it."""
    read = await read_group(services, group, partial=True)
    proposed = [p for p in read.parts if p.proposal is not None]
    if not proposed and not read.unanswered:
        raise Problem("conflict", f"job group {group} was started without a proposal: there is nothing to decide")
    for part in proposed:
        assert part.proposal is not None
        if approve and part.proposal.proposer == actor:
            raise Problem("own-proposal", "the proposer cannot approve their own proposal")
        if not approve and not others and part.proposal.proposer != actor:
            raise Problem("forbidden", "you may withdraw only your own proposals; approvers reject")
    wanted = ProposalState.APPROVED if approve else ProposalState.REJECTED
    open_parts = [p for p in proposed if p.proposal is not None and p.proposal.state is not wanted]

    async def one(part: Part) -> ReviewResult:
        assert part.proposal is not None
        queue, proposal_id = part.services.queue, part.proposal.proposal_id
        if approve:
            return await queue.approve(proposal_id, approver=actor, reason=reason)
        return await queue.reject(proposal_id, actor=actor, reason=reason)

    by_set = {p.set_id: p for p in open_parts}
    done, unanswered = await each_set([p.services for p in open_parts], lambda s: one(by_set[s.settings.set_id]))
    unanswered = sorted(unanswered + read.unanswered)
    what = "approval" if approve else "rejection"
    applied = sorted([s.settings.set_id for s, r in done if r.code is Code.OK]
                     + [p.set_id for p in proposed if p not in open_parts])  # fmt: skip
    if unanswered:
        raise _partial(group, what, applied, unanswered)
    results = [(s.settings.set_id, r) for s, r in done]
    refused = [(set_id, r) for set_id, r in results if r.code is not Code.OK]
    if refused:
        said = "; ".join(f"set {set_id}: {r.detail or r.code.name.lower().replace('_', ' ')}" for set_id, r in refused)
        raise Problem("conflict", f"the {what} of job group {group} is done in {_sets(applied)} only ({said})",
                      extra={"group": group, "applied_sets": applied,
                             "unapplied_sets": [set_id for set_id, _ in refused]})  # fmt: skip
    return await read_group(services, group), results


async def propose_again(services: ApiServices, actor: str, group: str, reason: str) -> Group:
    """Each part whose proposal expired unapproved (its set was down until then, while the others
    were approved) proposed again in its set, by `actor`, with the same targets and rate, in the
    expired one's place (`RedriveJob.renews`): the group waits for one approval of it, four eyes as
    before (the group's approve route; neither the first proposer nor `actor` may give it). A
    repeat answers the new proposals; a group with no expired part is answered as it is. Refused
    (409) when the group was rejected or started without a proposal.
    A set that does not answer: the 503 `partially-applied` naming it."""
    read = await read_group(services, group, partial=True)
    proposed = [p.proposal for p in read.parts if p.proposal is not None]
    if not proposed and not read.unanswered:
        raise Problem("conflict", f"job group {group} was started without a proposal: there is nothing to propose again")
    if any(view.state is ProposalState.REJECTED for view in proposed):
        raise Problem("conflict", f"job group {group} was rejected: nothing is proposed again (create a new job)")
    expired = [p for p in read.parts if p.job is None and p.proposal is not None
               and p.proposal.state is ProposalState.EXPIRED]  # fmt: skip
    if not expired and not read.unanswered:
        return read  # nothing expired (or a repeat: the new proposals are pending): nothing to do

    async def one(part: Part) -> ReviewResult:
        assert part.proposal is not None
        action = proposal_action(part.proposal)
        assert isinstance(action, RedriveJob)
        again = msgspec.structs.replace(action, actor=actor, reason=reason, renews=part.proposal.proposal_id)
        return await part.services.queue.propose(again, ttl_ms=services.four_eyes.proposal_ttl_ms)

    by_set = {p.set_id: p for p in expired}
    done, unanswered = await each_set([p.services for p in expired], lambda s: one(by_set[s.settings.set_id]))
    unanswered = sorted(unanswered + read.unanswered)
    applied = [s.settings.set_id for s, r in done if r.code is Code.OK]
    if unanswered:
        raise _partial(group, "new proposal", applied, unanswered)
    refused = [(s.settings.set_id, r) for s, r in done if r.code is not Code.OK]
    if refused:
        said = "; ".join(f"set {set_id}: {r.detail or r.code.name.lower()}" for set_id, r in refused)
        raise Problem("conflict", f"job group {group} is proposed again in {_sets(applied)} only ({said})",
                      extra={"group": group, "applied_sets": applied, "unapplied_sets": [i for i, _ in refused]})  # fmt: skip
    return await read_group(services, group)


def group_of(view: ProposalView) -> str:
    """The group a proposal belongs to ("" for none): a group's part is decided with its group (one
    approval of the whole), never alone."""
    action = proposal_action(view)
    return action.group if isinstance(action, RedriveJob) else ""
