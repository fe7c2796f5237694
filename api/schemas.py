"""What the API reads and writes besides a submission (submission/models.py, shared with the Kafka
ingest): a batch's body, the operator commands, and the documents it answers with.

Answers are plain JSON documents; their models here exist for the OpenAPI description, and a test
checks real answers against them.

Must never: read a clock (the intake checks times against its injected one), or define a payload
field (ledger/kinds.py does).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from submission.models import IDEMPOTENCY_KEY_LENGTH_MAX, OriginalFailure, Strict, Submission


class BatchItem(BaseModel):
    """For the description only: a batch is validated item by item, so one bad item is answered
    422 in its place and the others go through."""

    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(min_length=1, max_length=IDEMPOTENCY_KEY_LENGTH_MAX)
    request: Submission


class BatchSubmission(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[BatchItem] = Field(min_length=1, max_length=1000)


# ---- answers --------------------------------------------------------------------------------
QueueStateName = Literal["delayed", "ready", "leased", "done", "dead", "discarded"]
LedgerStateName = Literal["PENDING", "IN_FLIGHT", "SUCCEEDED", "DEAD_LETTERED", "CANCELLED"]


class Accepted(BaseModel):
    """A request as its submission is answered (201 created, or 200 for a replay of the key)."""

    id: str = Field(examples=["1-42"])
    kind: str
    ref_key: str
    state: QueueStateName
    ledger_state: LedgerStateName
    due_at: dt.datetime
    replayed: bool = Field(description="True: the key was seen before with this body; nothing new was created.")


class Attempt(BaseModel):
    attempt: int
    worker: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    outcome: str | None = Field(description="null while running; else succeeded, failed or expired.")
    error_class: str | None
    error_text: str | None


class OperatorAction(BaseModel):
    type: Literal["dead_lettered", "redriven", "discarded"]
    at: dt.datetime
    actor: str | None
    reason: str | None
    detail: dict[str, Any]


class AuditRecord(BaseModel):
    """An operator action as the replicated command that performed it recorded it (docs/review.md)."""

    seq: int
    at: dt.datetime
    actor: str
    action: str
    target: str
    reason: str
    before: dict[str, Any]
    after: dict[str, Any]
    hash: str


class RequestView(BaseModel):
    id: str
    kind: str
    ref_key: str
    idempotency_key: str
    producer: str
    state: QueueStateName
    ledger_state: LedgerStateName
    created_at: dt.datetime
    due_at: dt.datetime
    finished_at: dt.datetime | None
    attempts: int
    last_error: dict[str, str | None] | None
    lease: dict[str, Any] | None
    dead: dict[str, Any] | None
    payload: dict[str, Any]
    edited_payload: dict[str, Any] | None
    original_failure: OriginalFailure | None
    trace: dict[str, str]
    history: list[Attempt]
    operator_actions: list[OperatorAction]
    audit: list[AuditRecord] = Field(
        [], description="Every audit entry that concerns this request (kept forever, unlike the events above)."
    )
    version: int = Field(1, description="1 as submitted; an operator's edit makes a new version, a new request.")
    previous_version: str | None = Field(None, description="The id of the version this one supersedes.")
    superseded_by: str | None = Field(None, description="The id of the version that superseded this one (discarded).")


class TimelineEntry(BaseModel):
    at: dt.datetime
    request_id: str | None = Field(description="The request the step is about (an audit entry's first one).")
    kind: str | None
    type: Literal[
        "intake", "attempt_started", "attempt_succeeded", "attempt_failed", "attempt_expired", "dead_lettered",
        "redriven", "discarded", "audit",
    ] = Field(description="`audit`: an operator's action, from the audit chain (kept for ever); `redriven` and "
                          "`discarded` only for an action from before the chain.")  # fmt: skip
    attempt: int | None = None
    detail: dict[str, Any] = {}
    requests: list[str] | None = Field(None, description="An audit entry's requests of this ref key (an approval "
                                                         "of several, both versions of an edit).")  # fmt: skip
    audit: dict[str, Any] | None = Field(None, description="The audit entry, as GET /v1/audit gives it: seq, at, "
                                                           "actor, action, target, reason, before, after, hash.")  # fmt: skip


class Timeline(BaseModel):
    ref_key: str
    requests: list[str]
    entries: list[TimelineEntry]


class BatchAnswer(BaseModel):
    status: int = Field(description="The status this item would have had on its own: 201, 200, 422, 503, ...")
    request: Accepted | None = None
    problem: dict[str, Any] | None = Field(None, description="An RFC 9457 problem, for a status of 400 or more.")


class BatchResult(BaseModel):
    items: list[BatchAnswer]


class Pause(BaseModel):
    holder: str
    reason: str
    since: dt.datetime


class KindSummary(BaseModel):
    kind: str
    paused: bool
    pauses: list[Pause]
    counts: dict[str, int] = Field(description="Requests per queue state (states with none are left out).")
    oldest_due_age_ms: int | None = Field(description="How long the oldest ready request has waited past its due time.")


class KindDetail(KindSummary):
    policy: dict[str, Any]


HOLDER_PATTERN: Final = r"^[a-z0-9][a-z0-9_.-]{0,31}(:[a-z0-9][a-z0-9_.-]{0,31})?$"
"""A new pause's holder: a principal name, optionally qualified (`breaker:payment`, `ops:alice`).
Checked where pauses come in (here, and the command line), not by the store's machine: an older
log may hold other holders, and replaying it must give what it gave."""


class PauseCommand(Strict):
    holder: Annotated[str, StringConstraints(pattern=HOLDER_PATTERN)] | None = Field(
        None, description="Who holds the pause (default: the caller's token name), a name like a token's, optionally"
        " qualified (`ops:alice`); each holder releases its own."
    )
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000)]


class ResumeCommand(Strict):
    holder: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None


class PolicyChange(BaseModel):
    kind: str
    before: dict[str, Any] | None
    after: dict[str, Any]


def utc(ms: int) -> str:
    """Milliseconds since the epoch as RFC 3339 in UTC, to the millisecond."""
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
