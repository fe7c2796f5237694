"""``/v1/refs/{ref_key}/timeline``: everything that happened to one business id."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from api import openapi
from api.auth import Reader
from api.http import json_response
from api.problems import Problem
from api.schemas import Timeline
from api.services import of
from api.views import timeline_entries
from ledger.request_ids import RequestId
from queues import ClientError, QueueError, Role

router = APIRouter(tags=["refs"])


@router.get(
    "/v1/refs/{ref_key}/timeline", response_model=Timeline, summary="The timeline of one business id",
    responses=openapi.problems(401, 403, 404, 503),
)  # fmt: skip
async def timeline(request: Request, ref_key: str, principal: Reader) -> Response:
    """Every request of this ref key (a producer sees only its own), and in time order: intake,
    each attempt with the downstream's answer, dead-lettering, and each operator action as its
    audit entry (who, what, why, before -> after; kept after the events' retention). A viewer
    reads payloads masked."""
    services = of(request)  # a viewer's reads are masked
    set_ids = [services.settings.set_id] if services.sets is None else services.sets.set_ids
    requests: list[str] = []
    entries: list[dict[str, Any]] = []
    try:
        for set_id in set_ids:  # each set's part of the timeline, merged by time below
            queue = await services.queue_of(set_id)
            assert queue is not None
            views = (await queue.by_ref_key(ref_key)).value
            if principal.role is Role.PRODUCER:
                views = tuple(v for v in views if principal.owns(v.idempotency_key))
            if not views:
                continue
            ids = [v.message_id for v in views]
            events = (await queue.message_events(ids)).value
            audit = (await queue.message_audit_with_ids(ids)).value
            public = functools.partial(_public_id, set_id)
            requests.extend(public(v.message_id) for v in views)
            entries.extend(timeline_entries(views, events, public, audit))
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None
    if not requests:
        raise Problem("not-found", f"no requests with ref key {ref_key!r}")
    if len(set_ids) > 1:
        entries.sort(key=lambda entry: str(entry["at"]))  # stable: each set's order within a millisecond
    return json_response({"ref_key": ref_key, "requests": requests, "entries": entries})


def _public_id(set_id: int, message_id: int) -> str:
    return str(RequestId(set_id, message_id))
