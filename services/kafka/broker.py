"""The Kafka side's plumbing: producers as both commands need them, topics, and a sink that sends a
batch of records and answers only once the broker acknowledged every one of them.

Producers use acks=all and no idempotence or transactions (the brokers this runs against need not
have them): delivery is at least once, and each consumer deduplicates (docs/kafka.md).

Must never: report a batch as sent before every record in it was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from services.kafka.event_records import Record

log = logging.getLogger("compensator.kafka")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerSettings:
    bootstrap_servers: tuple[str, ...]
    client_id: str = "compensator"
    request_timeout_ms: int = 30_000


class SinkError(Exception):
    """Some record of a batch was not acknowledged: the batch must be sent again."""


def producer(settings: BrokerSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=list(settings.bootstrap_servers), client_id=settings.client_id, acks="all",
        enable_idempotence=False, request_timeout_ms=settings.request_timeout_ms, linger_ms=5,
    )  # fmt: skip


async def ensure_topics(
    settings: BrokerSettings, topics: Sequence[str], partitions: int, replication_factor: int = 1
) -> None:
    """Create the topics that do not exist yet."""
    admin = AIOKafkaAdminClient(bootstrap_servers=list(settings.bootstrap_servers), client_id=settings.client_id,
                                request_timeout_ms=settings.request_timeout_ms)  # fmt: skip
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor) for name in topics
                   if name not in existing]  # fmt: skip
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another process made it meanwhile
                await admin.create_topics(missing)
            log.info("created topics %s", ", ".join(t.name for t in missing))
    finally:
        await admin.close()


class RecordSink:
    """One producer, replaced after a failed batch so nothing of that batch is still queued when
    it is sent again."""

    def __init__(self, settings: BrokerSettings) -> None:
        self._settings = settings
        self._producer: AIOKafkaProducer | None = None

    async def _ready(self) -> AIOKafkaProducer:
        if self._producer is None:
            made = producer(self._settings)
            try:
                await made.start()
            except KafkaError as error:
                with contextlib.suppress(Exception):
                    await made.stop()
                raise SinkError(f"cannot reach the broker: {error!r}") from error
            self._producer = made
        return self._producer

    async def send_all(self, topic: str, records: Sequence[Record]) -> None:
        """Returns once the broker acknowledged every record; raises SinkError otherwise."""
        if not records:
            return
        sending = await self._ready()
        futures: list[asyncio.Future[object]] = []
        try:
            for record in records:
                futures.append(await sending.send(topic, value=record.value, key=record.key,
                                                  headers=list(record.headers)))  # fmt: skip
        except KafkaError as error:
            await self._discard()
            raise SinkError(f"the producer refused a record: {error!r}") from error
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            await self._discard()
            raise SinkError(f"{len(failed)} of {len(records)} records were not acknowledged: {failed[0]!r}")

    async def _discard(self) -> None:
        made, self._producer = self._producer, None
        if made is not None:
            with contextlib.suppress(Exception):
                await made.stop()

    async def close(self) -> None:
        await self._discard()
