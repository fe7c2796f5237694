"""A redrive at once of dead letters of several sets (`POST /v1/review/redrive`; docs/review.md,
"Several sets"): the selection split by the set each id names (`2-17`: set 2), or what a filter
matches in every set merged oldest first, and each set's part redriven in its set.

A redrive is one command in one set's log (the store redrives each letter that is still dead and
writes the set's `redriven` audit entry), so a redrive over several sets is one such command per
set, sent concurrently, with the same rules as one set:
- four eyes are decided on the whole selection (a bulk of 9 over three sets is a bulk of 9). When
  they are needed, nothing is redriven: every set's part is proposed as a part of one **job group**
  (api/review_groups.py), and one approval of the group redrives every part. The one-set proposal
  (a `Redrive`) cannot name a group without changing every recorded redrive's bytes, and a part
  approved alone would not be four eyes on the whole, so the group is the one mechanism for both;
- a set that does not answer is never a silent partial success: the answer is the 503
  `partially-applied` naming the sets that redrove their part (with the ids they redrove) and those
  that did not, as a job group's creation answers;
- a repeat is safe: a set redrives only what is still dead, so the letters a first attempt redrove
  are refused (`illegal_state`: no longer dead) and only the sets that missed it redrive theirs; a proposed group is
  found again by the same `Idempotency-Key` (or its `group`), its parts answered, the missing ones
  proposed.

Must never: redrive anything when the whole needs four eyes, or answer done when a set did not do
its part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from api import review_actions as actions
from api import review_groups as groups
from api.across_sets import RETRY_AFTER_S, set_down
from api.problems import Problem
from api.services import ApiServices
from queues import DeadLetterFilter, MessageView

Parts = list[tuple[ApiServices, list[MessageView]]]


async def parts_of_ids(services: ApiServices, ids: Sequence[str]) -> Parts:
    """Each set's part of a selection (every id must exist: else the whole is a 404, nothing done).
    A set that does not answer the read is a 503 naming it, nothing done."""
    return await groups.targets(await groups.holding(services, ids, None), ids, None)


async def parts_of_filter(services: ApiServices, dead_filter: DeadLetterFilter, limit: int) -> Parts:
    """What the filter matches now in every set, oldest first over the sets, up to `limit`: the
    same letters a one-set redrive of the merged list would take."""

    async def of_set(s: ApiServices) -> list[MessageView]:
        try:
            return await actions.matching(s, dead_filter, limit)
        except Problem as problem:
            if problem.type.name == "not-found":
                return []
            raise

    found, unanswered = await groups.each_set(await services.every_set(), of_set)
    if unanswered:
        raise set_down(unanswered, "the filter's matches")
    rows = sorted(((s, view) for s, views in found for view in views),
                  key=lambda sv: (sv[1].dead_ms if sv[1].dead_ms is not None else 1 << 62, sv[0].settings.set_id,
                                  sv[1].message_id))[:limit]  # fmt: skip
    if not rows:
        raise Problem("not-found", "no dead letter matches the filter")
    return [(s, [view for owner, view in rows if owner is s]) for s, _ in found if any(owner is s for owner, _ in rows)]


@dataclass(frozen=True, slots=True)
class Redriven:
    """Every set redrove its part: each set's `Done` (redriven and refused ids), in set order."""

    parts: list[tuple[ApiServices, actions.Done]]


@dataclass(frozen=True, slots=True)
class GroupProposed:
    """Four eyes on the whole: every set's part proposed in job group `group` (nothing redriven)."""

    created: groups.Created


async def redrive(services: ApiServices, actor: str, reason: str, parts: Parts, group: str) -> Redriven | GroupProposed:
    """Each set's part redriven in its set, concurrently; or, when the whole needs four eyes, each
    proposed as a part of job group `group`. Raises the 503 `partially-applied` when a set did not
    answer (the others did their part)."""
    every = [view for _, views in parts for view in views]
    if services.four_eyes.needs_approval(every) is not None:
        return GroupProposed(await groups.start(services, actor, reason, parts, None, group))
    ids_of = {id(s): tuple(view.message_id for view in views) for s, views in parts}
    done, unanswered = await groups.each_set(
        [s for s, _ in parts], lambda s: s.queue.redrive(actor, reason, ids=ids_of[id(s)]))  # fmt: skip
    answered = [(s, actions.Done(ids=result.ids, refused=result.refused)) for s, result in done]
    if unanswered:
        applied = [s.settings.set_id for s, _ in answered]
        redriven = [actions.public(s, m) for s, part in answered for m in part.ids]
        raise Problem("partially-applied", (
            f"set {', '.join(map(str, unanswered))} did not answer: its dead letters were not redriven; set"
            f" {', '.join(map(str, applied)) or 'none'} redrove {len(redriven)} of theirs (`redriven`). Repeating"
            " the same request is safe: a set redrives only what is still dead, so what was redriven is refused"
            " (illegal_state: no longer dead) and the sets that missed it redrive theirs."
        ), headers={"Retry-After": RETRY_AFTER_S}, extra={
            "applied_sets": applied, "unapplied_sets": list(unanswered), "redriven": redriven,
            "refused": [{"id": actions.public(s, m), "reason": code.name.lower()}
                        for s, part in answered for m, code in part.refused]})  # fmt: skip
    return Redriven(answered)
