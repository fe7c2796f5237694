"""A submission as every intake takes it: the body models of a failed request (a discriminated
union on ``kind``, each payload validated against its kind's model from ledger/kinds.py, in strict
mode, every bad field reported at once), and the limits a submission's fields have.

The HTTP API (``POST /v1/requests``, and its OpenAPI description) and the Kafka ingest validate
with these same models (submission/rules.py), so a request is the same request whichever way it came.

Must never: read a clock (an intake checks times against its injected one), define a payload
field (ledger/kinds.py does), or import the web framework (the ingest runs without it; pydantic
is not one).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, model_validator

from delay.policy import DELAY_MAX_MS
from ledger.kinds import REF_KEY_PATTERNS, CallbackPayload, Kind, ListUpdatePayload, TransferPayload, Whole

DELAY_MAX_S: Final = DELAY_MAX_MS // 1000
"""Two years (and a day per year): the furthest a request may be scheduled."""
IDEMPOTENCY_KEY_LENGTH_MAX: Final = 95
"""The store's key limit (128) less the producer's name (at most 32) and its separator."""
REF_KEY_PATTERN: Final = r"^[^\x00-\x1f\x7f]{1,128}$"
"""What a filter may search for: any ref key that may be stored, those from before control and
format characters were refused at intake included (the submission's own pattern is its kind's,
`REF_KEY_PATTERNS`)."""
REF_KEY_DESCRIPTION: Final = "The business id (red-packet id, order id): every request of one business id is in its timeline."


def _ref_key(kind: Kind) -> Any:
    return Field(description=f"{REF_KEY_DESCRIPTION} {_REF_KEY_RULES[kind]}")


_REF_KEY_RULES: Final = {
    Kind.TRANSFER: "The payment system's business id: 1-128 letters, digits and `_.:@/-`, starting with a letter or digit.",
    Kind.LIST_UPDATE: "1-128 characters, no control or format characters.",
    Kind.CALLBACK: "1-128 characters, no control or format characters.",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class OriginalFailure(Strict):
    """How the call failed when the producer made it (kept with the request, shown in its timeline)."""

    error_class: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
    text: Annotated[str, StringConstraints(max_length=1000)] | None = None
    http_status: Annotated[int, Field(ge=100, le=599), Whole] | None = None


class _Submission(Strict):
    model_config = ConfigDict(json_schema_extra={"not": {"required": ["delay_s", "not_before"]}})

    delay_s: Annotated[float, Field(ge=0, le=DELAY_MAX_S)] | None = Field(
        None, description="Retry no sooner than this many seconds from now."
    )
    not_before: AwareDatetime | None = Field(
        None, description="Retry no sooner than this time (RFC 3339 with an offset; at most 2 years ahead)."
    )
    failure: OriginalFailure | None = None

    @model_validator(mode="after")
    def _one_schedule(self) -> _Submission:
        if self.delay_s is not None and self.not_before is not None:
            raise ValueError("give delay_s or not_before, not both")
        return self


class TransferSubmission(_Submission):
    kind: Literal["transfer"]
    ref_key: Annotated[str, StringConstraints(pattern=REF_KEY_PATTERNS[Kind.TRANSFER])] = _ref_key(Kind.TRANSFER)
    payload: TransferPayload


class ListUpdateSubmission(_Submission):
    kind: Literal["list_update"]
    ref_key: Annotated[str, StringConstraints(pattern=REF_KEY_PATTERNS[Kind.LIST_UPDATE])] = _ref_key(Kind.LIST_UPDATE)
    payload: ListUpdatePayload


class CallbackSubmission(_Submission):
    kind: Literal["callback"]
    ref_key: Annotated[str, StringConstraints(pattern=REF_KEY_PATTERNS[Kind.CALLBACK])] = _ref_key(Kind.CALLBACK)
    payload: CallbackPayload


AnySubmission = TransferSubmission | ListUpdateSubmission | CallbackSubmission
Submission = Annotated[AnySubmission, Field(discriminator="kind")]
SUBMISSION: Final[TypeAdapter[AnySubmission]] = TypeAdapter(Submission)
KIND_TAGS: Final = tuple(model.model_fields["kind"].annotation.__args__[0] for model in (  # type: ignore[union-attr]
    TransferSubmission, ListUpdateSubmission, CallbackSubmission))  # fmt: skip
