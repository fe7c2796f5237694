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
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.responses import Response

from api import openapi
from api.auth import Observer, Principal, requires
from api.http import json_response
from api.problems import invalid
from api.services import ApiServices, of
from queues import ClientError, QueueError, cluster_settings
from queues.model import RetentionResult

router = APIRouter(tags=["retention"])
Admin = Annotated[Principal, Depends(requires())]
"""An administrator only (`requires` always admits the admin role)."""


class RetentionView(BaseModel):
    retention_ms: int = Field(description="How long a finished request's tombstone (its idempotency key) is kept.")
    event_retention_ms: int = Field(description="How long events are kept.")
    floor_ms: int = Field(description="The shortest value a change may set.")


class RetentionChange(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    retention_ms: int | None = Field(default=None, gt=0, description="The new tombstone retention, or none to keep it.")
    event_retention_ms: int | None = Field(default=None, gt=0, description="The new event retention, or none to keep it.")
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000)]


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
    if change.retention_ms is None and change.event_retention_ms is None:
        raise invalid([{"field": "retention_ms", "message": "give retention_ms, event_retention_ms or both"}])
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
