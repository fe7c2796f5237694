"""The ingest over several sets (docs/sets.md): each record goes to its key's home set, routed as
the API routes it, so a key sent through Kafka and through the API lands in one set only; a
redelivery is answered from that set and a key reused with another body is refused there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from kafka_support import Broker, read_topic, requests_to_ingest, until
from opentelemetry.sdk.trace import TracerProvider
from test_ingest import body

from queues import ControlSet, QueueClient, RaftClient, SetsClient
from queues.replicated import machine_factory
from queues.sets import routing, table
from raft_store.testing.inprocess import StoreThread, running_store
from services.kafka.broker import BrokerSettings, RecordSink, ensure_topics
from services.kafka.ingest import Ingest, IngestSettings
from services.kafka.metrics import KafkaMetrics

GROUP = "ingest-sets"


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-3, each a started one-node store."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_store(tmp_path / f"set{s}", machine_factory)) for s in range(4)}


def _client(thread: StoreThread) -> QueueClient:
    return QueueClient(RaftClient([thread.address], auth=thread.auth, deadline_s=5))


async def test_each_record_lands_in_its_keys_set_and_replays_and_reuse_are_judged_there(
    stores: dict[int, StoreThread], broker: Broker
) -> None:
    by_address = {thread.addresses: thread for thread in stores.values()}
    control = ControlSet(_client(stores[0]))
    first = table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)})
    await control.write(first, expected_version=0, actor="test", reason="init")
    sets = SetsClient.lazy(control, connect=lambda _set_id, addresses: _client(by_address[addresses[0]]))
    settings = BrokerSettings(bootstrap_servers=(broker.bootstrap,))
    await ensure_topics(settings, ["requests", "rejects"], 1)
    keys = [f"k{n}" for n in range(30)]
    sent = [(key.encode(), body(f"t-{key}")) for key in keys]
    sent += [(b"k1", body("t-k1")), (b"k2", body("t-k2", 999))]  # a redelivery, a key reused with another body
    consumer = await requests_to_ingest(broker.bootstrap, sent, GROUP)
    metrics = KafkaMetrics()
    rejects = RecordSink(settings)
    home = _client(stores[1])
    ingest = Ingest(home, consumer, rejects, IngestSettings(topic="requests", rejects_topic="rejects", producer="feed",
                    batch_max=8, poll_ms=100), metrics=metrics, tracer=TracerProvider().get_tracer("test"),
                    clock_ms=lambda: time.time_ns() // 1_000_000, sets=sets)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))

    async def committed() -> bool:
        return await consumer.committed(TopicPartition("requests", 0)) == len(sent)

    try:
        await until(committed, what="every record committed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await consumer.stop()
        await rejects.close()
    epoch = first.newest_active()
    try:
        for set_id in (1, 2, 3):
            queue = await sets.client_of(set_id)
            held = {m.idempotency_key for m in (await queue.by_idempotency_keys([f"feed:{k}" for k in keys])).value}
            assert held == {f"feed:{k}" for k in keys if routing.candidate(f"feed:{k}", epoch) == set_id}, set_id
            assert held  # 30 keys over 3 sets: each holds some
    finally:
        await sets.close()
        await home.raft.close()
    rejected = await read_topic(broker.bootstrap, "rejects", until=1, timeout_s=30)
    assert [dict(r.headers)["reject-reason"] for r in rejected] == [b"idempotency-key-reused"]
    outcomes = {o: metrics.ingested.labels(o)._value.get() for o in ("created", "existing", "rejected")}
    assert outcomes == {"created": 30, "existing": 1, "rejected": 1}
