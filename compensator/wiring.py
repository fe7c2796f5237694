"""The composition root: from one validated `Config` to the objects every process runs.

Each process kind has one function here (the API today; the workers, the projector and Kafka
will join), and each builds its parts from the configuration and nothing else: the store clients,
the token cache, the quotas, the tracer. This is the one place that knows which concrete parts
make the service; the packages it wires take typed values and never read configuration.

Must never: run anything at import, or be imported by the packages it wires.
"""

from __future__ import annotations

import os
import time

from fastapi import FastAPI
from opentelemetry.sdk.trace.export import SpanExporter

from api.app import create_app
from api.auth import TokenCache
from api.health import Readiness
from api.intake import Intake
from api.metrics import ApiMetrics
from api.quotas import Quotas, QuotaSettings
from api.services import ApiServices, ApiSettings
from compensator import config as configuration
from compensator.config import Config
from compensator.store import queue_client
from compensator.telemetry import tracer_provider


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
        quotas=Quotas(QuotaSettings(
            rate_per_s=quota.rate_per_s, burst=quota.burst, hold_max_s=quota.hold_max_ms / 1000,
            held_max=quota.held_max, processes=config.api.workers * config.api.instances,
        )),
        intake=Intake(
            queue, set_id=config.store.set_id, clock_ms=wall_clock_ms,
            tracer=provider.get_tracer("compensator.api"), observe_store_s=metrics.observe_store,
        ),
        readiness=Readiness(queue, tokens, lag_max=config.api.ready_lag_entries_max),
        metrics=metrics,
        settings=ApiSettings(
            set_id=config.store.set_id, body_bytes_max=config.api.body_bytes_max,
            batch_bytes_max=config.api.batch_bytes_max, batch_items_max=config.api.batch_items_max,
        ),
    )
    return create_app(services, tracer=provider)


def api_app_from_environment() -> FastAPI:
    """uvicorn's factory in each worker process: the configuration the `api` command validated,
    found again through COMPENSATOR_CONFIG and the same environment."""
    return api_app(configuration.load_from_environment())
