"""`create_app(services)`: the FastAPI application, built from parts the composition root made.

Must never: create a client, read configuration, or start anything at import; the lifespan
starts the token cache and closes the store connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.trace import TracerProvider

from api import openapi, problems
from api.metrics import MetricsMiddleware
from api.routers import health, kinds, refs, requests
from api.services import ApiServices

DESCRIPTION = """\
Payment services POST the calls that failed (a transfer, a red-packet list update, a callback); the
compensator stores each in a Raft-replicated queue (201 means a majority fsynced it), retries it
idempotently with backoff, and parks what cannot succeed for finance to review.

Every request needs `Authorization: Bearer <token>` (`compensator token create`). Every error is an
RFC 9457 problem (`application/problem+json`) whose `type` names the kind of error.
"""


def create_app(services: ApiServices, *, tracer_provider: TracerProvider | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.close()

    app = FastAPI(
        title="compensator", version="1", description=DESCRIPTION, lifespan=lifespan, redoc_url=None,
    )  # fmt: skip
    app.state.services = services
    problems.install(app)
    for router in (requests.router, refs.router, kinds.router, health.router):
        app.include_router(router)
    openapi.install(app)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=tracer_provider, exclude_spans=["receive", "send"], excluded_urls="healthz,readyz,metrics"
    )
    return app
