"""``/v1/kinds``: what operators see and do per kind: depth per state, oldest due age, pauses
(each held by a named holder with a reason, released only by that holder), and the retry policy
(validated, answered before and after). Every change is a replicated command recorded as an
event with the caller as its actor.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from api import openapi
from api.auth import Observer, Operator
from api.http import json_response, read_body, require_json, whole_numbers
from api.problems import Problem, invalid, msgspec_error, problem_of
from api.schemas import KindDetail, KindSummary, PauseCommand, PolicyChange, ResumeCommand, utc
from api.services import ApiServices, of
from delay.policy import RetryPolicy
from queues import ClientError, Code, KindResult, KindView, QueueError, cluster_settings
from submission.rules import too_deep

router = APIRouter(tags=["kinds"])
KindPath = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_.-]{0,63}$", description="A kind's name, e.g. transfer.")]
_policy_json = msgspec.json.Encoder()


def _policy(policy: RetryPolicy) -> dict[str, Any]:
    document: dict[str, Any] = msgspec.json.decode(_policy_json.encode(policy))
    return document


async def _views(services: ApiServices) -> tuple[tuple[KindView, ...], dict[tuple[str, str], int], dict[str, int]]:
    try:
        # Kinds, pauses and policies: every set holds them alike (the home set's, or another's when
        # it is down); counts and the oldest due age span the sets (docs/sets.md).
        kinds = (await services.cluster_read(lambda queue: queue.kinds())).value
        if services.sets is None:
            counts = (await services.queue.counts()).value
            oldest = (await services.queue.oldest_due_age_ms()).value
        else:
            counts = await services.sets.counts()
            oldest = {}
            for read in await asyncio.gather(*(services.sets.client(s).oldest_due_age_ms() for s in services.sets.set_ids)):
                for kind, age in read.value.items():
                    oldest[kind] = max(age, oldest.get(kind, age))
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None
    return kinds, counts, oldest


def _summary(view: KindView, counts: dict[tuple[str, str], int], oldest: dict[str, int]) -> dict[str, Any]:
    return {
        "kind": view.kind, "paused": bool(view.pauses),
        "pauses": [{"holder": p.holder, "reason": p.reason, "since": utc(p.since_ms)} for p in view.pauses],
        "counts": {state: n for (kind, state), n in sorted(counts.items()) if kind == view.kind},
        "oldest_due_age_ms": oldest.get(view.kind),
    }  # fmt: skip


async def _kind(services: ApiServices, kind: str) -> tuple[KindView, dict[str, Any]]:
    kinds, counts, oldest = await _views(services)
    for view in kinds:
        if view.kind == kind:
            return view, _summary(view, counts, oldest)
    raise Problem("not-found", f"no kind {kind!r}")


@router.get("/v1/kinds", response_model=list[KindSummary], summary="Every kind: depth, oldest due age, pauses",
            responses=openapi.problems(401, 403, 503))  # fmt: skip
async def list_kinds(request: Request, principal: Observer) -> Response:
    kinds, counts, oldest = await _views(of(request))
    return json_response([_summary(view, counts, oldest) for view in kinds])


@router.get("/v1/kinds/{kind}", response_model=KindDetail, summary="One kind, with its retry policy",
            responses=openapi.problems(401, 403, 404, 503))  # fmt: skip
async def get_kind(request: Request, kind: KindPath, principal: Observer) -> Response:
    view, summary = await _kind(of(request), kind)
    return json_response({**summary, "policy": _policy(view.policy)})


async def _command(services: ApiServices, call: Any) -> Any:
    try:
        return await call
    except ClientError as error:
        raise services.read_failure(error) from None
    except QueueError as error:
        raise Problem("invalid-request", f"the store refused it: {error}") from None


async def _everywhere(services: ApiServices, kind: str, setting: cluster_settings.Setting, actor: str) -> KindResult:
    """Several sets: the kind's change written to every set (api/services.py `fan_out`), answered
    as one set would answer it: ALREADY_PAUSED or NOT_PAUSED only when every set said so (a repeat
    after a partial write is a success), else the lowest-numbered set's result. A kind the home set
    does not know is 404 before anything is recorded."""
    kinds = (await _command(services, services.cluster_read(lambda queue: queue.kinds()))).value
    if all(view.kind != kind for view in kinds):
        return KindResult(code=Code.UNKNOWN_KIND, kind=kind)
    outcome = await services.fan_out(setting, actor=actor)
    first = outcome.first()
    if outcome.refused:
        refusal = next(iter(outcome.refused.values()))
        if isinstance(refusal, KindResult) and not outcome.applied:
            return refusal
        raise Problem("invalid-request", f"the store refused it in sets {', '.join(map(str, outcome.refused))}:"
                      f" {refusal!r}; applied in sets {', '.join(map(str, outcome.applied)) or 'none'}")  # fmt: skip
    if not outcome.already:
        ok = [r for r in outcome.results.values() if isinstance(r, KindResult) and r.code is Code.OK]
        return ok[0] if ok else KindResult(code=Code.OK, kind=kind)
    assert isinstance(first, KindResult)
    return first


@router.post("/v1/kinds/{kind}/pause", response_model=KindSummary, summary="Pause a kind (a named holder)",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def pause(request: Request, kind: KindPath, command: PauseCommand, principal: Operator) -> Response:
    """Workers stop leasing the kind while any holder holds it. Holding twice is 409."""
    services: ApiServices = of(request)
    holder = command.holder or principal.name
    if services.sets is None:
        result = await _command(services, services.queue.pause(kind, holder, command.reason, actor=principal.name))
    else:
        setting = cluster_settings.Pause(kind=kind, holder=holder, reason=command.reason)
        result = await _everywhere(services, kind, setting, principal.name)
    if result.code is Code.UNKNOWN_KIND:
        raise Problem("not-found", f"no kind {kind!r}")
    if result.code is Code.ALREADY_PAUSED:
        raise Problem("conflict", f"{holder} already holds {kind} paused")
    if result.code is not Code.OK:
        raise Problem("conflict", f"{kind} cannot be paused by {holder}: {result.code.name}")
    return json_response((await _kind(services, kind))[1])


@router.post("/v1/kinds/{kind}/resume", response_model=KindSummary, summary="Release a holder's pause",
             responses=openapi.problems(401, 403, 404, 409, 422, 503))  # fmt: skip
async def resume(request: Request, kind: KindPath, command: ResumeCommand, principal: Operator) -> Response:
    """The kind runs again once no holder holds it (a breaker's pause outlives an operator's)."""
    services: ApiServices = of(request)
    holder = command.holder or principal.name
    if services.sets is None:
        result = await _command(services, services.queue.resume(kind, holder, actor=principal.name))
    else:
        result = await _everywhere(services, kind, cluster_settings.Resume(kind=kind, holder=holder), principal.name)
    if result.code is Code.UNKNOWN_KIND:
        raise Problem("not-found", f"no kind {kind!r}")
    if result.code is Code.NOT_PAUSED:
        raise Problem("conflict", f"{holder} does not hold {kind} paused")
    return json_response((await _kind(services, kind))[1])


@router.get("/v1/kinds/{kind}/policy", summary="A kind's retry policy", responses=openapi.problems(401, 403, 404, 503),
            response_model=dict[str, Any])  # fmt: skip
async def get_policy(request: Request, kind: KindPath, principal: Observer) -> Response:
    """Read from any set that answers (every set holds the same policy once fanned out): no count
    is needed, so one set down does not make it a 503."""
    services = of(request)
    kinds = (await _command(services, services.cluster_read(lambda queue: queue.kinds()))).value
    for view in kinds:
        if view.kind == kind:
            return json_response(_policy(view.policy))
    raise Problem("not-found", f"no kind {kind!r}")


@router.put(
    "/v1/kinds/{kind}/policy", response_model=PolicyChange, summary="Replace a kind's retry policy",
    responses=openapi.problems(400, 401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/RetryPolicy"}}}}},
)  # fmt: skip
async def set_policy(request: Request, kind: KindPath, principal: Operator) -> Response:
    """The whole policy, validated (fields and the relations between them, and against what the
    kind's downstream is declared to guarantee: no re-send past its deduplication window, no
    Retry-After cap under its in-flight horizon); answered with the policy before and after. The
    change applies to each request's next failure."""
    services: ApiServices = of(request)
    require_json(request)
    body = await read_body(request, 64 * 1024)
    try:
        policy = msgspec.convert(whole_numbers(msgspec.json.decode(body)), RetryPolicy)
    except msgspec.ValidationError as error:
        raise invalid([msgspec_error(error)]) from None
    except msgspec.DecodeError:
        raise Problem("malformed-body", "the body is not valid JSON") from None
    except RecursionError:
        raise problem_of(too_deep()) from None
    problems = policy.problems() or services.settings.policy_problems(kind, policy)
    if problems:
        raise invalid([{"field": "policy", "message": problem} for problem in problems])
    if services.sets is None:
        await _kind(services, kind)  # 404 for a kind that does not exist: this endpoint never registers one
        result = await _command(services, services.queue.set_policy(kind, policy, actor=principal.name))
    else:
        result = await _everywhere(services, kind, cluster_settings.Policy(kind=kind, policy=policy), principal.name)
    before = None if result.policy_before is None else _policy(result.policy_before)
    return json_response({"kind": kind, "before": before, "after": _policy(policy)})
