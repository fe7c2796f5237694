"""`create_app(services)`: the FastAPI application, built from parts the composition root made.

Must never: create a client, read configuration, or start anything at import; the lifespan
starts the token cache and closes the store connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from opentelemetry.trace import TracerProvider

from api import openapi, problems
from api.direct import DirectRoutes, direct_routes
from api.metrics import MetricsMiddleware
from api.routers import downstreams, health, kinds, refs, requests, retention, review, review_jobs
from api.services import ApiServices
from api.tracing import TracingMiddleware
from api.web import login as web_login
from api.web import pages_approvals, pages_audit, pages_dead_letters, pages_detail, pages_edit, pages_groups, pages_jobs

STATIC_DIR: Final = Path(__file__).parent / "static"
SWAGGER: Final = "/static/swagger-ui"
UNTRACED: Final = frozenset({"/healthz", "/readyz", "/metrics"})
DIRECT: Final = (("POST", "/v1/requests"),)
"""Served by their endpoint without the router (api/direct.py): the single submission."""
DESCRIPTION = """\
Payment services POST the calls that failed (a transfer, a red-packet list update, a callback); the
compensator stores each in a Raft-replicated queue (201 means a majority fsynced it), retries it
idempotently with backoff, and parks what cannot succeed for finance to review.

Every request needs `Authorization: Bearer <token>` (`compensator token create`). Every error is an
RFC 9457 problem (`application/problem+json`) whose `type` names the kind of error.
"""


def create_app(services: ApiServices, *, tracer: TracerProvider) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.close()

    app = FastAPI(
        title="compensator", version="1", description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},  # api.tracing does it, at a tenth of the cost
    )  # fmt: skip
    app.state.services = services
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """Swagger UI from files served here (vendored from npm), never from a CDN: the page works
        on a machine with no internet."""
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="compensator API", swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css", swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
        )  # fmt: skip

    problems.install(app)
    web_login.install(app)
    for pages in (pages_dead_letters, pages_detail, pages_edit, pages_approvals, pages_audit, pages_jobs, pages_groups):
        app.router.routes.extend(pages.router.routes)  # the review pages (api/web/), outside the OpenAPI
    for router in (requests.router, refs.router, kinds.router, downstreams.router, retention.router, review.router,
                   review_jobs.router, health.router):
        # The routes themselves, not include_router's wrapper: matching through a wrapper per
        # router was 7 % of a submission's CPU (py-spy, 2026-11-23), and nothing here needs a
        # router's prefix or dependencies.
        app.router.routes.extend(router.routes)
    openapi.install(app)
    # Innermost of the three: the single POST skips the router and FastAPI's handler, not the
    # metrics and the span every request gets.
    app.add_middleware(DirectRoutes, routes=direct_routes(app.router.routes, DIRECT))
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    app.add_middleware(TracingMiddleware, tracer=tracer.get_tracer("compensator.api"), excluded_paths=UNTRACED)
    return app
