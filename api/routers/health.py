"""``/healthz`` (alive, no token), ``/readyz`` (store reachable, leader known, caught up; no
token) and ``/metrics`` (Prometheus text; an operator token, like every other endpoint)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from api import openapi
from api.auth import Operator
from api.http import json_response
from api.problems import Problem
from api.services import ApiServices

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Alive")
async def healthz() -> Response:
    return json_response({"status": "alive"})


@router.get("/readyz", summary="Ready to take requests", responses=openapi.problems(503))
async def readyz(request: Request) -> Response:
    services: ApiServices = request.app.state.services
    ready, detail = await services.readiness.check()
    if not ready:
        raise Problem("not-ready", str(detail.get("reason", "not ready")), headers={"Retry-After": "1"},
                      extra={"checks": detail})  # fmt: skip
    return json_response({"status": "ready", "checks": detail})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, responses=openapi.problems(401, 403))
async def metrics(request: Request, principal: Operator) -> Response:
    services: ApiServices = request.app.state.services
    return Response(services.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
