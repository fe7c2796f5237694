"""Redrive jobs: a bulk redrive of up to 100,000 dead letters that is tracked item by item,
rate-limited by the leader's time, pausable, cancellable halfway and resumable after any crash.

Why not one command: a Redrive of 10,000 letters would send them all downstream at once, could
not be stopped, and its one result would be lost with a connection. A job is replicated state
instead: the job's row (who, why, who approved, state, rate, counters) and one item per dead
letter (PENDING, REDRIVEN, REFUSED or NOT_REDRIVEN, with the code and the time). Each `StepJob`
redrives the next pending items in message-id order and writes each item's result in the same
apply as its redrive, so an item's result and its message's state never disagree, on any replica,
after any crash: a restart replays the entries the store had not made durable, and a step
replayed does the same again.

The rate is the machine's, from the entry's leader time, so any number of drivers may propose
steps: a token bucket whose level is kept exactly in integer "rate x milliseconds" (`rate_base`),
full at one second's worth of items (the burst). `floor(rate x (now - last_step) / 1000)` with
`last_step` moved to now at every step, as first designed, loses the fraction at each step: a job of
5 a second stepped every 150 ms would be allowed 0 items forever, and two drivers stepping in turn
would halve the rate. The bucket keeps the fraction, and an empty step changes nothing.

An item is redriven by the operator rules' own `redrive_one`: the same lifecycle check, the same
record and the same `redriven` event and audit entry per message, which carries the job (and the
proposal and approver when the job was approved). A job acts only on messages that are still dead:
one redriven by someone else since, now waiting for its retry, is refused (ILLEGAL_STATE), not
given a second fresh attempt budget; the ids were approved as dead letters.

Owns: JOBS, JOBS_ACTIVE (running or paused), JOB_ITEMS and JOB_ITEMS_BY_RESULT (the next pending
items of a step, and a page of one result, without walking the others), and JOB_GROUPS: a group's
job and proposal in this set (with several sets, one bulk action is a part per set sharing a group
id; the index makes a repeated creation answer the part already held instead of a second one).
Must never: read a clock, scan items without an index, or report an item redriven that was not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from queues.core import keys, messages
from queues.core.entry import Entry
from queues.core.operator import redrive_one
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import JobItemRow, JobRow, encode, job_decoder, job_item_decoder
from queues.model import (
    Code,
    ControlJob,
    EventValue,
    ItemResult,
    JobAction,
    JobItem,
    JobState,
    JobStepResult,
    JobView,
    Phase,
    RedriveJob,
    ReviewResult,
    StepJob,
)

JOBS_ACTIVE_MAX: Final = 100
"""Jobs running or paused at once: each is a read and a step for every driver period."""
JOBS_PAGE_MAX: Final = 1000
ITEMS_PAGE_MAX: Final = 1000
CANCELLED: Final = "cancelled"
"""The code of an item a cancel left not redriven."""
_RESULT_BYTE: Final = {result.value: bytes((n,)) for n, result in enumerate(ItemResult)}
"""An item's result in the JOB_ITEMS_BY_RESULT key, by the result's stored name."""
_ACTIVE: Final = frozenset({JobState.RUNNING.value, JobState.PAUSED.value})

Detail = dict[str, EventValue]


@dataclass(frozen=True, slots=True)
class _Job:
    view: JobView
    row: JobRow

    @property
    def rate_base(self) -> int:
        """The bucket: `rate x now - rate_base` is what the rate allows by `now`, in thousandths of an item."""
        return self.row.rate_base

    def allowance(self, now_ms: int) -> int:
        """Items the rate allows by `now_ms`: floor(rate x elapsed / 1000) since the bucket's
        reference, at most one second's worth (the burst)."""
        rate = self.view.rate_per_s
        return max(0, min(rate, (rate * now_ms - self.rate_base) // 1000))


def _next_step_ms(state: JobState, rate: int, rate_base: int) -> int | None:
    """The first time at which the allowance is one item (ceil((rate_base + 1000) / rate))."""
    return -(-(rate_base + 1000) // rate) if state is JobState.RUNNING else None


def _job(job_id: int, row: JobRow) -> _Job:
    state = JobState(row.state)
    view = JobView(
        job_id=job_id, actor=row.actor, reason=row.reason, proposal_id=row.proposal_id, approved_by=row.approved_by,
        state=state, rate_per_s=row.rate_per_s, created_ms=row.created_ms, last_step_ms=row.last_step_ms,
        finished_ms=row.finished_ms, controlled_by=row.controlled_by, total=row.total, pending=row.pending,
        redriven=row.redriven, refused=row.refused, not_redriven=row.not_redriven,
        next_step_ms=_next_step_ms(state, row.rate_per_s, row.rate_base),
    )  # fmt: skip
    return _Job(view, row)


def _load(view: KvRead, job_id: int) -> _Job | None:
    stored = view.get(Table.JOBS, keys.u64(job_id))
    return None if stored is None else _job(job_id, job_decoder.decode(stored))


def _save(tx: KvWrite, job_id: int, row: JobRow) -> None:
    key = keys.u64(job_id)
    tx.put(Table.JOBS, key, encode(row))
    if row.state in _ACTIVE:
        tx.put(Table.JOBS_ACTIVE, key, b"")
    else:
        tx.delete(Table.JOBS_ACTIVE, key)


def _item(tx: KvWrite, job_id: int, message_id: int, row: JobItemRow, before: JobItemRow | None = None) -> None:
    tx.put(Table.JOB_ITEMS, keys.pair(job_id, message_id), encode(row))
    if before is not None:
        tx.delete(Table.JOB_ITEMS_BY_RESULT, _by_result(job_id, before.result, message_id))
    tx.put(Table.JOB_ITEMS_BY_RESULT, _by_result(job_id, row.result, message_id), b"")


def _by_result(job_id: int, result: str, message_id: int = 0) -> bytes:
    return keys.u64(job_id) + _RESULT_BYTE[result] + keys.u64(message_id)


def _pending(view: KvRead, job_id: int, limit: int | None) -> list[int]:
    """The job's pending items, in message-id order."""
    prefix = keys.u64(job_id) + _RESULT_BYTE[ItemResult.PENDING.value]
    found: list[int] = []
    for key, _ in view.scan(Table.JOB_ITEMS_BY_RESULT, prefix, keys.after(prefix)):
        found.append(keys.u64_of(key, 9))
        if len(found) == limit:
            break
    return found


def _group_key(group: str, what: bytes) -> bytes:
    return group.encode() + b"\x00" + what


def group_part(view: KvRead, group: str, what: str) -> int | None:
    """The job ("job") or proposal ("proposal") of `group` in this set, if there is one."""
    stored = view.get(Table.JOB_GROUPS, _group_key(group, what[:1].encode()))
    return None if stored is None else keys.u64_of(stored)


def hold_group_part(tx: KvWrite, group: str, what: str, part_id: int) -> None:
    if group:
        tx.put(Table.JOB_GROUPS, _group_key(group, what[:1].encode()), keys.u64(part_id))


# ---- inside the apply ---------------------------------------------------------------------------
def judge(view: KvRead, ids: Sequence[int]) -> tuple[list[int], list[tuple[int, Code]]]:
    """(the ids whose message is dead now, the others with why: NOT_FOUND or ILLEGAL_STATE), in
    the order given."""
    able: list[int] = []
    refused: list[tuple[int, Code]] = []
    for message_id in ids:
        record = messages.load(view, message_id)
        if record is not None and record.phase is Phase.DEAD:
            able.append(message_id)
        else:
            refused.append((message_id, Code.NOT_FOUND if record is None else Code.ILLEGAL_STATE))
    return able, refused


def full(view: KvRead) -> bool:
    """JOBS_ACTIVE_MAX jobs are running or paused: a new one is refused (INVALID) until one ends."""
    return view.count(Table.JOBS_ACTIVE) >= JOBS_ACTIVE_MAX


def targets_detail(ids: Sequence[int]) -> Detail:
    """What an audit entry says of a job's targets: their count and the SHA-256 of their list (as
    comma-separated ids), not the list itself, which may be 100,000 ids long."""
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    return {"count": len(ids), "targets_sha256": digest}


def create(
    entry: Entry, command: RedriveJob, able: Sequence[int], refused: Sequence[tuple[int, Code]],
    approval: Detail | None = None,
) -> ReviewResult:  # fmt: skip
    """Store a RUNNING job over `able` (dead now) and record `refused` as refused items: every id
    given has a result. Refused whole (nothing stored) when nothing is able or too many run."""
    tx, now_ms = entry.tx, entry.now_ms
    if not able:
        return ReviewResult(code=refused[0][1], refused=tuple(refused), detail="no dead letter among the ids")
    if full(tx):
        return ReviewResult(code=Code.INVALID, detail=f"{JOBS_ACTIVE_MAX} jobs are running or paused already")
    job_id = entry.meta.next_job
    entry.meta.next_job = job_id + 1
    approval = approval or {}
    proposal_id, approved_by = approval.get("proposal"), approval.get("approved_by")
    assert proposal_id is None or isinstance(proposal_id, int)
    assert approved_by is None or isinstance(approved_by, str)
    row = JobRow(command.actor, command.reason, proposal_id, approved_by, JobState.RUNNING.value, command.rate_per_s,
                 now_ms, None, None, command.rate_per_s * now_ms, None, len(able) + len(refused), len(able), 0,
                 len(refused), 0)  # fmt: skip
    _save(tx, job_id, row)
    hold_group_part(tx, command.group, "job", job_id)
    pending = JobItemRow(ItemResult.PENDING.value, "", None)
    for message_id in able:
        _item(tx, job_id, message_id, pending)
    for message_id, code in refused:
        _item(tx, job_id, message_id, JobItemRow(ItemResult.REFUSED.value, code.name, now_ms))
    entry.audit(
        actor=command.actor, action="redrive_job", target=f"job:{job_id}", reason=command.reason, before={},
        after={"state": JobState.RUNNING.value, **targets_detail([*able, *(i for i, _ in refused)]), "pending": len(able),
               "refused": len(refused), "rate_per_s": command.rate_per_s, **approval, **group_detail(command.group)},
    )  # fmt: skip
    return ReviewResult(code=Code.OK, job_id=job_id, refused=tuple(refused))


def group_detail(group: str) -> Detail:
    """An audit entry's mention of the group (nothing without one: entries as before)."""
    return {"group": group} if group else {}


def step(entry: Entry, command: StepJob) -> JobStepResult:
    tx, now_ms = entry.tx, entry.now_ms
    job = _load(tx, command.job_id)
    if job is None:
        return JobStepResult(code=Code.NOT_FOUND, job_id=command.job_id)
    view = job.view
    if view.state is not JobState.RUNNING:
        return JobStepResult(code=Code.ILLEGAL_STATE, job_id=view.job_id, state=view.state, pending=view.pending)
    count = min(command.limit, job.allowance(now_ms))
    if count == 0:
        return JobStepResult(code=Code.OK, job_id=view.job_id, state=view.state, pending=view.pending,
                             next_step_ms=view.next_step_ms)  # fmt: skip
    pending = _pending(tx, view.job_id, count)
    approval: Detail = {"job": view.job_id}
    if view.proposal_id is not None:
        approval |= {"proposal": view.proposal_id, "approved_by": view.approved_by}
    redriven: list[int] = []
    refused: list[tuple[int, Code]] = []
    was = JobItemRow(ItemResult.PENDING.value, "", None)
    for message_id in pending:
        code = redrive_one(entry, message_id, actor=view.actor, reason=view.reason, approval=approval, dead_only=True)
        if code is None:
            redriven.append(message_id)
            _item(tx, view.job_id, message_id, JobItemRow(ItemResult.REDRIVEN.value, "", now_ms), was)
        else:
            refused.append((message_id, code))
            _item(tx, view.job_id, message_id, JobItemRow(ItemResult.REFUSED.value, code.name, now_ms), was)
    left = view.pending - len(pending)
    state = JobState.RUNNING if left else JobState.DONE
    rate = view.rate_per_s
    rate_base = max(job.rate_base, rate * now_ms - rate * 1000) + 1000 * len(pending)
    _save(tx, view.job_id, msgspec.structs.replace(
        job.row, state=state.value, pending=left, redriven=view.redriven + len(redriven),
        refused=view.refused + len(refused), last_step_ms=now_ms, finished_ms=None if left else now_ms,
        rate_base=rate_base,
    ))  # fmt: skip
    if state is JobState.DONE:
        entry.audit(
            actor="system", action="job_done", target=f"job:{view.job_id}", reason="no item is pending",
            before={"state": JobState.RUNNING.value},
            after={"state": JobState.DONE.value, "redriven": view.redriven + len(redriven),
                   "refused": view.refused + len(refused)},
        )  # fmt: skip
    return JobStepResult(
        code=Code.OK, job_id=view.job_id, state=state, redriven=tuple(redriven), refused=tuple(refused), pending=left,
        next_step_ms=_next_step_ms(state, rate, rate_base),
    )  # fmt: skip


_CONTROL: Final = {
    JobAction.PAUSE: (frozenset({JobState.RUNNING}), JobState.PAUSED),
    JobAction.RESUME: (frozenset({JobState.PAUSED}), JobState.RUNNING),
    JobAction.CANCEL: (frozenset({JobState.RUNNING, JobState.PAUSED}), JobState.CANCELLED),
}
"""Action -> (the states it is legal in, the state it leads to). Anything else is ILLEGAL_STATE."""


def control(entry: Entry, command: ControlJob) -> ReviewResult:
    tx, now_ms = entry.tx, entry.now_ms
    job = _load(tx, command.job_id)
    if job is None:
        return ReviewResult(code=Code.NOT_FOUND, job_id=command.job_id)
    legal, after = _CONTROL[command.action]
    before = job.view.state
    if before not in legal:
        return ReviewResult(code=Code.ILLEGAL_STATE, job_id=command.job_id,
                            detail=f"the job is {before.value}: it cannot be {after.value}")  # fmt: skip
    detail: Detail = {"state": after.value}
    if after is JobState.CANCELLED:
        left = _pending(tx, command.job_id, None)
        assert len(left) == job.view.pending, (left, job.view)
        was = JobItemRow(ItemResult.PENDING.value, "", None)
        for message_id in left:
            _item(tx, command.job_id, message_id, JobItemRow(ItemResult.NOT_REDRIVEN.value, CANCELLED, now_ms), was)
        row = msgspec.structs.replace(job.row, state=after.value, pending=0, not_redriven=job.row.not_redriven + len(left),
                                      finished_ms=now_ms, controlled_by=command.actor)  # fmt: skip
        detail["not_redriven"] = len(left)
    else:
        row = msgspec.structs.replace(job.row, state=after.value, controlled_by=command.actor)
    _save(tx, command.job_id, row)
    entry.audit(
        actor=command.actor, action=f"{command.action.value}_job", target=f"job:{command.job_id}",
        reason=command.reason, before={"state": before.value}, after=detail,
    )  # fmt: skip
    return ReviewResult(code=Code.OK, job_id=command.job_id)


# ---- reads --------------------------------------------------------------------------------------
def listing(
    view: KvRead, *, ids: Sequence[int] = (), active_only: bool = False, before_id: int | None = None,
    limit: int = 100,
) -> list[JobView]:  # fmt: skip
    """These jobs, else newest first below `before_id` (running and paused ones only, if asked)."""
    assert 0 < limit <= JOBS_PAGE_MAX
    if ids:
        found = (_load(view, job_id) for job_id in dict.fromkeys(ids))
        return [job.view for job in found if job is not None]
    bound = keys.u64(before_id if before_id is not None else keys.U64_MAX)
    jobs: list[JobView] = []
    table = Table.JOBS_ACTIVE if active_only else Table.JOBS
    for key, value in view.scan(table, b"", bound, reverse=True):
        job = _load(view, keys.u64_of(key)) if active_only else _job(keys.u64_of(key), job_decoder.decode(value))
        assert job is not None
        jobs.append(job.view)
        if len(jobs) == limit:
            break
    return jobs


def items(
    view: KvRead, job_id: int, *, after_message_id: int = 0, limit: int = 100, result: ItemResult | None = None
) -> list[JobItem]:
    """A job's items in message-id order after `after_message_id` (of one result, if asked)."""
    assert 0 < limit <= ITEMS_PAGE_MAX
    found: list[JobItem] = []
    if result is None:
        prefix = keys.u64(job_id)
        for key, value in view.scan(Table.JOB_ITEMS, keys.pair(job_id, after_message_id + 1), keys.after(prefix)):
            row = job_item_decoder.decode(value)
            found.append(JobItem(message_id=keys.u64_of(key, 8), result=ItemResult(row.result), code=row.code,
                                 done_ms=row.done_ms))  # fmt: skip
            if len(found) == limit:
                break
        return found
    prefix = keys.u64(job_id) + _RESULT_BYTE[result.value]
    for key, _ in view.scan(Table.JOB_ITEMS_BY_RESULT, prefix + keys.u64(after_message_id + 1), keys.after(prefix)):
        message_id = keys.u64_of(key, 9)
        stored = view.get(Table.JOB_ITEMS, keys.pair(job_id, message_id))
        assert stored is not None
        row = job_item_decoder.decode(stored)
        found.append(JobItem(message_id=message_id, result=result, code=row.code, done_ms=row.done_ms))
        if len(found) == limit:
            break
    return found
