"""Store traffic with every lifecycle event, and the checks every publisher test makes on the
events topic: after dropping repeated sequence numbers, each event exactly once, as the store
has it, in sequence order within each ref key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator

import msgspec
from aiokafka import ConsumerRecord
from kafka_support import Broker
from opentelemetry import trace

from ledger.kinds import TransferPayload, encode_payload
from queues import Enqueue, Event, QueueClient
from services.kafka.broker import BrokerSettings, RecordSink, ensure_topics
from services.kafka.event_records import SCHEMA
from services.kafka.metrics import KafkaMetrics
from services.kafka.publisher import EventPublisher, PublisherSettings
from services.kafka.publisher_lease import NAMESPACE, LeaseBody, PublisherLease

TOPIC = "events"
TYPES_OF_TRAFFIC = frozenset({"enqueued", "leased", "succeeded", "attempt_failed", "dead_lettered", "redriven",
                              "discarded", "paused", "resumed"})  # fmt: skip


def traceparent(index: int) -> str:
    return f"00-{index + 1:032x}-{index + 1:016x}-01"


async def enqueue(queue: QueueClient, start: int, count: int, refs: int = 7) -> None:
    payloads = [encode_payload(TransferPayload(transfer_id=f"t{i}", payer="a", payee="b", amount_minor=100,
                                               currency="CNY")) for i in range(start, start + count)]  # fmt: skip
    await queue.enqueue_many([
        Enqueue(kind="transfer", idempotency_key=f"k{i}", ref_key=f"order-{i % refs}", payload=payload,
                headers={"traceparent": traceparent(i)})
        for i, payload in zip(range(start, start + count), payloads, strict=True)
    ])  # fmt: skip


async def lifecycle(queue: QueueClient) -> None:
    """Leases, acks, failures up to dead letters, a redrive, a discard, a pause and a resume."""
    await enqueue(queue, 0, 12)
    grants = (await queue.lease("w1", count_max=100, lease_ms=30_000)).grants
    for grant in grants[:6]:
        await queue.ack(grant.message_id, grant.token)
    for grant in grants[6:]:
        await queue.fail(grant.message_id, grant.token, "server_error", "503")
    await asyncio.sleep(0.1)  # the policy's 10 ms tier
    again = (await queue.lease("w1", count_max=100, lease_ms=30_000)).grants
    for grant in again:
        await queue.fail(grant.message_id, grant.token, "server_error", "503")  # the last attempt: dead
    dead = [grant.message_id for grant in again]
    await queue.redrive("operator", "downstream fixed", ids=dead[:2])
    await queue.discard(dead[2], "operator", "paid by hand")
    await queue.pause("transfer", "operator", "maintenance", actor="operator")
    await queue.resume("transfer", "operator", actor="operator")


def deduplicated(records: list[ConsumerRecord[bytes, bytes]]) -> dict[int, ConsumerRecord[bytes, bytes]]:
    """The first record of each sequence number, in the order read (each partition in order)."""
    first: dict[int, ConsumerRecord[bytes, bytes]] = {}
    for record in records:
        first.setdefault(int(dict(record.headers)["seq"]), record)
    return first


async def check_topic(queue: QueueClient, records: list[ConsumerRecord[bytes, bytes]], last_seq: int) -> None:
    events: list[Event] = []
    while len(events) < last_seq:
        events += (await queue.events_after(len(events), limit=1000)).value
    first = deduplicated(records)
    assert set(range(1, last_seq + 1)) <= set(first), (
        f"missing seqs: {sorted(set(range(1, last_seq + 1)) - set(first))[:20]}"
    )
    views = {v.message_id: v for v in (await queue.get_many(sorted({e.message_id for e in events if e.message_id}),
                                                            with_history=False)).value}  # fmt: skip
    for event in events[:last_seq]:
        record = first[event.seq]
        value = json.loads(record.value)
        view = views.get(event.message_id)
        assert value == {"v": 1, "set": 1, "seq": event.seq, "log_index": event.log_index, "ts_ms": event.ts_ms,
                         "type": event.type.value, "message_id": event.message_id, "kind": event.kind,
                         "ref_key": view.ref_key if view else None, "data": event.data}  # fmt: skip
        headers = dict(record.headers)
        assert headers["seq"] == str(event.seq).encode() and headers["type"] == event.type.value.encode()
        assert headers["schema"] == SCHEMA.encode()
        assert record.key == (view.ref_key if view else event.kind).encode()
        if view is not None:
            assert headers["traceparent"] == view.headers["traceparent"].encode()
    # in order per ref key: within each key, the first occurrences come in sequence order
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for seq, record in first.items():
        per_key[record.key].append(seq)
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"key {key!r} out of order: {seqs}"


@contextlib.asynccontextmanager
async def publishing(queue: QueueClient, broker: Broker, holder: str, *, lease_ms: int = 3000, batch_max: int = 7,
                     tracer: trace.Tracer | None = None) -> AsyncIterator[tuple[EventPublisher, KafkaMetrics]]:  # fmt: skip
    settings = BrokerSettings(bootstrap_servers=(broker.bootstrap,))
    await ensure_topics(settings, [TOPIC], 3)
    sink = RecordSink(settings)
    metrics = KafkaMetrics()
    lease = PublisherLease(queue, name=TOPIC, holder=holder, lease_ms=lease_ms)
    publisher = EventPublisher(queue, sink, lease, PublisherSettings(topic=TOPIC, batch_max=batch_max, poll_ms=50,
                               lease_ms=lease_ms, retry_ms=100), metrics=metrics, tracer=tracer or trace.NoOpTracer())  # fmt: skip
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
