"""Prometheus metrics of the Kafka bridge: events published and how far behind the publisher is,
records ingested by outcome, rejects by reason, and the ingest's lag per partition.

Must never: label with a value a producer chose (a ref key, a key, a payload's field); a partition
number and a reject's problem type are bounded sets.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class KafkaMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.published = Counter(
            "compensator_kafka_events_published_total", "Events the broker acknowledged, by type (republished ones too).",
            ["type"], registry=self.registry,
        )  # fmt: skip
        self.publisher_cursor = Gauge(
            "compensator_kafka_publisher_cursor", "The last event sequence number acknowledged up to which every event is.",
            registry=self.registry,
        )  # fmt: skip
        self.publisher_lag_seconds = Gauge(
            "compensator_kafka_publisher_lag_seconds",
            "Age of the oldest event not yet published, by the store's clock (0 when caught up).", registry=self.registry,
        )  # fmt: skip
        self.publisher_active = Gauge(
            "compensator_kafka_publisher_active",
            "1 while this publisher holds its set's lease.",
            registry=self.registry,
        )
        self.publish_failures = Counter(
            "compensator_kafka_publish_failures_total", "Rounds that failed (store or broker) and were retried.",
            ["stage"], registry=self.registry,
        )  # fmt: skip
        self.publish_seconds = Histogram(
            "compensator_kafka_publish_batch_seconds", "Time to publish one batch until the broker acknowledged it.",
            buckets=BATCH_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.ingested = Counter(
            "compensator_kafka_ingest_records_total",
            "Records ingested by outcome (created, existing: a redelivery or a repeat of the key, rejected).",
            ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.rejects = Counter(
            "compensator_kafka_ingest_rejects_total", "Records sent to the rejects topic, by problem type.",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.ingest_lag = Gauge(
            "compensator_kafka_ingest_lag", "Records in the partition after the consumer's position.",
            ["topic", "partition"], registry=self.registry,
        )  # fmt: skip
        self.ingest_retries = Counter(
            "compensator_kafka_ingest_retries_total", "Store or broker calls retried during a batch.",
            ["stage"], registry=self.registry,
        )  # fmt: skip
        self.ingest_seconds = Histogram(
            "compensator_kafka_ingest_batch_seconds", "Time from a poll's records to their commit.",
            buckets=BATCH_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
