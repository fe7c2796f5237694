"""Redrive jobs: a bulk redrive of up to 100,000 dead letters that is tracked item by item,
rate-limited by the leader's time, pausable, cancellable halfway and resumable after any crash.

Why not one command: a Redrive of 10,000 letters would send them all downstream at once, could
not be stopped, and its one result would be lost with a connection. A job is replicated state
instead: the `jobs` row (who, why, who approved, state, rate, counters) and one `job_items` row per
dead letter (PENDING, REDRIVEN, REFUSED or NOT_REDRIVEN, with the code and the time). Each
`StepJob` redrives the next pending items in message-id order and writes each item's result in the
same apply as its redrive, so an item's result and its message's state never disagree, on any
replica, after any crash: a restart replays the entries the store had not committed, and a step
replayed does the same again.

The rate is the machine's, from the entry's leader time, so any number of drivers may propose
steps: a token bucket whose level is kept exactly in integer "rate x milliseconds" (`rate_base`),
full at one second's worth of items (the burst). `floor(rate x (now - last_step) / 1000)` with
`last_step` moved to now at every step, as first designed, loses the fraction at each step: a job of
5 a second stepped every 150 ms would be allowed 0 items forever, and two drivers stepping in turn
would halve the rate. The bucket keeps the fraction, and an empty step changes nothing.

An item is redriven by the machine's own redrive (`_Apply.redrive_one`): the same lifecycle check,
the same row update and the same `redriven` event and audit entry per message, which carries the
job (and the proposal and approver when the job was approved). A job acts only on messages that are
still dead: one redriven by someone else since, now waiting for its retry, is refused
(ILLEGAL_STATE), not given a second fresh attempt budget; the ids were approved as dead letters.

Must never: read a clock, scan items without an index, or report an item redriven that was not.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

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

if TYPE_CHECKING:
    from queues.machine import _Apply

JOBS_ACTIVE_MAX: Final = 100
"""Jobs running or paused at once: each is a read and a step for every driver period."""
JOBS_PAGE_MAX: Final = 1000
ITEMS_PAGE_MAX: Final = 1000
CANCELLED: Final = "cancelled"
"""The code of an item a cancel left not redriven."""

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS jobs (
        id INTEGER PRIMARY KEY, actor TEXT NOT NULL, reason TEXT NOT NULL, proposal_id INTEGER, approved_by TEXT,
        state TEXT NOT NULL, rate_per_s INTEGER NOT NULL, created_ms INTEGER NOT NULL, last_step_ms INTEGER,
        finished_ms INTEGER, rate_base INTEGER NOT NULL, controlled_by TEXT, total INTEGER NOT NULL,
        pending INTEGER NOT NULL, redriven INTEGER NOT NULL, refused INTEGER NOT NULL,
        not_redriven INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS job_items (
        job_id INTEGER NOT NULL, message_id INTEGER NOT NULL, result TEXT NOT NULL, code TEXT NOT NULL,
        done_ms INTEGER, PRIMARY KEY (job_id, message_id)) WITHOUT ROWID""",
    # The next pending items of a step, and a page of one result, without walking the done ones.
    "CREATE INDEX IF NOT EXISTS job_items_result ON job_items (job_id, result, message_id)",
    "CREATE INDEX IF NOT EXISTS jobs_active ON jobs (id) WHERE state IN ('running', 'paused')",
)

_COLUMNS: Final = (
    "id, actor, reason, proposal_id, approved_by, state, rate_per_s, created_ms, last_step_ms, finished_ms,"
    " rate_base, controlled_by, total, pending, redriven, refused, not_redriven"
)
_ACTIVE: Final = "state IN ('running', 'paused')"

Detail = dict[str, EventValue]


def create_tables(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


@dataclass(frozen=True, slots=True)
class _Job:
    view: JobView
    rate_base: int
    """The bucket: `rate x now - rate_base` is what the rate allows by `now`, in thousandths of an item."""

    def allowance(self, now_ms: int) -> int:
        """Items the rate allows by `now_ms`: floor(rate x elapsed / 1000) since the bucket's
        reference, at most one second's worth (the burst)."""
        rate = self.view.rate_per_s
        return max(0, min(rate, (rate * now_ms - self.rate_base) // 1000))


def _next_step_ms(state: JobState, rate: int, rate_base: int) -> int | None:
    """The first time at which the allowance is one item (ceil((rate_base + 1000) / rate))."""
    return -(-(rate_base + 1000) // rate) if state is JobState.RUNNING else None


def _job(row: Any) -> _Job:
    state, rate, rate_base = JobState(row[5]), int(row[6]), int(row[10])
    view = JobView(
        job_id=int(row[0]), actor=row[1], reason=row[2], proposal_id=row[3], approved_by=row[4], state=state,
        rate_per_s=rate, created_ms=int(row[7]), last_step_ms=row[8], finished_ms=row[9], controlled_by=row[11],
        total=int(row[12]), pending=int(row[13]), redriven=int(row[14]), refused=int(row[15]),
        not_redriven=int(row[16]), next_step_ms=_next_step_ms(state, rate, rate_base),
    )  # fmt: skip
    return _Job(view, rate_base)


def _load(conn: sqlite3.Connection, job_id: int) -> _Job | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else _job(row)


# ---- inside the apply ---------------------------------------------------------------------------
def judge(conn: sqlite3.Connection, ids: Sequence[int]) -> tuple[list[int], list[tuple[int, Code]]]:
    """(the ids whose message is dead now, the others with why: NOT_FOUND or ILLEGAL_STATE), in
    the order given: one statement for up to JOB_IDS_MAX ids (a JSON array joined to messages)."""
    phases = dict(
        conn.execute(
            "SELECT j.value, m.phase FROM json_each(?) AS j JOIN messages AS m ON m.id = j.value",
            (json.dumps(list(ids)),),
        ).fetchall()
    )
    able: list[int] = []
    refused: list[tuple[int, Code]] = []
    for message_id in ids:
        phase = phases.get(message_id)
        if phase == int(Phase.DEAD):
            able.append(message_id)
        else:
            refused.append((message_id, Code.NOT_FOUND if phase is None else Code.ILLEGAL_STATE))
    return able, refused


def full(conn: sqlite3.Connection) -> bool:
    """JOBS_ACTIVE_MAX jobs are running or paused: a new one is refused (INVALID) until one ends."""
    (active,) = conn.execute(f"SELECT count(*) FROM jobs INDEXED BY jobs_active WHERE {_ACTIVE}").fetchone()
    return int(active) >= JOBS_ACTIVE_MAX


def targets_detail(ids: Sequence[int]) -> Detail:
    """What an audit entry says of a job's targets: their count and the SHA-256 of their list (as
    comma-separated ids), not the list itself, which may be 100,000 ids long."""
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    return {"count": len(ids), "targets_sha256": digest}


def create(
    apply: _Apply, command: RedriveJob, able: Sequence[int], refused: Sequence[tuple[int, Code]],
    approval: Detail | None = None,
) -> ReviewResult:  # fmt: skip
    """Store a RUNNING job over `able` (dead now) and record `refused` as refused items: every id
    given has a result. Refused whole (nothing stored) when nothing is able or too many run."""
    conn, now_ms = apply.conn, apply.now_ms
    if not able:
        return ReviewResult(code=refused[0][1], refused=tuple(refused), detail="no dead letter among the ids")
    if full(conn):
        return ReviewResult(code=Code.INVALID, detail=f"{JOBS_ACTIVE_MAX} jobs are running or paused already")
    (job_id,) = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM jobs").fetchone()
    approval = approval or {}
    proposal_id, approved_by = approval.get("proposal"), approval.get("approved_by")
    conn.execute(
        f"INSERT INTO jobs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,NULL,NULL,?,NULL,?,?,0,?,0)",
        (job_id, command.actor, command.reason, proposal_id, approved_by, JobState.RUNNING.value, command.rate_per_s,
         now_ms, command.rate_per_s * now_ms, len(able) + len(refused), len(able), len(refused)),
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO job_items (job_id, message_id, result, code, done_ms) VALUES (?, ?, ?, '', NULL)",
        [(job_id, message_id, ItemResult.PENDING.value) for message_id in able],
    )
    conn.executemany(
        "INSERT INTO job_items (job_id, message_id, result, code, done_ms) VALUES (?, ?, ?, ?, ?)",
        [(job_id, message_id, ItemResult.REFUSED.value, code.name, now_ms) for message_id, code in refused],
    )
    apply.audit(
        actor=command.actor, action="redrive_job", target=f"job:{job_id}", reason=command.reason, before={},
        after={"state": JobState.RUNNING.value, **targets_detail([*able, *(i for i, _ in refused)]), "pending": len(able),
               "refused": len(refused), "rate_per_s": command.rate_per_s, **approval},
    )  # fmt: skip
    return ReviewResult(code=Code.OK, job_id=int(job_id), refused=tuple(refused))


def step(apply: _Apply, command: StepJob) -> JobStepResult:
    conn, now_ms = apply.conn, apply.now_ms
    job = _load(conn, command.job_id)
    if job is None:
        return JobStepResult(code=Code.NOT_FOUND, job_id=command.job_id)
    view = job.view
    if view.state is not JobState.RUNNING:
        return JobStepResult(code=Code.ILLEGAL_STATE, job_id=view.job_id, state=view.state, pending=view.pending)
    count = min(command.limit, job.allowance(now_ms))
    if count == 0:
        return JobStepResult(code=Code.OK, job_id=view.job_id, state=view.state, pending=view.pending,
                             next_step_ms=view.next_step_ms)  # fmt: skip
    pending = [
        int(row[0])
        for row in conn.execute(
            "SELECT message_id FROM job_items INDEXED BY job_items_result WHERE job_id = ? AND result = ?"
            " ORDER BY message_id LIMIT ?",
            (view.job_id, ItemResult.PENDING.value, count),
        )
    ]
    approval: Detail = {"job": view.job_id}
    if view.proposal_id is not None:
        approval |= {"proposal": view.proposal_id, "approved_by": view.approved_by}
    redriven: list[int] = []
    refused: list[tuple[int, Code]] = []
    for message_id in pending:
        code = apply.redrive_one(message_id, actor=view.actor, reason=view.reason, approval=approval, dead_only=True)
        if code is None:
            redriven.append(message_id)
        else:
            refused.append((message_id, code))
    conn.executemany(
        "UPDATE job_items SET result = ?, code = ?, done_ms = ? WHERE job_id = ? AND message_id = ?",
        [(ItemResult.REDRIVEN.value, "", now_ms, view.job_id, message_id) for message_id in redriven]
        + [(ItemResult.REFUSED.value, code.name, now_ms, view.job_id, message_id) for message_id, code in refused],
    )
    left = view.pending - len(pending)
    state = JobState.RUNNING if left else JobState.DONE
    rate = view.rate_per_s
    rate_base = max(job.rate_base, rate * now_ms - rate * 1000) + 1000 * len(pending)
    conn.execute(
        "UPDATE jobs SET state = ?, pending = ?, redriven = redriven + ?, refused = refused + ?, last_step_ms = ?,"
        " finished_ms = ?, rate_base = ? WHERE id = ?",
        (state.value, left, len(redriven), len(refused), now_ms, None if left else now_ms, rate_base, view.job_id),
    )
    if state is JobState.DONE:
        apply.audit(
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


def control(apply: _Apply, command: ControlJob) -> ReviewResult:
    conn, now_ms = apply.conn, apply.now_ms
    job = _load(conn, command.job_id)
    if job is None:
        return ReviewResult(code=Code.NOT_FOUND, job_id=command.job_id)
    legal, after = _CONTROL[command.action]
    before = job.view.state
    if before not in legal:
        return ReviewResult(code=Code.ILLEGAL_STATE, job_id=command.job_id,
                            detail=f"the job is {before.value}: it cannot be {after.value}")  # fmt: skip
    detail: Detail = {"state": after.value}
    if after is JobState.CANCELLED:
        left = conn.execute(
            "UPDATE job_items SET result = ?, code = ?, done_ms = ? WHERE job_id = ? AND result = ?",
            (ItemResult.NOT_REDRIVEN.value, CANCELLED, now_ms, command.job_id, ItemResult.PENDING.value),
        ).rowcount
        assert left == job.view.pending, (left, job.view)
        conn.execute(
            "UPDATE jobs SET state = ?, pending = 0, not_redriven = not_redriven + ?, finished_ms = ?,"
            " controlled_by = ? WHERE id = ?",
            (after.value, left, now_ms, command.actor, command.job_id),
        )
        detail["not_redriven"] = left
    else:
        conn.execute(
            "UPDATE jobs SET state = ?, controlled_by = ? WHERE id = ?", (after.value, command.actor, command.job_id)
        )
    apply.audit(
        actor=command.actor, action=f"{command.action.value}_job", target=f"job:{command.job_id}",
        reason=command.reason, before={"state": before.value}, after=detail,
    )  # fmt: skip
    return ReviewResult(code=Code.OK, job_id=command.job_id)


# ---- reads --------------------------------------------------------------------------------------
def listing(
    conn: sqlite3.Connection, *, ids: Sequence[int] = (), active_only: bool = False, before_id: int | None = None,
    limit: int = 100,
) -> list[JobView]:  # fmt: skip
    """These jobs, else newest first below `before_id` (running and paused ones only, if asked)."""
    assert 0 < limit <= JOBS_PAGE_MAX
    if ids:
        found = (_load(conn, job_id) for job_id in dict.fromkeys(ids))
        return [job.view for job in found if job is not None]
    bound = before_id if before_id is not None else (1 << 62)
    active = f" INDEXED BY jobs_active WHERE {_ACTIVE} AND" if active_only else " WHERE"
    rows = conn.execute(f"SELECT {_COLUMNS} FROM jobs{active} id < ? ORDER BY id DESC LIMIT ?", (bound, limit))
    return [_job(row).view for row in rows]


def items(
    conn: sqlite3.Connection, job_id: int, *, after_message_id: int = 0, limit: int = 100,
    result: ItemResult | None = None,
) -> list[JobItem]:  # fmt: skip
    """A job's items in message-id order after `after_message_id` (of one result, if asked)."""
    assert 0 < limit <= ITEMS_PAGE_MAX
    if result is None:
        rows = conn.execute(
            "SELECT message_id, result, code, done_ms FROM job_items WHERE job_id = ? AND message_id > ?"
            " ORDER BY message_id LIMIT ?",
            (job_id, after_message_id, limit),
        )
    else:
        rows = conn.execute(
            "SELECT message_id, result, code, done_ms FROM job_items INDEXED BY job_items_result"
            " WHERE job_id = ? AND result = ? AND message_id > ? ORDER BY message_id LIMIT ?",
            (job_id, result.value, after_message_id, limit),
        )
    return [JobItem(message_id=int(r[0]), result=ItemResult(r[1]), code=r[2], done_ms=r[3]) for r in rows]
