"""``compensator events-publish`` and ``compensator kafka-ingest``: the two Kafka processes.

Run one or more publishers per store set (one is active, the others stand by and take over from
the saved cursor), and as many ingest processes as the requests topic has partitions (they share
the consumer group). SIGTERM or Ctrl-C stops either cleanly: the publisher saves its cursor and
frees its lease; the ingest finishes its round and commits it.

Must never: start on a configuration that did not validate, or print a secret.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from compensator.api_server import add_config_argument, load
from compensator.config import Config


class KafkaCommandError(ValueError):
    """The broker or the store cannot be used as configured, or the publisher cannot go on: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    publish = subparsers.add_parser("events-publish", help="publish the store's events to the Kafka events topic")
    add_config_argument(publish)
    publish.add_argument("--holder", default="", help="this publisher's name in its lease (default host:pid)")
    publish.add_argument(
        "--accept-gap",
        action="store_true",
        help="go on past events purged before they were published (logged), instead of stopping",
    )
    publish.set_defaults(handler=publish_events)
    ingest = subparsers.add_parser("kafka-ingest", help="ingest failed requests from a Kafka topic into the store")
    add_config_argument(ingest)
    ingest.set_defaults(handler=ingest_requests)


def publish_events(args: argparse.Namespace) -> int:
    config = load(args)
    _logging()
    holder = args.holder or f"{socket.gethostname()}:{os.getpid()}"
    return asyncio.run(_publish(config, holder, args.accept_gap))


def ingest_requests(args: argparse.Namespace) -> int:
    config = load(args)
    _logging()
    return asyncio.run(_ingest(config))


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # until the broker answered: one line if it does not


def _broker_reached() -> None:
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def _metrics_server(config: Config, registry: Any) -> AsyncIterator[None]:
    server = None
    if config.kafka.metrics_port:
        from prometheus_client import start_http_server

        server, _ = start_http_server(config.kafka.metrics_port, config.kafka.metrics_host, registry=registry)
    try:
        yield
    finally:
        if server is not None:
            server.shutdown()


async def _publish(config: Config, holder: str, accept_gap: bool) -> int:
    from aiokafka.errors import KafkaError

    from compensator.kafka.broker import RecordSink, ensure_topics
    from compensator.kafka.metrics import KafkaMetrics
    from compensator.kafka.publisher import EventPublisher, PublisherError, PublisherSettings
    from compensator.kafka.publisher_lease import LeaseError, PublisherLease
    from compensator.store import queue_client
    from compensator.telemetry import tracer_provider

    kafka = config.kafka
    broker = _broker(config)
    try:
        if kafka.create_topics:
            await ensure_topics(broker, [kafka.events_topic], kafka.partitions, kafka.replication_factor)
    except KafkaError as error:
        raise KafkaCommandError(f"cannot reach the broker at {','.join(kafka.bootstrap_servers)}: {error}") from None
    _broker_reached()
    queue = queue_client(config)
    metrics = KafkaMetrics()
    provider = tracer_provider(config.telemetry, process="events-publish")
    sink = RecordSink(broker)
    lease = PublisherLease(queue, name=kafka.events_topic, holder=holder, lease_ms=kafka.publisher_lease_ms)
    settings = PublisherSettings(topic=kafka.events_topic, batch_max=kafka.publisher_batch_max,
                                 poll_ms=kafka.publisher_poll_ms, lease_ms=kafka.publisher_lease_ms,
                                 accept_gap=accept_gap)  # fmt: skip
    publisher = EventPublisher(queue, sink, lease, settings, metrics=metrics,
                               tracer=provider.get_tracer("compensator.kafka"))  # fmt: skip
    try:
        with _stop_on_signals() as stop:
            async with _metrics_server(config, metrics.registry):
                print(f"events publisher {holder} to {kafka.events_topic} running; SIGTERM stops it", flush=True)
                await publisher.run(stop)
        print(f"events publisher {holder} stopped at seq {publisher.acked}", flush=True)
        return 0
    except (PublisherError, LeaseError) as error:
        raise KafkaCommandError(str(error)) from None
    finally:
        await sink.close()
        await queue.raft.close()
        provider.shutdown()


async def _ingest(config: Config) -> int:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    from compensator.kafka.broker import RecordSink, ensure_topics
    from compensator.kafka.ingest import Ingest, IngestSettings
    from compensator.kafka.metrics import KafkaMetrics
    from compensator.store import queue_client
    from compensator.telemetry import tracer_provider

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
        raise KafkaCommandError(f"cannot reach the broker at {','.join(kafka.bootstrap_servers)}: {error}") from None
    _broker_reached()
    queue = queue_client(config)
    metrics = KafkaMetrics()
    provider = tracer_provider(config.telemetry, process="kafka-ingest")
    rejects = RecordSink(broker)
    settings = IngestSettings(topic=kafka.ingest_topic, rejects_topic=kafka.rejects_topic,
                              producer=kafka.ingest_producer, batch_max=kafka.ingest_batch_max,
                              body_bytes_max=kafka.body_bytes_max,
                              callback_targets=frozenset(t.name for t in config.handlers.callback.targets))  # fmt: skip
    ingest = Ingest(queue, consumer, rejects, settings, metrics=metrics, tracer=provider.get_tracer("compensator.kafka"),
                    clock_ms=lambda: time.time_ns() // 1_000_000)  # fmt: skip
    try:
        with _stop_on_signals() as stop:
            async with _metrics_server(config, metrics.registry):
                print(f"kafka ingest from {kafka.ingest_topic} as {kafka.ingest_producer} running; SIGTERM stops it",
                      flush=True)  # fmt: skip
                await ingest.run(stop)
        print("kafka ingest stopped", flush=True)
        return 0
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        await rejects.close()
        await queue.raft.close()
        provider.shutdown()


def _broker(config: Config) -> Any:
    from compensator.kafka.broker import BrokerSettings

    kafka = config.kafka
    return BrokerSettings(bootstrap_servers=kafka.bootstrap_servers, client_id=kafka.client_id,
                          request_timeout_ms=kafka.request_timeout_ms)  # fmt: skip
