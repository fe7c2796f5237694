"""The two Kafka process kinds (services/kafka/): the events publisher (``compensator
events-publish``) and the ingest (``compensator kafka-ingest``), each with its broker clients, its
store client, its tracer and its metrics, from the ``[kafka]`` section.

Run one or more publishers per store set (one is active, the others stand by and take over from the
saved cursor), and as many ingest processes as the requests topic has partitions (they share the
consumer group). SIGTERM or Ctrl-C stops either cleanly: the publisher saves its cursor and frees
its lease; the ingest finishes its round and commits it.

Must never: run anything at import, load a web framework (tests/test_import_rules.py checks), or
print a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from compensator.config import Config
from compensator.shell import ProcessError, Running, Shell
from compensator.store import queue_client, sets_client
from compensator.telemetry import tracer_provider
from compensator.wiring.parts import gc_policy, metrics_address, process_name, wall_clock_ms
from services.kafka.broker import BrokerSettings, RecordSink, ensure_topics
from services.kafka.ingest import Ingest, IngestSettings
from services.kafka.metrics import KafkaMetrics
from services.kafka.publisher import EventPublisher, PublisherError, PublisherSettings
from services.kafka.publisher_lease import LeaseError, PublisherLease

QUIET_UNTIL_REACHED = {"aiokafka": logging.CRITICAL}
"""aiokafka logs a connection failure per retry: until the broker answered, the one line is ours."""


def shell(config: Config, name: str) -> Shell:
    kafka = config.kafka
    return Shell(name=name, metrics=metrics_address(kafka.metrics_host, kafka.metrics_port), quiet=QUIET_UNTIL_REACHED,
                 expected=(PublisherError, LeaseError), gc=gc_policy(config))  # fmt: skip


def _broker(config: Config) -> BrokerSettings:
    kafka = config.kafka
    return BrokerSettings(bootstrap_servers=kafka.bootstrap_servers, client_id=kafka.client_id,
                          request_timeout_ms=kafka.request_timeout_ms)  # fmt: skip


def _unreachable(config: Config, error: KafkaError) -> ProcessError:
    return ProcessError(f"cannot reach the broker at {','.join(config.kafka.bootstrap_servers)}: {error}")


def _broker_reached() -> None:
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


@contextlib.asynccontextmanager
async def publisher_process(config: Config, *, holder: str = "", accept_gap: bool = False) -> AsyncIterator[Running]:
    """`compensator events-publish`: the store's events to the events topic, from the saved cursor."""
    kafka = config.kafka
    holder = holder or process_name()
    broker = _broker(config)
    try:
        if kafka.create_topics:
            await ensure_topics(broker, [kafka.events_topic], kafka.partitions, kafka.replication_factor)
    except KafkaError as error:
        raise _unreachable(config, error) from None
    _broker_reached()
    queue = queue_client(config)
    metrics = KafkaMetrics()
    provider = tracer_provider(config.telemetry, process="events-publish")
    sink = RecordSink(broker)
    lease = PublisherLease(queue, name=kafka.events_topic, holder=holder, lease_ms=kafka.publisher_lease_ms)
    settings = PublisherSettings(topic=kafka.events_topic, batch_max=kafka.publisher_batch_max,
                                 poll_ms=kafka.publisher_poll_ms, lease_ms=kafka.publisher_lease_ms,
                                 accept_gap=accept_gap, set_id=config.store.set_id)  # fmt: skip
    publisher = EventPublisher(queue, sink, lease, settings, metrics=metrics,
                               tracer=provider.get_tracer("compensator.kafka"))  # fmt: skip

    async def run(stop: asyncio.Event) -> int:
        print(f"events publisher {holder} to {kafka.events_topic} running; SIGTERM stops it", flush=True)
        await publisher.run(stop)
        print(f"events publisher {holder} stopped at seq {publisher.acked}", flush=True)
        return 0

    try:
        yield Running(run, registry=metrics.registry)
    finally:
        await sink.close()
        await queue.raft.close()
        provider.shutdown()


@contextlib.asynccontextmanager
async def ingest_process(config: Config) -> AsyncIterator[Running]:
    """`compensator kafka-ingest`: failed requests from the requests topic into the store, validated
    by the same rules as the API's (submission/), the refused ones to the rejects topic."""
    kafka = config.kafka
    broker = _broker(config)
    consumer = AIOKafkaConsumer(
        kafka.ingest_topic, bootstrap_servers=list(kafka.bootstrap_servers), client_id=kafka.client_id,
        group_id=kafka.group_id, enable_auto_commit=False, auto_offset_reset="earliest",
        max_poll_records=kafka.ingest_batch_max, session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms, request_timeout_ms=kafka.request_timeout_ms,
    )  # fmt: skip
    try:
        if kafka.create_topics:
            await ensure_topics(
                broker, [kafka.ingest_topic, kafka.rejects_topic], kafka.partitions, kafka.replication_factor
            )
        await consumer.start()
    except KafkaError as error:
        with contextlib.suppress(Exception):
            await consumer.stop()
        raise _unreachable(config, error) from None
    _broker_reached()
    queue = queue_client(config)
    sets = sets_client(config)  # with store.control_addresses: each record in its key's home set, as the API does
    metrics = KafkaMetrics()
    provider = tracer_provider(config.telemetry, process="kafka-ingest")
    rejects = RecordSink(broker)
    settings = IngestSettings(topic=kafka.ingest_topic, rejects_topic=kafka.rejects_topic,
                              producer=kafka.ingest_producer, batch_max=kafka.ingest_batch_max,
                              body_bytes_max=kafka.body_bytes_max,
                              callback_targets=frozenset(t.name for t in config.handlers.callback.targets))  # fmt: skip
    ingest = Ingest(queue, consumer, rejects, settings, metrics=metrics,
                    tracer=provider.get_tracer("compensator.kafka"), clock_ms=wall_clock_ms, sets=sets)  # fmt: skip

    async def run(stop: asyncio.Event) -> int:
        print(f"kafka ingest from {kafka.ingest_topic} as {kafka.ingest_producer} running; SIGTERM stops it",
              flush=True)  # fmt: skip
        await ingest.run(stop)
        print("kafka ingest stopped", flush=True)
        return 0

    try:
        yield Running(run, registry=metrics.registry)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        await rejects.close()
        await queue.raft.close()
        if sets is not None:
            await sets.close()
        provider.shutdown()
