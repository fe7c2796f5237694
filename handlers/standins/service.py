"""What the three stand-ins share: the fault layer, the counters, the control routes, the pool.

Owns:
- `Standin`, one service's runtime state: its fault settings and seedable `random.Random`, the
  outage deadline, its counters and its PostgreSQL pool (opened and its tables created by the
  app's lifespan);
- `FaultLayer`, an ASGI middleware that draws a `Plan` for every business request (every path
  not under ``/_``), delays it, refuses it (503 outage / unavailable, 429 with Retry-After) before
  the route runs, and withholds or cuts the answer after the route committed;
- `RawPath`, which routes on the path as sent, so an id holding an encoded ``/`` is one segment;
- `Traced`, a SERVER span per business request continuing the caller's trace context, so the whole
  path of one compensation (API, store, worker, this call) reads as one trace. Spans go to the
  process's global tracer provider: none unless the command line configured one;
- the control routes ``GET /_faults``, ``PUT /_faults`` (replace every setting), ``PATCH /_faults``
  (change the settings it names, a JSON merge patch: `faults.patched`; an outage restarts and the
  generator is reseeded only when the patch names `outage_s` or `seed`), both 422 ``invalid_faults``
  with nothing changed for settings that do not decode or contradict each other, and
  ``GET /_stats``; 400 ``invalid_request`` for a body the route's model refuses;
- `build_app`, which the three services call with their router and tables.

Must never: apply an effect outside a transaction, or count a request twice.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Final
from urllib.parse import unquote

import asyncpg
import msgspec
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handlers.standins.faults import After, FaultsError, FaultSettings, Plan, Refusal, decode_settings, draw, patched

POOL_CONNECTIONS_MAX: Final = 8
CONTROL_PREFIX: Final = "/_"
_PLAN_KEY: Final = "fault_plan"
_NO_FAULTS: Final = Plan(latency_s=0.0, refusal=None, permanent=False, after=After.ANSWER)


class ConnectionDropped(Exception):
    """Raised after the answer's status line went out: uvicorn then closes the connection, and the
    client sees an answer cut short. The stand-ins' server silences its log line."""


@dataclass
class Stats:
    """What a stand-in saw, for a test to check (``GET /_stats``)."""

    requests: int = 0
    """Business requests received (control routes excluded), refused ones included."""
    applied: int = 0
    """Effects committed."""
    repeats: int = 0
    """Requests answered from an effect committed earlier (the idempotent answer)."""
    by_outcome: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)

    def view(self) -> dict[str, Any]:
        return {"requests": self.requests, "applied": self.applied, "repeats": self.repeats,
                "by_outcome": dict(sorted(self.by_outcome.items())), "faults": dict(sorted(self.faults.items()))}  # fmt: skip


class Standin:
    """One service's runtime state; lives in ``app.state.standin``."""

    def __init__(self, *, name: str, seed: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.stats = Stats()
        self.settings = FaultSettings()
        self.rng = random.Random(seed)
        self._clock = clock
        self._outage_until = 0.0
        self._pool: asyncpg.Pool | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError(f"the {self.name} stand-in is not started")
        return self._pool

    def configure(self, settings: FaultSettings, *, named: frozenset[str] | None = None) -> None:
        """New settings: all of them (`named` None, a PUT), or those a patch `named`; only a named
        `outage_s` starts (or ends) an outage, and only a named `seed` reseeds."""
        self.settings = settings
        if named is None or "outage_s" in named:
            self._outage_until = self._clock() + settings.outage_s if settings.outage_s else 0.0
        if settings.seed is not None and (named is None or "seed" in named):
            self.rng.seed(settings.seed)

    def plan(self) -> Plan:
        return draw(self.settings, self.rng, in_outage=self._clock() < self._outage_until)

    def faults_view(self) -> dict[str, Any]:
        remaining = max(0.0, self._outage_until - self._clock())
        return {**msgspec.to_builtins(self.settings), "outage_remaining_s": round(remaining, 3)}

    def record(self, outcome: str, *, applied: bool = False, repeat: bool = False) -> None:
        self.stats.by_outcome[outcome] += 1
        self.stats.applied += applied
        self.stats.repeats += repeat

    async def open(self, dsn: str, ddl: str) -> None:
        self._pool = await asyncpg.create_pool(dsn, min_size=1, max_size=POOL_CONNECTIONS_MAX)
        async with self._pool.acquire() as connection:
            await connection.execute(ddl)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def answer(status: int, document: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(document, status_code=status, headers=headers)


async def standin_of(request: Request) -> Standin:  # async: a plain function runs on the thread pool
    standin: Standin = request.app.state.standin
    return standin


async def plan_of(request: Request) -> Plan:
    plan: Plan = request.scope.get("state", {}).get(_PLAN_KEY, _NO_FAULTS)
    return plan


StandinDep = Annotated[Standin, Depends(standin_of)]
PlanDep = Annotated[Plan, Depends(plan_of)]

_REFUSALS: Final = {
    Refusal.OUTAGE: (503, "outage"),
    Refusal.UNAVAILABLE: (503, "unavailable"),
    Refusal.THROTTLED: (429, "rate_limited"),
}


class FaultLayer:
    def __init__(self, app: ASGIApp, standin: Standin) -> None:
        self.app = app
        self.standin = standin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(CONTROL_PREFIX):
            await self.app(scope, receive, send)
            return
        standin = self.standin
        standin.stats.requests += 1
        plan = standin.plan()
        if plan.latency_s:
            await asyncio.sleep(plan.latency_s)
        if plan.refusal is not None:
            status, code = _REFUSALS[plan.refusal]
            standin.record(code)
            headers = {"retry-after": str(standin.settings.retry_after_s)} if status == 429 else None
            await answer(status, {"code": code}, headers)(scope, receive, send)
            return
        scope.setdefault("state", {})[_PLAN_KEY] = plan
        await self.app(scope, receive, self._fated(send, plan.after))

    def _fated(self, send: Send, after: After) -> Send:
        if after is After.ANSWER:
            return send
        standin = self.standin

        async def holding(message: Message) -> None:
            if message["type"] != "http.response.start":
                await send(message)
                return
            if after is After.WITHHOLD:
                standin.stats.faults["withheld"] += 1
                await asyncio.sleep(standin.settings.withhold_ms / 1000)
                await send(message)
                return
            standin.stats.faults["dropped"] += 1
            await send(message)
            raise ConnectionDropped

        return holding


_TRACE_HEADERS: Final = (b"traceparent", b"tracestate")


class Traced:
    def __init__(self, app: ASGIApp, standin: Standin) -> None:
        self.app = app
        self.service = standin.name
        self.tracer = trace.get_tracer("handlers.standins")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(CONTROL_PREFIX):
            await self.app(scope, receive, send)
            return
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"] if name in _TRACE_HEADERS}  # fmt: skip
        status = 0  # none sent: the connection was cut before an answer

        async def noting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        attributes = {"http.request.method": scope["method"], "compensator.downstream": self.service}
        with self.tracer.start_as_current_span(f"{self.service} {scope['method']}", context=propagate.extract(carrier),
                                               kind=trace.SpanKind.SERVER, attributes=attributes) as span:  # fmt: skip
            try:
                await self.app(scope, receive, noting)
            finally:
                if status:
                    span.set_attribute("http.response.status_code", status)


class RawPath:
    """Route on ``raw_path``: ``/transfers/a%2Fb`` is the transfer ``a/b``, not a path of two
    segments. Routes unquote their parameters (`segment`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            scope = {**scope, "path": raw.decode("ascii", errors="replace")}
        await self.app(scope, receive, send)


control = APIRouter(include_in_schema=False)


@control.get("/_faults")
async def get_faults(standin: StandinDep) -> JSONResponse:
    return answer(200, standin.faults_view())


@control.put("/_faults")
async def put_faults(request: Request, standin: StandinDep) -> JSONResponse:
    try:
        settings = decode_settings(await request.body())
    except FaultsError as error:
        return answer(422, {"code": "invalid_faults", "detail": str(error)})
    standin.configure(settings)
    return answer(200, standin.faults_view())


@control.patch("/_faults")
async def patch_faults(request: Request, standin: StandinDep) -> JSONResponse:
    try:
        settings, named = patched(standin.settings, await request.body())
    except FaultsError as error:
        return answer(422, {"code": "invalid_faults", "detail": str(error)})
    standin.configure(settings, named=named)
    return answer(200, standin.faults_view())


@control.get("/_stats")
async def get_stats(standin: StandinDep) -> JSONResponse:
    return answer(200, {"service": standin.name, **standin.stats.view()})


async def _invalid_request(request: Request, error: Exception) -> Response:
    (await standin_of(request)).record("invalid_request")
    return answer(400, {"code": "invalid_request"})


def build_app(*, standin: Standin, dsn: str, ddl: str, router: APIRouter, title: str) -> FastAPI:
    """A stand-in: its router, the control routes, the fault layer; the lifespan opens its pool
    and creates its tables if they are missing."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await standin.open(dsn, ddl)
        try:
            yield
        finally:
            await standin.close()

    app = FastAPI(title=title, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})  # `Traced` is the call's span  # fmt: skip
    app.state.standin = standin
    app.router.routes.extend([*router.routes, *control.routes])
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_middleware(FaultLayer, standin=standin)
    app.add_middleware(Traced, standin=standin)  # a refusal or a cut answer is part of the call's span
    app.add_middleware(RawPath)  # outermost: the fault layer sees the raw path too
    return app


def segment(raw: str) -> str:
    """A path parameter as sent (RawPath keeps it percent-encoded), decoded."""
    return unquote(raw)


def document_of(record: asyncpg.Record | None, column: str) -> dict[str, Any] | None:
    """A jsonb column (asyncpg hands it over as text) as a dict."""
    if record is None:
        return None
    loaded: dict[str, Any] = json.loads(record[column])
    return loaded
