"""Prometheus metrics of a worker: attempts by kind and outcome, handler latency, lateness (lease
time minus due time), leases lost and found expired, completions fenced, in flight per downstream,
and what the handlers did to keep an effect single (lookups, waits for an earlier request's expiry,
requests refused as expired, transfers parked as unknown_outcome), each also an event on the
attempt's span. Per set (the set's number is ours, not a producer's): grants, completions by the
store's answer, and whether the set answers this worker at all.

Must never: label with a value a producer chose (a ref key, a key, a payload's field).
"""

from __future__ import annotations

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENESS_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.attempts = Counter(
            "compensator_worker_attempts_total", "Attempts by kind and outcome (succeeded, retryable, permanent).",
            ["kind", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.handler_seconds = Histogram(
            "compensator_worker_handler_seconds", "Time a handler took, downstream calls included.",
            ["kind"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.lateness_seconds = Histogram(
            "compensator_worker_lateness_seconds", "Lease time minus due time, by the store's clock.",
            ["kind"], buckets=LATENESS_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.leases_expired = Counter(
            "compensator_worker_leases_expired_total", "Leases the store found expired while leasing.",
            registry=self.registry,
        )  # fmt: skip
        self.settled = Counter(
            "compensator_worker_completions_total",
            "Acks, fails and releases by the store's answer (ok, done_elsewhere: a duplicate delivery"
            " finished by another lease; fenced: this lease was lost).",
            ["action", "result"], registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "compensator_worker_in_flight", "Attempts running, by downstream.", ["downstream"], registry=self.registry
        )
        self.breaker_open = Gauge(
            "compensator_worker_breaker_open", "1 while the downstream's breaker holds its kinds paused, as this worker sees it.",
            ["downstream"], registry=self.registry,
        )  # fmt: skip
        self.handler_events = Counter(
            "compensator_worker_handler_events_total",
            "What handlers did to keep an effect single, by downstream: lookup (before a re-send), found,"
            " not_found, lookup_failed, waited (for earlier requests to expire), expired_refused (the downstream"
            " refused a request past its expires_at), lease_ended (a request not written: the lease had ended),"
            " unknown_outcome_pending (not found, looking again after the horizon), unknown_outcome (parked).",
            ["downstream", "event"], registry=self.registry,
        )  # fmt: skip
        self.leases_lost = Counter(
            "compensator_worker_leases_lost_total", "Extensions refused: the lease had expired or was taken over.",
            registry=self.registry,
        )  # fmt: skip

        self.set_grants = Counter(
            "compensator_worker_set_grants_total", "Grants this worker leased, by set.", ["set"], registry=self.registry
        )
        self.set_completions = Counter(
            "compensator_worker_set_completions_total", "Acks, fails and releases by set and the store's answer.",
            ["set", "action", "result"], registry=self.registry,
        )  # fmt: skip
        self.set_unreachable = Gauge(
            "compensator_worker_set_unreachable",
            "1 while this worker's calls to the set fail (down, no leader, no majority): it leases from the others.",
            ["set"], registry=self.registry,
        )  # fmt: skip

    def handler_event(self, downstream: str, event: str) -> None:
        """A handler's event: counted, and added to the span of the attempt it happened in."""
        self.handler_events.labels(downstream, event).inc()
        trace.get_current_span().add_event(f"{downstream}.{event}")
