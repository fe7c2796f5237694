"""The review's reads that span every set (docs/sets.md, docs/review.md "Several sets"): the
dead-letter list merged in (dead_ms, set, id) order with a cursor that holds a position per set,
and the dead-letter summary summed over the sets. One set: exactly the one set's read, its cursor
the store's own.

Why a position per set: each set pages its own dead letters in (dead_ms, id) order; a merged page is
the first `limit` of every set's next `limit` after its position, so the next page starts, in each
set, after the last row this page took from it. Rows that arrive later are dead later and come on
a later page; no row is skipped or shown twice while paging.

Must never: show a merged list or total as complete when a set did not answer (the caller says
which sets are missing: `unanswered`), or take a cursor it could not have given.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from api.problems import Problem, invalid
from api.services import ApiServices
from api.summaries import Summary
from ledger.request_ids import RequestId
from queues import (
    AuditEntry,
    AuditFilter,
    ClientError,
    DeadLetterFilter,
    DeadLetterSummary,
    JobView,
    MessageView,
    ProposalView,
    QueueError,
    Read,
)

SETS_IN_CURSOR_MAX: Final = 64
_POSITION: Final = r"[1-9][0-9]{0,4}:[0-9]{1,18}\.[0-9]{1,18}"
CURSOR_PATTERN: Final = rf"^([0-9]{{1,18}}\.[0-9]{{1,18}}|{_POSITION}(,{_POSITION}){{0,{SETS_IN_CURSOR_MAX - 1}}})$"
"""A dead-letter cursor: the store's own (one set), or a position per set (several)."""
_MERGED: Final = re.compile(rf"^{_POSITION}(,{_POSITION}){{0,{SETS_IN_CURSOR_MAX - 1}}}$")
RETRY_AFTER_S: Final = "1"


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[tuple[ApiServices, MessageView]]
    """Each dead letter with the services of its set (its public id: `actions.public(services, id)`)."""
    next_cursor: str | None
    unanswered: list[int] = field(default_factory=list)
    """Sets that did not answer: their rows are not in `rows` (asked with partial=True only)."""


@dataclass(frozen=True, slots=True)
class Totals:
    summary: Summary
    oldest: str | None
    """The oldest match's public id."""
    unanswered: list[int] = field(default_factory=list)


def set_down(unanswered: Sequence[int], what: str) -> Problem:
    """The 503 when a set did not answer and a partial answer was not asked for."""
    names = ", ".join(str(s) for s in unanswered)
    return Problem("not-ready", f"set {names} did not answer: {what} would miss its part, so none is shown."
                                " Retry shortly, or ask with partial=true for the other sets' (marked partial).",
                   headers={"Retry-After": RETRY_AFTER_S}, extra={"unanswered_sets": list(unanswered)})  # fmt: skip


def bad_cursor() -> Problem:
    return invalid([{"field": "cursor", "message": "not a cursor this list gave, or a filter the store refused"}])


def parse_cursor(text: str, set_ids: Sequence[int]) -> dict[int, str]:
    """A merged cursor's position per set (the store's cursor of the last row taken from it);
    anything this list could not have given now is a 422 problem."""
    if _MERGED.match(text) is None:
        raise bad_cursor()
    positions: dict[int, str] = {}
    for part in text.split(","):
        set_text, _, position = part.partition(":")
        set_id = int(set_text)
        if set_id in positions or set_id not in set_ids:
            raise bad_cursor()
        positions[set_id] = position
    return positions


def encode_cursor(positions: dict[int, str]) -> str:
    return ",".join(f"{set_id}:{positions[set_id]}" for set_id in sorted(positions))


async def sets_of(services: ApiServices, only: int | None) -> list[ApiServices]:
    """Every set's services, or the one set `only` names (404 for a set that does not exist)."""
    if only is None:
        return await services.every_set()
    found = await services.in_set(only)
    if found is None:
        raise Problem("not-found", f"no set {only}")
    return [found]


async def dead_letter_page(
    services: ApiServices, dead_filter: DeadLetterFilter, *, cursor: str | None, limit: int, partial: bool = False,
    only: int | None = None,
) -> Page:
    """A page of dead letters, oldest first, of every set. One set: its store's page. Raises the
    422 for a bad cursor, the 503 for a set that does not answer (unless `partial`)."""
    if services.sets is None:
        try:
            page = (await services.queue.dead_letters(dead_filter, cursor=cursor, limit=limit)).value
        except QueueError:
            raise bad_cursor() from None
        except ClientError as error:
            raise services.read_failure(error) from None
        return Page([(services, view) for view in page.items], page.next_cursor)
    each = await sets_of(services, only)
    positions = {} if cursor is None else parse_cursor(cursor, [s.settings.set_id for s in each])
    reads = await asyncio.gather(*(s.queue.dead_letters(dead_filter, cursor=positions.get(s.settings.set_id), limit=limit)
                                   for s in each), return_exceptions=True)  # fmt: skip
    unanswered: list[int] = []
    candidates: list[tuple[int, int, int, ApiServices, MessageView]] = []
    more: set[int] = set()
    for set_services, read in zip(each, reads, strict=True):
        set_id = set_services.settings.set_id
        if isinstance(read, QueueError):
            raise bad_cursor()
        if isinstance(read, ClientError):
            unanswered.append(set_id)
            continue
        if isinstance(read, BaseException):
            raise read
        page = read.value
        if page.next_cursor is not None:
            more.add(set_id)
        candidates.extend((view.dead_ms or 0, set_id, view.message_id, set_services, view) for view in page.items)
    if unanswered and not partial:
        raise set_down(unanswered, "the list")
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    taken, left = candidates[:limit], candidates[limit:]
    for dead_ms, set_id, message_id, _, _ in taken:
        positions[set_id] = f"{dead_ms}.{message_id}"
    more.update(set_id for _, set_id, _, _, _ in left)
    return Page([(s, view) for _, _, _, s, view in taken], encode_cursor(positions) if more else None, unanswered)


async def dead_letter_totals(
    services: ApiServices, dead_filter: DeadLetterFilter, *, partial: bool = False, only: int | None = None
) -> Totals:
    """The filter's count, totals per currency and oldest, summed over the sets (each set's read
    shared as api/summaries.py shares it; `read_at_s` the earliest of them). One set: its summary."""
    each = [services] if services.sets is None else await sets_of(services, only)
    reads = await asyncio.gather(*(s.summaries.get(dead_filter) for s in each), return_exceptions=True)
    unanswered: list[int] = []
    found: list[tuple[ApiServices, Summary]] = []
    for set_services, read in zip(each, reads, strict=True):
        if isinstance(read, (ClientError, QueueError)):
            if services.sets is None:
                raise services.read_failure(read)
            unanswered.append(set_services.settings.set_id)
        elif isinstance(read, BaseException):
            raise read
        else:
            found.append((set_services, read))
    if unanswered and not partial:
        raise set_down(unanswered, "the totals")
    if services.sets is None:
        ((home, summary),) = found
        oldest = None if summary.value.oldest_id is None else str(RequestId(home.settings.set_id, summary.value.oldest_id))
        return Totals(summary, oldest)
    by_currency: dict[str, tuple[int, int]] = {}
    for _, summary in found:
        for currency, count, amount in summary.value.by_currency:
            before = by_currency.get(currency, (0, 0))
            by_currency[currency] = (before[0] + count, before[1] + amount)
    dated = [(s.value.oldest_dead_ms, set_services.settings.set_id, s.value.oldest_id)
             for set_services, s in found if s.value.oldest_dead_ms is not None and s.value.oldest_id is not None]  # fmt: skip
    first = min(dated, default=None)
    value = DeadLetterSummary(
        count=sum(s.value.count for _, s in found),
        by_currency=tuple((c, n, amount) for c, (n, amount) in sorted(by_currency.items())),
        without_amount=sum(s.value.without_amount for _, s in found),
        oldest_dead_ms=None if first is None else first[0], oldest_id=None if first is None else first[2],
    )  # fmt: skip
    read_at = min((s.read_at_s for _, s in found), default=0.0)
    return Totals(Summary(value, read_at), None if first is None else str(RequestId(first[1], first[2])), unanswered)


T = TypeVar("T")


async def newest_first(
    services: ApiServices, read: Callable[[ApiServices], Awaitable[Read[tuple[T, ...]]]],
    created_and_number: Callable[[T], tuple[int, int]], *, limit: int, one_set: bool, partial: bool = False,
) -> tuple[list[tuple[ApiServices, T]], list[int]]:  # fmt: skip
    """Proposals or jobs, newest first, each with its set's services: these services' set's
    (`one_set`, or one set only: `before` pages on there), or every set's newest `limit` merged by
    time (created, then set and number, newest first) and cut to `limit`. Also the sets that did not
    answer (a 503 naming them unless `partial`)."""
    each = [services] if one_set or services.sets is None else await services.every_set()
    reads = await asyncio.gather(*(read(s) for s in each), return_exceptions=True)
    merged: list[tuple[ApiServices, T]] = []
    unanswered: list[int] = []
    for set_services, answer in zip(each, reads, strict=True):
        if isinstance(answer, (ClientError, QueueError)):
            if len(each) == 1 or isinstance(answer, QueueError):
                raise services.read_failure(answer)
            unanswered.append(set_services.settings.set_id)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            merged.extend((set_services, view) for view in answer.value)
    if unanswered and not partial:
        raise set_down(unanswered, "the list")
    if len(each) > 1:
        def order(pair: tuple[ApiServices, T]) -> tuple[int, int, int]:
            created, number = created_and_number(pair[1])
            return created, pair[0].settings.set_id, number

        merged.sort(key=order, reverse=True)
    return merged[:limit], unanswered


async def proposals(
    services: ApiServices, *, pending_only: bool, before: int | None, limit: int, one_set: bool, partial: bool = False
) -> tuple[list[tuple[ApiServices, ProposalView]], list[int]]:
    """Proposals, newest first (`newest_first`)."""
    return await newest_first(
        services, lambda s: s.queue.proposals(pending_only=pending_only, before_id=before, limit=limit),
        lambda view: (view.created_ms, view.proposal_id), limit=limit, one_set=one_set, partial=partial,
    )  # fmt: skip


async def jobs(
    services: ApiServices, *, active_only: bool, before: int | None, limit: int, one_set: bool, partial: bool = False
) -> tuple[list[tuple[ApiServices, JobView]], list[int]]:
    """Redrive jobs, newest first (`newest_first`)."""
    return await newest_first(
        services, lambda s: s.queue.jobs(active_only=active_only, before_id=before, limit=limit),
        lambda job: (job.created_ms, job.job_id), limit=limit, one_set=one_set, partial=partial,
    )  # fmt: skip


_AUDIT_POSITION: Final = r"(0|[1-9][0-9]{0,4}):[0-9]{1,19}"
AUDIT_CURSOR_PATTERN: Final = rf"^{_AUDIT_POSITION}(,{_AUDIT_POSITION}){{0,{SETS_IN_CURSOR_MAX - 1}}}$"
"""Several sets: the audit list's `next_cursor`, the oldest seq shown of each set (0: the control set)."""


@dataclass(frozen=True, slots=True)
class AuditPage:
    rows: list[tuple[ApiServices, AuditEntry]]
    """Newest first by time, then set and seq; each with its set's services."""
    count: int
    heads: dict[int, bytes]
    next_cursor: str | None


def audit_scope(services: ApiServices, target: str | None) -> int | None:
    """The one set an audit filter can match (a request id's target names its set), or None: every set."""
    parsed = None if target is None or services.sets is None else RequestId.parse(target)
    return None if parsed is None else parsed.set_id


async def audit_page(
    services: ApiServices, audit_filter: Callable[[int], AuditFilter], *, cursor: str | None, limit: int,
    only: int | None = None,
) -> AuditPage:  # fmt: skip
    """Several sets: every set's and the control set's (set 0: the set table, the intended settings,
    tokens and users), or `only` that set's, newest entries the filter selects after the cursor,
    merged by time. A set that does not answer is a 503 naming it: an auditor reads the whole
    chain or is told it is not whole. `audit_filter(set_id)`: the store's filter for a set."""
    if only is None:
        control = services.control_services()
        each = [*([] if control is None else [control]), *await services.every_set()]
    else:
        one = await services.in_set(only)
        each = [] if one is None else [one]
    if not each:
        raise invalid([{"field": "target", "message": f"no set {only}"}])
    positions: dict[int, int] = {}
    if cursor is not None:
        known = {s.settings.set_id for s in each}
        for part in cursor.split(","):
            set_text, _, seq_text = part.partition(":")
            if int(set_text) in positions or int(set_text) not in known:
                raise invalid([{"field": "cursor", "message": "not a cursor this list gave"}])
            positions[int(set_text)] = int(seq_text)
    reads = await asyncio.gather(*(s.queue.audit_log(before=positions.get(s.settings.set_id), limit=limit,
                                                     audit_filter=audit_filter(s.settings.set_id)) for s in each),
                                 return_exceptions=True)  # fmt: skip
    unanswered = [s.settings.set_id for s, read in zip(each, reads, strict=True) if isinstance(read, ClientError)]
    if unanswered:
        raise set_down(unanswered, "the audit list")
    candidates: list[tuple[int, int, int, ApiServices, AuditEntry]] = []
    count = 0
    heads: dict[int, bytes] = {}
    more: set[int] = set()
    for set_services, read in zip(each, reads, strict=True):
        if isinstance(read, QueueError):
            raise services.read_failure(read)
        if isinstance(read, BaseException):
            raise read
        set_id = set_services.settings.set_id
        answer = read.value
        count += answer.count
        heads[set_id] = answer.head
        if len(answer.entries) == limit and answer.entries[-1].seq > 1:
            more.add(set_id)
        candidates.extend((e.ts_ms, set_id, e.seq, set_services, e) for e in answer.entries)
    candidates.sort(key=lambda c: (c[0], c[1], c[2]), reverse=True)
    taken, left = candidates[:limit], candidates[limit:]
    for _, set_id, seq, _, _ in taken:
        positions[set_id] = seq
    more.update(set_id for _, set_id, _, _, _ in left)
    next_cursor = ",".join(f"{s}:{positions[s]}" for s in sorted(positions)) if more else None
    return AuditPage([(s, e) for _, _, _, s, e in taken], count, heads, next_cursor)
