"""The ingest in this process against Tansu and the store: a redelivered record is harmless, a key
reused with another body is refused as the API refuses it, malformed records never block their
partition, offsets are committed only after the store and the rejects topic acknowledged, and the
lag per partition is a metric."""

from __future__ import annotations

import asyncio
import json
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka_support import Broker, read_topic, requests_to_ingest, until
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from queues import QueueClient
from services.kafka.broker import BrokerSettings, RecordSink, ensure_topics
from services.kafka.ingest import Ingest, IngestSettings
from services.kafka.metrics import KafkaMetrics

GROUP = "ingest-inprocess"


def body(transfer_id: str, amount_minor: int = 100) -> bytes:
    return json.dumps(
        {
            "kind": "transfer",
            "ref_key": f"order-{transfer_id}",
            "payload": {
                "transfer_id": transfer_id,
                "payer": "a",
                "payee": "b",
                "amount_minor": amount_minor,
                "currency": "CNY",
            },
        }
    ).encode()


async def test_repeats_are_harmless_reused_keys_and_bad_records_are_rejected_and_lag_is_measured(
    queue: QueueClient, broker: Broker
) -> None:
    settings = BrokerSettings(bootstrap_servers=(broker.bootstrap,))
    await ensure_topics(settings, ["requests", "rejects"], 1)
    sent = [(b"k1", body("t1")), (b"k1", body("t1")), (b"k2", body("t2")), (b"k2", body("t2", 999)),
            (b"k3", b"[1, 2"), (b"k4", body("t4"))]  # fmt: skip
    consumer = await requests_to_ingest(broker.bootstrap, sent, GROUP)
    metrics = KafkaMetrics()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rejects = RecordSink(settings)
    ingest = Ingest(queue, consumer, rejects, IngestSettings(topic="requests", rejects_topic="rejects", producer="feed",
                    batch_max=2, poll_ms=100), metrics=metrics, tracer=provider.get_tracer("test"),
                    clock_ms=lambda: time.time_ns() // 1_000_000)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    try:
        await until(lambda: _committed(consumer, len(sent)), what="every record committed")
        await until(lambda: _lag(metrics, 0), what="lag measured as 0")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await consumer.stop()
        await rejects.close()
    stored = (await queue.by_idempotency_keys(["feed:k1", "feed:k2", "feed:k3", "feed:k4"])).value
    assert sorted((m.idempotency_key, json.loads(m.payload)["amount_minor"]) for m in stored) == [
        ("feed:k1", 100), ("feed:k2", 100), ("feed:k4", 100)]  # fmt: skip
    assert sum((await queue.counts()).value.values()) == 3
    rejected = await read_topic(broker.bootstrap, "rejects", until=2, timeout_s=30)
    coordinates = {(dict(r.headers)["source-offset"], dict(r.headers)["reject-reason"]) for r in rejected}
    assert coordinates == {(b"3", b"idempotency-key-reused"), (b"4", b"malformed-body")}
    rounds = [span for span in spans.get_finished_spans() if span.name == "kafka.ingest"]
    assert rounds and all(span.kind is SpanKind.CONSUMER for span in rounds)
    traces = {f"{span.context.trace_id:032x}" for span in rounds}
    assert {m.headers["traceparent"].split("-")[1] for m in stored} <= traces  # each request joined its round's trace
    outcomes = {
        outcome: metrics.ingested.labels(outcome)._value.get() for outcome in ("created", "existing", "rejected")
    }
    assert outcomes == {"created": 3, "existing": 1, "rejected": 2}


async def _committed(consumer: AIOKafkaConsumer, offset: int) -> bool:
    return await consumer.committed(TopicPartition("requests", 0)) == offset


async def _lag(metrics: KafkaMetrics, value: int) -> bool:
    samples = [s for family in metrics.registry.collect() if family.name == "compensator_kafka_ingest_lag"
               for s in family.samples]  # fmt: skip
    return [(s.labels, s.value) for s in samples] == [({"topic": "requests", "partition": "0"}, value)]
