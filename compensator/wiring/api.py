"""The API process kind: its app, built from the configuration by `app` in each of uvicorn's
worker processes (`app_from_environment`, the factory compensator/commands/api.py names), with its
store client, token cache, quotas, intake, review rules, web sessions and tracer, and the garbage
collector's policy once its lifespan started (uvicorn, not the process shell, runs it).

Must never: run anything at import, or be imported by the packages it wires.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from opentelemetry.sdk.trace.export import SpanExporter

from api.app import create_app
from api.auth import TokenCache
from api.health import Readiness
from api.intake import Intake
from api.metrics import ApiMetrics
from api.quotas import Quotas, QuotaSettings
from api.review_policy import FourEyes
from api.services import ApiServices, ApiSettings
from api.web.sessions import WebAuth, WebSettings
from compensator import config as configuration
from compensator import guarantees
from compensator.config import Config
from compensator.gc_policy import GcPauses, GcPolicy
from compensator.gc_policy import apply as apply_gc_policy
from compensator.store import queue_client, sets_client
from compensator.telemetry import tracer_provider
from compensator.wiring.parts import gc_policy, wall_clock_ms


def api_app(config: Config, *, span_exporter: SpanExporter | None = None) -> FastAPI:
    queue = queue_client(config)
    sets = sets_client(config)
    # Tokens, users and sessions: the control set's with several sets (store.access_client), the
    # facade's own client of it, so it is closed with the facade.
    access = queue if sets is None or sets.control is None else sets.control.queue
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="api")
    metrics = ApiMetrics(multiprocess_dir=os.environ.get(configuration.METRICS_DIR_ENV) or None)
    tokens = TokenCache(access, refresh_interval_s=config.auth.refresh_interval_s)
    quota = config.quota
    services = ApiServices(
        queue=queue,
        tokens=tokens,
        quotas=Quotas(
            QuotaSettings(
                rate_per_s=quota.rate_per_s,
                burst=quota.burst,
                hold_max_s=quota.hold_max_ms / 1000,
                held_max=quota.held_max,
                processes=config.api.workers * config.api.instances,
            )
        ),
        intake=Intake(
            queue,
            set_id=config.store.set_id,
            clock_ms=wall_clock_ms,
            tracer=provider.get_tracer("compensator.api"),
            callback_targets=frozenset(target.name for target in config.handlers.callback.targets),
            observe_store_s=metrics.observe_store,
            sets=sets,
        ),
        readiness=Readiness(access, tokens, lag_max=config.api.ready_lag_entries_max, sets=sets),
        metrics=metrics,
        settings=ApiSettings(
            set_id=config.store.set_id,
            body_bytes_max=config.api.body_bytes_max,
            batch_bytes_max=config.api.batch_bytes_max,
            batch_items_max=config.api.batch_items_max,
            job_rate_per_s=config.review.job_rate_per_s,
            policy_problems=functools.partial(guarantees.policy_problems, config.handlers),
            settings_repair_s=config.store.sets_refresh_s,
        ),
        four_eyes=four_eyes(config),
        web=WebAuth(access, web_settings(config), clock_ms=wall_clock_ms),
        sets=sets,
    )
    return create_app(services, tracer=provider)


def after_start_up(app: FastAPI, policy: GcPolicy, metrics: ApiMetrics) -> None:
    """The garbage collector's policy (compensator/gc_policy.py) once the app's lifespan has
    started everything, and the collections' pauses among the API's metrics (one process's: with
    several workers the merged exposition holds only the shared counters). A policy of the
    process, so only for uvicorn's worker processes (`api_app_from_environment`), never for an app
    a test builds in its own process."""
    started_up = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with started_up(app) as state:
            with GcPauses() as pauses:
                metrics.registry.register(pauses)
                try:
                    apply_gc_policy(policy)
                    yield state
                finally:
                    metrics.registry.unregister(pauses)

    app.router.lifespan_context = lifespan


def web_settings(config: Config) -> WebSettings:
    web = config.web
    parts = urlsplit(config.api_url)
    return WebSettings(
        idle_timeout_s=web.idle_timeout_s, lifetime_s=web.lifetime_s, cookie_secure=web.cookie_secure,
        lockout_failures=web.lockout_failures, lockout_s=web.lockout_s, client_failures_max=web.client_failures_max,
        refresh_interval_s=config.auth.refresh_interval_s, public_origin=f"{parts.scheme}://{parts.netloc}",
    )  # fmt: skip


def four_eyes(config: Config) -> FourEyes:
    review = config.review
    return FourEyes(
        money_moving_kinds=frozenset(review.money_moving_kinds), amount_threshold_minor=review.amount_threshold_minor,
        bulk_count_max=review.bulk_count_max, proposal_ttl_ms=review.proposal_ttl_s * 1000,
        discard_reason_codes=review.discard_reason_codes,
    )  # fmt: skip


def api_app_from_environment() -> FastAPI:
    """uvicorn's factory in each worker process: the configuration the `api` command validated,
    found again through COMPENSATOR_CONFIG and the same environment."""
    config = configuration.load_from_environment()
    app = api_app(config)
    after_start_up(app, gc_policy(config), app.state.services.metrics)
    return app
