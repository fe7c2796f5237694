"""`compensator kafka-ingest` as a real process against Tansu and the store: killed with -9
mid-stream (twice) and restarted, every valid record is enqueued exactly once, every malformed
one is in the rejects topic with its coordinates, and the offsets end committed.

The records are produced in three parts, the next part only after the kill: the stream is certainly
unfinished at each kill (on a fast host the ingest can otherwise drain all of it between two polls),
and each kill still lands while the ingest works through a part larger than its kill point."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka_support import Broker, kafka_env, read_topic, spawn, stop_process, until

from queues import EventType, QueueClient
from raft_store.testing.inprocess import StoreThread
from services.kafka.broker import BrokerSettings, ensure_topics

pytestmark = pytest.mark.slow

VALID = 400
MALFORMED_EVERY = 33
GROUP = "ingest-test"


def body(index: int) -> bytes:
    return json.dumps(
        {
            "kind": "transfer",
            "ref_key": f"order-{index % 13}",
            "payload": {
                "transfer_id": f"t{index}",
                "payer": "a",
                "payee": "b",
                "amount_minor": 100 + index,
                "currency": "CNY",
            },
        }
    ).encode()


MALFORMED = (b"{not json", json.dumps({"kind": "transfer", "ref_key": "x", "payload": {}}).encode(),
             json.dumps({"kind": "nope", "ref_key": "x", "payload": {}}).encode())  # fmt: skip


PARTS = (range(0, 130), range(130, 270), range(270, VALID))
KILL_AT = (60, 200)  # enqueued count at which each of the first two runs is killed, inside its part


async def produce(bootstrap: str, indexes: range) -> dict[tuple[int, int], str]:
    """The valid records and, between them, malformed ones: the coordinates of each malformed one."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    malformed: dict[tuple[int, int], str] = {}
    try:
        for index in indexes:
            await producer.send("requests", body(index), key=f"r{index}".encode())
            if index % MALFORMED_EVERY == 0:
                bad = MALFORMED[(index // MALFORMED_EVERY) % len(MALFORMED)]
                meta = await (await producer.send("requests", bad, key=f"bad{index}".encode()))
                malformed[(meta.partition, meta.offset)] = (
                    "malformed-body" if bad.startswith(b"{not") else "invalid-request"
                )
        await producer.flush()
    finally:
        await producer.stop()
    return malformed


async def enqueued(queue: QueueClient) -> int:
    return sum((await queue.counts()).value.values())


async def committed(bootstrap: str) -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False)
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition("requests", p)) for p in range(3)}
    finally:
        await consumer.stop()


async def test_ingest_killed_mid_stream_enqueues_every_valid_record_once_and_rejects_the_rest_with_coordinates(
    queue: QueueClient, store: StoreThread, broker: Broker, tmp_path: Path
) -> None:
    await ensure_topics(BrokerSettings(bootstrap_servers=(broker.bootstrap,)), ["requests", "rejects"], 3)
    env = kafka_env(broker.bootstrap, store, ingest_topic="requests", rejects_topic="rejects",
                    ingest_batch_max=10, group_id=GROUP, ingest_producer="orders-kafka")  # fmt: skip
    log = tmp_path / "ingest.log"
    malformed: dict[tuple[int, int], str] = {}
    for part, kill_at in zip(PARTS[:-1], KILL_AT, strict=True):
        assert part.start < kill_at < part.stop
        malformed |= await produce(broker.bootstrap, part)
        process = spawn("kafka-ingest", env, log)
        try:
            await until(lambda kill_at=kill_at: _at_least(queue, kill_at), timeout_s=90, what=f"{kill_at} enqueued")
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        assert await enqueued(queue) <= part.stop
    malformed |= await produce(broker.bootstrap, PARTS[-1])
    process = spawn("kafka-ingest", env, log)
    try:
        await until(lambda: _at_least(queue, VALID), timeout_s=90, what="every valid record enqueued")
        rejects = await read_topic(broker.bootstrap, "rejects", until=len(malformed), timeout_s=60)
        await _wait_committed(broker.bootstrap)
    finally:
        stop_process(process)
    assert process.returncode == 0, log.read_text()[-3000:]
    # every valid record exactly once: one enqueued event per key, and nothing else enqueued
    keys: list[str] = []
    seq = 0
    while events := (await queue.events_after(seq, limit=1000)).value:
        keys += [str(e.data["idempotency_key"]) for e in events if e.type is EventType.ENQUEUED]
        seq = events[-1].seq
    assert sorted(keys) == sorted(f"orders-kafka:r{i}" for i in range(VALID))
    assert await enqueued(queue) == VALID
    # every malformed record in the rejects topic, with its reason and coordinates (a crash may repeat one)
    found = {}
    for record in rejects:
        headers = dict(record.headers)
        assert headers["source-topic"] == b"requests"
        coordinates = (int(headers["source-partition"]), int(headers["source-offset"]))
        found[coordinates] = headers["reject-reason"].decode()
    assert found == malformed
    assert "Traceback" not in log.read_text()


async def _wait_committed(bootstrap: str) -> None:
    ends = await _highwaters(bootstrap)

    async def done() -> bool:
        return await committed(bootstrap) == ends

    await until(done, timeout_s=60, what="offsets committed to the end")


async def _highwaters(bootstrap: str) -> dict[int, int]:
    records = await read_topic(bootstrap, "requests")
    ends: dict[int, int] = {}
    for record in records:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    return ends


async def _at_least(queue: QueueClient, count: int) -> bool:
    return await enqueued(queue) >= count
