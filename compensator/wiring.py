"""The composition root: from one validated `Config` to the objects every process runs.

Each process kind has one function here (the API today; the workers, the projector and Kafka
will join), and each builds its parts from the configuration and nothing else: the store clients,
the token cache, the quotas, the tracer. This is the one place that knows which concrete parts
make the service; the packages it wires take typed values and never read configuration.

Must never: run anything at import, or be imported by the packages it wires.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
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
from compensator.projector.metrics import ProjectorMetrics
from compensator.projector.runner import Projector, ProjectorSettings
from compensator.store import queue_client
from compensator.telemetry import tracer_provider
from compensator.worker.limits import Limits
from compensator.worker.metrics import WorkerMetrics
from compensator.worker.runner import Worker, WorkerSettings
from handlers.registry import Registry


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def api_app(config: Config, *, span_exporter: SpanExporter | None = None) -> FastAPI:
    queue = queue_client(config)
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="api")
    metrics = ApiMetrics(multiprocess_dir=os.environ.get(configuration.METRICS_DIR_ENV) or None)
    tokens = TokenCache(queue, refresh_interval_s=config.auth.refresh_interval_s)
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
        ),
        readiness=Readiness(queue, tokens, lag_max=config.api.ready_lag_entries_max),
        metrics=metrics,
        settings=ApiSettings(
            set_id=config.store.set_id,
            body_bytes_max=config.api.body_bytes_max,
            batch_bytes_max=config.api.batch_bytes_max,
            batch_items_max=config.api.batch_items_max,
            job_rate_per_s=config.review.job_rate_per_s,
            policy_problems=functools.partial(guarantees.policy_problems, config.handlers),
        ),
        four_eyes=four_eyes(config),
        web=WebAuth(queue, web_settings(config), clock_ms=wall_clock_ms),
    )
    return create_app(services, tracer=provider)


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
    return api_app(configuration.load_from_environment())


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@contextlib.asynccontextmanager
async def projector(config: Config, dsn: str, *, name: str = "",
                    span_exporter: SpanExporter | None = None) -> AsyncIterator[Projector]:  # fmt: skip
    """The set's ledger projector writing to `dsn`, with its store client, closed on exit."""
    settings = config.projector
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="projector")
    queue = queue_client(config)
    built = Projector(
        queue, dsn,
        ProjectorSettings(set_id=config.store.set_id, owner=name or worker_id(), batch_max=settings.batch_max,
                          idle_poll_s=settings.idle_poll_ms / 1000, standby_poll_s=settings.standby_poll_ms / 1000),
        tracer=provider.get_tracer("compensator.projector"), metrics=ProjectorMetrics(),
    )  # fmt: skip
    try:
        yield built
    finally:
        await queue.raft.close()
        provider.shutdown()


@contextlib.asynccontextmanager
async def worker(config: Config, *, name: str = "", registry: Registry | None = None,
                 span_exporter: SpanExporter | None = None) -> AsyncIterator[Worker]:  # fmt: skip
    """A worker for this configuration, with its store client and its handlers' connections,
    closed on exit. The handlers come from `config.handlers` and the callback secrets (a file or
    $COMPENSATOR_CALLBACK_SECRETS) unless a registry is given."""
    from handlers.registry import build_registry
    from handlers.standins.command import read_secrets

    settings = config.worker
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="worker")
    metrics = WorkerMetrics()
    if registry is None:
        path = Path(settings.callback_secrets_file) if settings.callback_secrets_file else None
        registry = build_registry(config.handlers, secrets=read_secrets(path, os.environ) or {},
                                  tracer=provider.get_tracer("compensator.handlers"), events=metrics.handler_event)  # fmt: skip
    handlers = {kind.value: handler for kind, handler in registry.handlers.items()}
    pools = {"payment": config.handlers.payment.gateway, "red_packet": config.handlers.red_packet.gateway,
             "callback": config.handlers.callback.gateway}  # fmt: skip
    limits = Limits(
        per_kind=dict.fromkeys(handlers, settings.concurrency_per_kind),
        # Never more attempts at once than the downstream's client has connections: an attempt
        # waiting for a pooled connection can only time out (`pool_exhausted`).
        per_downstream={h.downstream: min(settings.concurrency_per_downstream, pools[h.downstream].connections_max)
                        for h in handlers.values()},
        downstream_of={kind: h.downstream for kind, h in handlers.items()},
    )  # fmt: skip
    queue = queue_client(config)
    built = Worker(
        queue, handlers, limits,
        WorkerSettings(worker_id=name or worker_id(), lease_ms=settings.lease_ms, batch_max=settings.batch_max,
                       idle_poll_s=settings.idle_poll_ms / 1000, drain_grace_s=settings.drain_grace_s,
                       breaker=configuration.worker_breaker(settings)),
        tracer=provider.get_tracer("compensator.worker"), metrics=metrics, registry=registry,
    )  # fmt: skip
    try:
        yield built
    finally:
        await registry.aclose()
        await queue.raft.close()
        provider.shutdown()
