"""``/v1/retention``: how long the store keeps a finished request's tombstone (the idempotency
window: a replay of its key within it is answered with the same request) and its events (what the
projector, the events publisher and the request pages read).

Reading it is an operator's or reviewer's question ("how long is a key remembered?"); changing it
is an administrator's alone, with a reason, because a shorter tombstone retention shortens the
deduplication every producer relies on. The store refuses values under its floor (a day in a
deployment). With several sets the change is cluster-wide: recorded as intended in the control
set, then written to every set (docs/sets.md), and a set that did not answer is named.

Must never: answer a change as done that some set did not apply.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema, model_validator
from starlette.responses import Response

from api import openapi
from api.auth import Observer, Principal, requires
from api.http import json_response
from api.problems import invalid
from api.services import ApiServices, of
from delay.policy import DELAY_MAX_MS
from queues import ClientError, QueueError, RetentionResult, cluster_settings

router = APIRouter(tags=["retention"])
Admin = Annotated[Principal, Depends(requires())]
"""An administrator only (`requires` always admits the admin role)."""


class RetentionView(BaseModel):
    retention_ms: int = Field(description="How long a finished request's tombstone (its idempotency key) is kept.")
    event_retention_ms: int = Field(description="How long events are kept.")
    floor_ms: int = Field(description="The shortest value a change may set.")


def _whole(value: object) -> object:
    """JSON's 86400000.0 is the integer JSON Schema says it is; 1.5 and "1" stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class RetentionChange(BaseModel):
    """At least one of the two retentions (the schema's `anyOf`); each at least the store's floor
    (`GET /v1/retention`'s `floor_ms`: a day in a deployment), which the schema cannot state."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "anyOf": [{"required": ["retention_ms"]}, {"required": ["event_retention_ms"]}]})  # fmt: skip

    # Not nullable: leave a retention out to keep it (None is only the default of one left out).
    retention_ms: Annotated[int | None, BeforeValidator(_whole), Field(gt=0, le=DELAY_MAX_MS), WithJsonSchema(
        {"type": "integer", "exclusiveMinimum": 0, "maximum": DELAY_MAX_MS,
         "description": "The new tombstone retention; leave it out to keep it."})] = None  # fmt: skip
    event_retention_ms: Annotated[int | None, BeforeValidator(_whole), Field(gt=0, le=DELAY_MAX_MS), WithJsonSchema(
        {"type": "integer", "exclusiveMinimum": 0, "maximum": DELAY_MAX_MS,
         "description": "The new event retention; leave it out to keep it."})] = None  # fmt: skip
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000)]

    @model_validator(mode="after")
    def _given(self) -> RetentionChange:
        if any(getattr(self, name) is None for name in self.model_fields_set & {"retention_ms", "event_retention_ms"}):
            raise ValueError("a retention is a number of milliseconds; leave it out to keep it")
        if self.retention_ms is None and self.event_retention_ms is None:
            raise ValueError("give retention_ms, event_retention_ms or both")
        return self


class RetentionAnswer(BaseModel):
    before: RetentionView
    after: RetentionView


async def _read(services: ApiServices) -> dict[str, Any]:
    try:
        answer = (await services.cluster_read(lambda queue: queue.retention())).value
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None
    return {"retention_ms": answer.retention_ms, "event_retention_ms": answer.event_retention_ms,
            "floor_ms": answer.floor_ms}  # fmt: skip


@router.get("/v1/retention", response_model=RetentionView, summary="The tombstone and event retentions in force",
            responses=openapi.problems(401, 403, 503))  # fmt: skip
async def retention(request: Request, principal: Observer) -> Response:
    return json_response(await _read(of(request)))


@router.put("/v1/retention", response_model=RetentionAnswer, summary="Change the retentions (an administrator)",
            responses=openapi.problems(401, 403, 422, 503))  # fmt: skip
async def set_retention(request: Request, change: RetentionChange, principal: Admin) -> Response:
    """Values under the floor are refused (422) and change nothing. A new tombstone retention
    applies to requests that finish after it; a new event retention to the next purge."""
    services: ApiServices = of(request)
    before = await _read(services)
    low = [(name, value) for name, value in (("retention_ms", change.retention_ms),
                                             ("event_retention_ms", change.event_retention_ms))
           if value is not None and value < before["floor_ms"]]  # fmt: skip
    if low:
        raise invalid([{"field": name, "message": f"{value} is under the store's floor of {before['floor_ms']} ms"}
                       for name, value in low])  # fmt: skip
    setting = cluster_settings.Retention(retention_ms=change.retention_ms,
                                         event_retention_ms=change.event_retention_ms, reason=change.reason)  # fmt: skip
    result = await services.write_setting(setting, actor=principal.name)
    assert isinstance(result, RetentionResult)
    after = {"retention_ms": result.retention_ms, "event_retention_ms": result.event_retention_ms,
             "floor_ms": before["floor_ms"]}  # fmt: skip
    return json_response({"before": before, "after": after})
