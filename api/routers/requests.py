"""``/v1/requests``: submit one failed request, a batch of them, and read one back.

Checks run in the order a caller can act on them: who you are (401, 403), the Idempotency-Key
(400), the media type (415), the size (413), the body (400, 422), your quota (429, after
waiting), then the store (201 or 200 only once a majority fsynced it; 503 otherwise).

Must never: store anything for a request answered with an error, or tell a producer whether a
request it did not submit exists.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from api import openapi
from api.auth import SUBMIT, Principal, Reader, authenticate
from api.http import check_key, idempotency_key, json_response, read_body, require_json
from api.intake import Answer, Item
from api.problems import Problem, document, invalid, msgspec_error, problem_of
from api.quotas import Throttled
from api.schemas import Accepted, BatchResult, RequestView
from api.services import ApiServices, of
from api.views import request_document
from ledger.request_ids import RequestId
from queues import ClientError, QueueError, Role
from submission.rules import Invalid, parse_submission, too_deep

router = APIRouter(tags=["requests"])


def parse(body: bytes) -> Any:
    """A submission from JSON bytes, or the problem naming every bad field."""
    try:
        return parse_submission(body)
    except Invalid as refused:
        raise problem_of(refused) from None


async def admit(services: ApiServices, principal: Principal, count: int) -> None:
    try:
        waited_s = await services.quotas.admit(principal.name, count, rate_per_s=principal.rate_per_s,
                                               burst=principal.burst)  # fmt: skip
    except Throttled as throttled:
        services.metrics.throttled.labels("refused").inc()
        raise Problem(
            "rate-limited", str(throttled), headers={"Retry-After": str(throttled.retry_after_s)}
        ) from None
    if waited_s:
        services.metrics.throttled.labels("held").inc()


def _answer(answer: Answer, instance: str) -> Response:
    if answer.problem is not None:
        raise answer.problem
    headers = {"Location": answer.location} if answer.location else {}
    if answer.status == 200:
        headers["Idempotent-Replayed"] = "true"
    return json_response(answer.document, answer.status, headers)


@router.post(
    "/v1/requests", status_code=201, response_model=Accepted, summary="Submit one failed request",
    responses={200: {"model": Accepted, "description": "A replay: this key and body were seen before."},
               **openapi.problems(400, 401, 403, 413, 415, 422, 429, 503)},
    openapi_extra=openapi.body("Submission"),
)  # fmt: skip
async def submit(request: Request) -> Response:
    """Store a failed call for retry. Answered 201 only once a majority of the store fsynced it."""
    principal = await authenticate(request, SUBMIT)
    services: ApiServices = request.app.state.services
    key = idempotency_key(request)
    require_json(request)
    submission = parse(await read_body(request, services.settings.body_bytes_max))
    await admit(services, principal, 1)
    (answer,) = await services.intake.submit(principal, [Item(key, submission)])
    return _answer(answer, request.scope["path"])


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    items: list[msgspec.Raw]


class _ItemEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    idempotency_key: str
    request: msgspec.Raw


def _items(body: bytes, items_max: int) -> list[Item | Problem]:
    try:
        envelope = msgspec.json.decode(body, type=_Envelope)
    except msgspec.ValidationError as error:
        raise invalid([msgspec_error(error)]) from None
    except msgspec.DecodeError:
        raise Problem("malformed-body", "the body is not valid JSON") from None
    except RecursionError:
        raise problem_of(too_deep()) from None
    if not 1 <= len(envelope.items) <= items_max:
        raise invalid([{"field": "items", "message": f"send 1 to {items_max} items"}])
    parsed: list[Item | Problem] = []
    for index, raw in enumerate(envelope.items):
        try:
            item = msgspec.json.decode(raw, type=_ItemEnvelope)
            parsed.append(Item(check_key(item.idempotency_key), parse(bytes(item.request))))
        except msgspec.ValidationError as error:
            parsed.append(invalid([msgspec_error(error, f"items[{index}]")]))
        except RecursionError:
            parsed.append(problem_of(too_deep()))
        except Problem as problem:
            parsed.append(problem)
    return parsed


@router.post(
    "/v1/requests:batch", response_model=BatchResult, summary="Submit up to 1,000 failed requests",
    responses=openapi.problems(400, 401, 403, 413, 415, 422, 429), openapi_extra=openapi.body("BatchSubmission"),
)  # fmt: skip
async def submit_batch(request: Request) -> Response:
    """Each item has its own key and is answered in its place, with the status it would have had
    alone (201, 200, 422, 503, ...). Valid items go to the store in one round trip."""
    principal = await authenticate(request, SUBMIT)
    services: ApiServices = request.app.state.services
    require_json(request)
    items = _items(await read_body(request, services.settings.batch_bytes_max), services.settings.batch_items_max)
    valid = sum(1 for item in items if isinstance(item, Item))
    if valid:
        await admit(services, principal, valid)
    answers = await services.intake.submit(principal, items)
    path = request.scope["path"]
    return json_response({"items": [_batch_item(answer, path) for answer in answers]})


def _batch_item(answer: Answer, instance: str) -> dict[str, Any]:
    if answer.problem is not None:
        return {"status": answer.status, "problem": document(answer.problem, instance)}
    return {"status": answer.status, "request": answer.document}


@router.get(
    "/v1/requests/{request_id}", response_model=RequestView, summary="One request and everything that happened to it",
    responses=openapi.problems(401, 403, 404, 503),
)  # fmt: skip
async def get_request(request: Request, request_id: str, principal: Reader) -> Response:
    services = of(request)  # a viewer's reads are masked
    parsed = RequestId.parse(request_id)
    queue = None if parsed is None else await services.queue_of(parsed.set_id)
    if parsed is None or queue is None:
        raise Problem("not-found", f"no request {request_id}")
    try:
        view = (await queue.get(parsed.message_id)).value
        if view is None or (principal.role is Role.PRODUCER and not principal.owns(view.idempotency_key)):
            raise Problem("not-found", f"no request {request_id}")
        events = (await queue.message_events([view.message_id])).value
        audit = (await queue.message_audit([view.message_id])).value
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None
    return json_response(request_document(view, request_id, events, audit))
