"""Prometheus metrics of an outbox relay: what waits, how old the oldest is, what went, what was refused.

Must never: label with a value a producer chose (a key, a ref key, a payload's field).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.pending = Gauge(
            "compensator_outbox_pending", "Rows waiting to be sent (due or backing off).", registry=self.registry
        )
        self.oldest_pending_age = Gauge(
            "compensator_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending row: how far the relay is behind (0 when none waits).",
            registry=self.registry,
        )
        self.sent = Counter(
            "compensator_outbox_sent_total", "Rows the API accepted (201 created or 200 replay), by status.",
            ["status"], registry=self.registry,
        )  # fmt: skip
        self.rejected = Counter(
            "compensator_outbox_rejected_total", "Rows the API refused for what they are (kept as rejected), by status.",
            ["status"], registry=self.registry,
        )  # fmt: skip
        self.retries = Counter(
            "compensator_outbox_retries_total",
            "Sends to try again later, by reason (no_answer, api_busy, rate_limited, relay_misconfigured).",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.round_errors = Counter(
            "compensator_outbox_round_errors_total", "Rounds that failed on the producer's database.",
            registry=self.registry,
        )  # fmt: skip
