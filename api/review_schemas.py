"""The bodies of the review endpoints (api/routers/review.py): strict, every field bounded, every
bad one named in the 422 problem."""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from api.schemas import REF_KEY_PATTERN
from ledger.kinds import Whole

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


class RedriveBody(_Strict):
    """`ids` (a selection) or `filter` (everything it matches, oldest first, up to `limit`)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["ids"], "properties": {"ids": {"type": "array"}}},
        {"required": ["filter"], "properties": {"filter": {"type": "object"}}},
    ]})  # fmt: skip

    ids: Annotated[list[Annotated[str, StringConstraints(max_length=40)]], Field(min_length=1, max_length=1000)] | None = None
    filter: DeadLetterQuery | None = None
    limit: Annotated[int, Field(ge=1, le=1000), Whole] = 100
    reason: Reason

    @model_validator(mode="after")
    def _one_selection(self) -> RedriveBody:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give ids or filter, not both or neither")
        return self


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
