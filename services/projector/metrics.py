"""Prometheus metrics of the projector: events projected, batches, how far the ledger lags the
store (in events and in seconds) and the cursor, by set, and whether this process is each set's
active projector. One process projects every set (runner.py): the gauges carry a `set` label.

Must never: label with a value a producer chose (a ref key, a key, a payload's field).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LAG_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
BATCH_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ProjectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "compensator_projector_events_total", "Events written to the ledger, by event type.", ["type"],
            registry=self.registry,
        )  # fmt: skip
        self.batches = Counter(
            "compensator_projector_batches_total", "Sets' batches committed (each with its set's cursor).",
            registry=self.registry,
        )  # fmt: skip
        self.rounds = Counter(
            "compensator_projector_rounds_total", "Transactions committed: one batch of each set that had one.",
            registry=self.registry,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            "compensator_projector_batch_seconds", "Time to write one round's rows and cursors, commit included.",
            buckets=BATCH_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.event_lag_seconds = Histogram(
            "compensator_projector_event_lag_seconds",
            "Per event: its commit to the ledger minus its time in the store (projector lag; p99 from here).",
            buckets=LAG_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.lag_events = Gauge(
            "compensator_projector_lag_events", "Events in the store not yet in the ledger, at the last look.", ["set"],
            registry=self.registry,
        )  # fmt: skip
        self.lag_seconds = Gauge(
            "compensator_projector_lag_seconds",
            "Age of the oldest event not yet in the ledger (0 when caught up), at the last look.", ["set"],
            registry=self.registry,
        )  # fmt: skip
        self.cursor = Gauge(
            "compensator_projector_cursor", "The last event seq in the ledger.", ["set"], registry=self.registry
        )
        self.active = Gauge(
            "compensator_projector_active", "1 while this process holds the set's projector lock.", ["set"],
            registry=self.registry,
        )  # fmt: skip
        self.lane_stopped = Gauge(
            "compensator_projector_lane_stopped", "1 when the set's projection stopped on what needs a person (a gap in"
            " its log, a ledger that disagrees with it): its cursor does not move until a restart after the fix; the"
            " other sets go on.", ["set"], registry=self.registry,
        )  # fmt: skip
        self.unreadable_payloads = Counter(
            "compensator_projector_unreadable_payloads", "Requests recorded without an amount: their payload was"
            " not a valid request of their kind.", registry=self.registry,
        )  # fmt: skip
