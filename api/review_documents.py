"""The review's JSON documents of proposals, redrive jobs and job groups, shared by the review routes
(api/routers/review.py, api/routers/review_jobs.py): one shape for a proposal or a job wherever the
API shows it (alone, listed, or as a set's part of a job group)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from api import review_actions as actions
from api import review_groups as groups
from api.money_view import WhatIsPaid, paid_document, totals_document
from api.schemas import utc
from api.services import ApiServices
from queues import Discard, EditRedrive, JobView, ProposalView, RedriveJob, proposal_action

PAYMENTS_SHOWN: Final = 100
"""A proposal's targets listed one by one with what each pays (its totals are of all of them)."""


def refused_document(services: ApiServices, refused: actions.Refused) -> list[dict[str, str]]:
    return [{"id": actions.public(services, message_id), "reason": code.name.lower()} for message_id, code in refused]


def proposal_document(services: ApiServices, view: ProposalView, paid: WhatIsPaid) -> dict[str, Any]:
    """A proposal, with `pays`: what approving it pays (per currency, and target by target for the
    first PAYMENTS_SHOWN, each beside what it held before where that changes: api/money_view.py)."""
    document: dict[str, Any] = {
        "id": view.proposal_id, "action": view.action, "proposer": view.proposer, "reason": view.reason,
        "targets": [actions.public(services, t) for t in view.targets], "state": view.state.value,
        "created_at": utc(view.created_ms), "expires_at": utc(view.expires_ms), "decided_by": view.decided_by,
        "decided_at": None if view.decided_ms is None else utc(view.decided_ms), "decision_reason": view.decision_reason,
        "pays": paid_document(paid, lambda m: actions.public(services, m), PAYMENTS_SHOWN),
    }  # fmt: skip
    if services.sets is not None:
        document["set"] = services.settings.set_id  # several sets: the proposal's number is its set's
    action = proposal_action(view)
    if isinstance(action, RedriveJob) and action.group:
        document["group"] = action.group  # a job group's part: decided with its group (/v1/review/job-groups/...)
    if isinstance(action, EditRedrive):
        document["payload"] = json.loads(action.payload)
    if isinstance(action, Discard):
        document["reason_code"] = action.reason_code
    return document


async def proposal_documents(services: ApiServices, views: Sequence[ProposalView]) -> list[dict[str, Any]]:
    """Proposals as documents, their targets read once for all (what each pays is from them, as they are now)."""
    targets = await actions.proposal_targets(services, views)
    return [proposal_document(services, view, actions.what_is_paid(view, targets)) for view in views]


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


async def group_document(group: groups.Group) -> dict[str, Any]:
    """The group as one job: its state, the counters summed over the parts, what its proposal pays
    summed per currency, and each set's part (its job and proposal as one set's are shown)."""
    summed = await groups.whole(group)
    parts = []
    for part in group.parts:
        entry: dict[str, Any] = {"set": part.set_id, "job": None, "proposal": None}
        if part.job is not None:
            entry["job"] = job_document(part.services, part.job)
        if part.proposal is not None:
            entry["proposal"] = proposal_document(part.services, part.proposal, summed.paid[part.set_id])
        parts.append(entry)
    first = group.parts[0] if group.parts else None
    source = None if first is None else (first.job or first.proposal)
    proposals = summed.proposals
    return {
        "group": group.group, "state": summed.state, **summed.counters,
        "actor": None if source is None else (source.actor if isinstance(source, JobView) else source.proposer),
        "reason": None if source is None else source.reason,
        "proposal": None if not proposals else {
            "targets": summed.proposed, "proposer": proposals[0].proposer,
            "states": sorted({p.state.value for p in proposals}),
            "decided_by": sorted({p.decided_by for p in proposals if p.decided_by is not None}),
            "expires_at": utc(min(p.expires_ms for p in proposals)),
            "pays": {"totals": totals_document(summed.pays), "without_amount": summed.without_amount},
        },
        "sets": parts, "partial": bool(group.unanswered), "unanswered_sets": group.unanswered,
    }  # fmt: skip
