"""``/v1/breakers`` and ``/v1/downstreams/{name}/classification``: what operators see and change
about the systems the workers call.

A breaker is open while its holder ``breaker:<downstream>`` pauses the downstream's kinds (the
workers trip and close it: services/worker/breaker.py); an operator forces it open or closed,
or gives it back to the workers (auto), with a settings document. A classification table maps a
downstream's answers (status, error code) to success, retry or permanent; the workers use an
operator's table from the store, else the default. Both changes are replicated commands whose
events record who, why, and the document before and after.

Must never: store a table or a mode that does not validate (the workers trust what is stored).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final, Literal

import msgspec
from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.responses import Response

from api import openapi
from api.auth import Observer, Operator
from api.http import json_response, read_body, require_json
from api.problems import invalid
from api.schemas import utc
from api.services import ApiServices, of
from handlers.classification import ClassificationError, decode_table, encode_table
from handlers.tables import DEFAULT_TABLES
from ledger.kinds import DOWNSTREAM_OF
from queues import ClientError, QueueError, cluster_settings

router = APIRouter(tags=["downstreams"])
BREAKERS: Final = "breakers"
TABLES: Final = "classification"
DOWNSTREAMS: Final = tuple(sorted(set(DOWNSTREAM_OF.values())))
Downstream = Annotated[str, Path(pattern="^(" + "|".join(DOWNSTREAMS) + ")$", description="payment, red_packet or callback")]


class Mode(enum.StrEnum):
    AUTO = "auto"
    OPEN = "open"
    CLOSED = "closed"


class BreakerChange(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Literal["auto", "open", "closed"]
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000)]


class BreakerView(BaseModel):
    downstream: str
    state: str = Field(description="open: the breaker pauses the downstream's kinds; closed: it does not.")
    mode: Mode = Field(description="auto: the workers trip and close it; open or closed: an operator forced it.")
    kinds: list[str]
    reason: str | None
    since: str | None
    mode_set_by: str | None


async def _read(services: ApiServices, call: Any) -> Any:
    try:
        return (await call).value
    except (ClientError, QueueError) as error:
        raise services.read_failure(error) from None


def _mode(body: bytes) -> Mode:
    try:
        return Mode(msgspec.json.decode(body).get("mode", "auto"))
    except (ValueError, AttributeError, msgspec.DecodeError):
        return Mode.AUTO


@router.get("/v1/breakers", response_model=list[BreakerView], summary="Each downstream's circuit breaker",
            responses=openapi.problems(401, 403, 503))  # fmt: skip
async def breakers(request: Request, principal: Observer) -> Response:
    services: ApiServices = of(request)
    kinds = {view.kind: view for view in await _read(services, services.cluster_read(lambda queue: queue.kinds()))}
    read = services.cluster_read(lambda queue: queue.documents(BREAKERS))
    documents = {doc.name: doc for doc in (await _read(services, read)).documents}
    answer = []
    for downstream in DOWNSTREAMS:
        names = sorted(kind.value for kind, target in DOWNSTREAM_OF.items() if target == downstream)
        pauses = [p for name in names if name in kinds for p in kinds[name].pauses if p.holder == f"breaker:{downstream}"]
        document = documents.get(downstream)
        answer.append({
            "downstream": downstream, "state": "open" if pauses else "closed", "kinds": names,
            "mode": _mode(document.body).value if document else Mode.AUTO.value,
            "reason": pauses[0].reason if pauses else None, "since": utc(pauses[0].since_ms) if pauses else None,
            "mode_set_by": document.updated_by if document else None,
        })  # fmt: skip
    return json_response(answer)


@router.put("/v1/breakers/{downstream}", response_model=list[BreakerView], summary="Force a breaker, or give it back",
            responses=openapi.problems(401, 403, 409, 422, 503))  # fmt: skip
async def force(request: Request, downstream: Downstream, change: BreakerChange, principal: Operator) -> Response:
    """The workers act on it within a second: open holds the downstream's kinds paused and never
    probes; closed never trips and releases the breaker's pause; auto returns it to the workers."""
    services: ApiServices = of(request)
    body = msgspec.json.encode({"mode": change.mode, "reason": change.reason})
    await _put(services, BREAKERS, downstream, body, principal.name, change.reason)
    return await breakers(request, principal)


async def _put(services: ApiServices, namespace: str, name: str, body: bytes | None, actor: str, reason: str) -> None:
    """The document written to the store; with several sets, to every set (api/services.py `fan_out`)."""
    setting = cluster_settings.Document(namespace=namespace, name=name, body=body, reason=reason)
    await services.write_setting(setting, actor=actor)


async def _table(services: ApiServices, downstream: str) -> tuple[bytes, dict[str, Any]]:
    documents = (await _read(services, services.cluster_read(lambda queue: queue.documents(TABLES)))).documents
    stored = next((doc for doc in documents if doc.name == downstream), None)
    if stored is None:
        return encode_table(DEFAULT_TABLES[downstream]), {"source": "default"}
    return stored.body, {"source": "operator", "updated_by": stored.updated_by, "updated_at": utc(stored.updated_ms)}


@router.get("/v1/downstreams/{downstream}/classification", response_model=dict[str, Any],
            summary="How a downstream's answers are classified", responses=openapi.problems(401, 403, 503))  # fmt: skip
async def get_classification(request: Request, downstream: Downstream, principal: Observer) -> Response:
    body, origin = await _table(of(request), downstream)
    return json_response({"table": msgspec.json.decode(body), **origin})


@router.put(
    "/v1/downstreams/{downstream}/classification", response_model=dict[str, Any],
    summary="Replace a downstream's classification table", responses=openapi.problems(400, 401, 403, 409, 413, 415, 422, 503),
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                       "schema": {"$ref": "#/components/schemas/ClassificationTable"}}}},
                   "parameters": [{"name": "X-Reason", "in": "header", "required": True, "description": "Why (recorded).",
                                   "schema": {"type": "string", "pattern": "\\S", "maxLength": 1000}}]},
)  # fmt: skip
async def set_classification(request: Request, downstream: Downstream, principal: Operator) -> Response:
    """The whole table (rules in order, the last one matching everything), validated strictly;
    answered with the table before and after. The workers use it within a second."""
    services: ApiServices = of(request)
    reason = request.headers.get("x-reason", "").strip()
    if not reason or len(reason) > 1000:
        raise invalid([{"field": "X-Reason", "message": "say why the table changes (recorded with it)"}])
    require_json(request)
    body = await read_body(request, 64 * 1024)
    try:
        table = decode_table(body)
    except (ClassificationError, msgspec.DecodeError) as error:
        raise invalid([{"field": "(body)", "message": str(error)}]) from None
    if table.downstream != downstream:
        raise invalid([{"field": "downstream", "message": f"the table is for {table.downstream}, not {downstream}"}])
    before, _ = await _table(services, downstream)
    await _put(services, TABLES, downstream, encode_table(table), principal.name, reason)
    return json_response({"before": msgspec.json.decode(before), "after": msgspec.json.decode(encode_table(table))})


@router.delete("/v1/downstreams/{downstream}/classification", response_model=dict[str, Any],
               summary="Return a downstream to its default table", responses=openapi.problems(401, 403, 409, 503))  # fmt: skip
async def reset_classification(request: Request, downstream: Downstream, principal: Operator) -> Response:
    services: ApiServices = of(request)
    await _put(services, TABLES, downstream, None, principal.name, "back to the default table")
    return await get_classification(request, downstream, principal)
