"""The bodies of the review endpoints (api/routers/review.py): strict, every field bounded, every
bad one named in the 422 problem."""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict, StringConstraints, model_validator

from ledger.kinds import AMOUNT_MINOR_MAX, Whole
from queues import JOB_IDS_MAX, JOB_RATE_MAX
from submission.models import REF_KEY_PATTERN

Reason = Annotated[str, StringConstraints(min_length=1, max_length=1000)]
NAME_PATTERN: Final = r"^[a-z][a-z0-9_.-]{0,63}$"
"""A kind's or an error class's name, as the store takes it."""
KindName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DeadLetterQuery(_Strict):
    kind: KindName | None = None
    error_class: KindName | None = None
    ref_key: Annotated[str, StringConstraints(pattern=REF_KEY_PATTERN)] | None = None


class _Selection(_Strict):
    """`ids` or `filter`, never both or neither (said in the schema as a oneOf too)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["ids"], "properties": {"ids": {"type": "array"}}},
        {"required": ["filter"], "properties": {"filter": {"type": "object"}}},
    ]})  # fmt: skip

    @model_validator(mode="after")
    def _one_selection(self) -> _Selection:
        if (getattr(self, "ids", None) is None) == (getattr(self, "filter", None) is None):
            raise ValueError("give ids or filter, not both or neither")
        return self


class RedriveBody(_Selection):
    """`ids` (a selection) or `filter` (everything it matches, oldest first, up to `limit`)."""

    ids: Annotated[list[Annotated[str, StringConstraints(max_length=40)]], Field(min_length=1, max_length=1000)] | None = None
    filter: DeadLetterQuery | None = None
    limit: Annotated[int, Field(ge=1, le=1000), Whole] = 100
    reason: Reason
    group: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = Field(default=None, description=(
        "Several sets: the job group of a redrive that needs four eyes (every set's part proposed in it), to repeat"
        " a proposal that a set missed (the 503 partially-applied gives it); the same Idempotency-Key does the same."))


class EditBody(_Strict):
    payload: dict[str, Any] = Field(description="The whole edited payload, validated against the request's kind.")
    reason: Reason


class DiscardBody(_Strict):
    reason_code: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="One of the configured codes (review.discard_reason_codes)."
    )
    comment: Reason


class ApproveBody(_Strict):
    reason: Annotated[str, StringConstraints(max_length=1000)] = ""


class RejectBody(_Strict):
    reason: Reason


# ---- redrive jobs -------------------------------------------------------------------------------
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
MinorUnits = Annotated[int, Field(ge=0, le=AMOUNT_MINOR_MAX), Whole]
Attempts = Annotated[int, Field(ge=0, le=1_000_000), Whole]
Moment = Annotated[AwareDatetime, Strict(False)]
"""An RFC 3339 time with its zone (JSON has no time type: the text is the value, strict or not)."""


class JobFilter(DeadLetterQuery):
    """Everything a dead-letter filter can say; amounts in minor units of `currency` (required with
    an amount range), times with a zone, every range inclusive but `dead_to`."""

    dead_from: Moment | None = None
    dead_to: Moment | None = None
    currency: Currency | None = None
    amount_min_minor: MinorUnits | None = None
    amount_max_minor: MinorUnits | None = None
    attempts_min: Attempts | None = None
    attempts_max: Attempts | None = None
    set_id: Annotated[int, Field(ge=1, le=99999), Whole] | None = Field(
        default=None, alias="set", description="Several sets: this set's dead letters only (one set: its own id, or 404).")


class JobSelection(_Selection):
    """`ids` (a selection) or `filter` (every dead letter it matches now, up to a job's size)."""

    ids: Annotated[list[Annotated[str, StringConstraints(max_length=40)]], Field(min_length=1, max_length=JOB_IDS_MAX)] | None = None
    filter: JobFilter | None = None


class JobBody(JobSelection):
    reason: Reason
    group: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = Field(default=None, description=(
        "Several sets: the group of a job over several sets' dead letters, to repeat a creation that a set"
        " missed (the 503 partially-applied gives it); the same Idempotency-Key does the same."))
    rate_per_s: Annotated[int, Field(ge=1, le=JOB_RATE_MAX), Whole] | None = Field(
        default=None, description="Dead letters redriven per second (review.job_rate_per_s when left out)."
    )


class JobControlBody(_Strict):
    reason: Reason
