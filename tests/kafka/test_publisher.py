"""The events publisher against a real broker (Tansu) and a real store: every event on the topic
as the store has it, keyed by ref key, with its sequence number, type and trace context; one
active publisher per set, a standby taking over from the saved cursor."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import msgspec
from kafka_support import Broker, read_topic, until
from opentelemetry import trace
from publisher_support import TYPES_OF_TRAFFIC, check_topic, enqueue, lifecycle

from compensator.kafka.broker import BrokerSettings, RecordSink, ensure_topics
from compensator.kafka.metrics import KafkaMetrics
from compensator.kafka.publisher import EventPublisher, PublisherSettings
from compensator.kafka.publisher_lease import NAMESPACE, LeaseBody, PublisherLease
from queues import QueueClient

TOPIC = "events"


@contextlib.asynccontextmanager
async def publishing(queue: QueueClient, broker: Broker, holder: str, *, lease_ms: int = 3000,
                     batch_max: int = 7) -> AsyncIterator[tuple[EventPublisher, KafkaMetrics]]:  # fmt: skip
    settings = BrokerSettings(bootstrap_servers=(broker.bootstrap,))
    await ensure_topics(settings, [TOPIC], 3)
    sink = RecordSink(settings)
    metrics = KafkaMetrics()
    lease = PublisherLease(queue, name=TOPIC, holder=holder, lease_ms=lease_ms)
    publisher = EventPublisher(queue, sink, lease, PublisherSettings(topic=TOPIC, batch_max=batch_max, poll_ms=50,
                               lease_ms=lease_ms, retry_ms=100), metrics=metrics, tracer=trace.NoOpTracer())  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    try:
        yield publisher, metrics
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await sink.close()


async def last_seq(queue: QueueClient) -> int:
    seq = 0
    while events := (await queue.events_after(seq, limit=1000)).value:
        seq = events[-1].seq
    return seq


async def lease_body(queue: QueueClient) -> LeaseBody:
    (document,) = [d for d in (await queue.documents(NAMESPACE)).value.documents if d.name == TOPIC]
    return msgspec.json.decode(document.body, type=LeaseBody)


async def test_every_event_is_published_in_order_per_ref_key_with_its_seq_type_and_trace(
    queue: QueueClient, broker: Broker
) -> None:
    await lifecycle(queue)
    target = await last_seq(queue)
    async with publishing(queue, broker, "p1") as (publisher, metrics):
        await until(lambda: _at_least(publisher, target), what="the publisher caught up")
    records = await read_topic(broker.bootstrap, TOPIC)
    await check_topic(queue, records, target)
    types = {json.loads(r.value)["type"] for r in records}
    assert TYPES_OF_TRAFFIC | {"policy_set", "document_put"} <= types
    assert len(records) == len({dict(r.headers)["seq"] for r in records}), "a clean run publishes each event once"
    body = await lease_body(queue)
    assert body.holder is None and body.cursor == publisher.acked >= target  # released, cursor saved
    assert metrics.published.labels("enqueued")._value.get() == 12


async def test_a_standby_waits_then_takes_over_from_the_saved_cursor_without_a_gap(
    queue: QueueClient, broker: Broker
) -> None:
    await enqueue(queue, 0, 40)
    first_scope = contextlib.AsyncExitStack()
    first, first_metrics = await first_scope.enter_async_context(publishing(queue, broker, "a"))
    await until(lambda: _at_least(first, 1), what="a became active")
    async with first_scope, publishing(queue, broker, "b") as (second, second_metrics):
        await enqueue(queue, 40, 40)
        await asyncio.sleep(1.5)  # several of b's lease polls
        assert first_metrics.publisher_active._value.get() == 1
        assert second_metrics.publisher_active._value.get() == 0, "two publishers active at once"
        assert second.acked == 0
        await first_scope.aclose()  # a stops: it saves its cursor and frees the lease
        handed_over = (await lease_body(queue)).cursor
        assert handed_over == first.acked > 0
        await enqueue(queue, 80, 40)
        target = await last_seq(queue)
        await until(lambda: _at_least(second, target), what="b caught up")
        assert second_metrics.publisher_active._value.get() == 1
    records = await read_topic(broker.bootstrap, TOPIC)
    await check_topic(queue, records, target)
    seqs = [int(dict(r.headers)["seq"]) for r in records]
    assert len(seqs) == len(set(seqs)), "a handover by release republishes nothing"


async def _at_least(publisher: EventPublisher, seq: int) -> bool:
    return publisher.acked >= seq
