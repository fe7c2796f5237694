"""Prometheus metrics of the API: requests by route and status, latency, store round trips and
throttling, and the ASGI middleware that counts every request (problems included).

Routes are labelled by their template (``/v1/requests/{request_id}``), never by the path, so a
scan of random ids cannot blow up the series count. With several uvicorn workers the composition
root points prometheus_client's multiprocess mode at a shared folder and `exposition` merges the
processes' files.

Must never: label with a producer-chosen value (key, ref key, token name of an unknown caller).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    def __init__(self, *, multiprocess_dir: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._multiprocess_dir = multiprocess_dir
        self.requests = Counter(
            "compensator_api_requests_total", "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "compensator_api_request_seconds", "Time to answer, by route template and method.",
            ["route", "method"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.store = Histogram(
            "compensator_api_store_seconds", "Round trips to the replicated store, by operation.",
            ["operation"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self._children: dict[str, Histogram] = {}
        self._answers: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self.throttled = Counter(
            "compensator_api_throttled_total", "Requests over their producer's rate: held (then taken) or refused.",
            ["outcome"], registry=self.registry,
        )  # fmt: skip

        self.settings_repaired = Counter(
            "compensator_api_settings_repaired_total",
            "Cluster-wide settings the settings repair re-applied to a set that had missed them, by set.",
            ["set"], registry=self.registry,
        )  # fmt: skip
        self.settings_unverified = Gauge(
            "compensator_api_settings_unverified",
            "1 while the settings repair's last pass could not compare this set with the intended settings"
            " (the set did not answer), else 0.",
            ["set"], registry=self.registry, multiprocess_mode="max",
        )  # fmt: skip
        self.settings_repair_passes = Counter(
            "compensator_api_settings_repair_passes_total",
            "Passes of the settings repair: ok, or control_unreachable (the intended settings could not be read).",
            ["outcome"], registry=self.registry,
        )  # fmt: skip

    def observe_repair(self, compared: Iterable[int], report: Mapping[int, Sequence[object] | Exception] | None) -> None:
        """One pass of the settings repair over the sets `compared`; `report` None when the control
        set could not be read (nothing was compared)."""
        if report is None:
            self.settings_repair_passes.labels("control_unreachable").inc()
            return
        self.settings_repair_passes.labels("ok").inc()
        for set_id in compared:
            found = report.get(set_id)
            self.settings_unverified.labels(str(set_id)).set(1 if isinstance(found, Exception) else 0)
            if found is not None and not isinstance(found, Exception):
                self.settings_repaired.labels(str(set_id)).inc(len(found))

    def observe_store(self, operation: str, seconds: float) -> None:
        child = self._children.get(operation)
        if child is None:
            child = self._children[operation] = self.store.labels(operation)
        child.observe(seconds)

    def answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answer: counted by route template, method and status, and timed. `labels()` checks,
        joins and looks up its values under a lock on every call: the children are kept here by
        their labels instead (one entry per series the registry keeps anyway)."""
        children = self._answers.get((route, method, status))
        if children is None:
            children = self._answers[(route, method, status)] = (
                self.requests.labels(route, method, str(status)), self.latency.labels(route, method),
            )  # fmt: skip
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self._multiprocess_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)


class MetricsMiddleware:
    """Pure ASGI (Starlette's BaseHTTPMiddleware costs a task per request)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.answered(template, scope.get("method", ""), status, time.perf_counter() - started)
