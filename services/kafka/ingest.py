"""The Kafka ingest: failed requests from a topic into the store, as `POST /v1/requests` would.

One round: poll up to `batch_max` records, build each one's store command (ingest_records.py),
submit the valid ones in one frame and retry until the store answers, send the refused ones to the
rejects topic and retry until the broker acknowledged them, and only then commit the offsets of
everything polled. A crash at any point leaves the offsets where they were, so the records come
again: their keys make the store answer EXISTS (nothing new is created) and at worst a reject is
sent twice (its source coordinates tell the copies apart). A record is never skipped: a record
that cannot be stored goes to the rejects topic with its reason, so a bad record never holds up
its partition either.

Must never: commit an offset before the store acknowledged the records below it, or drop a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from opentelemetry import propagate, trace

from queues import ClientError, Code, Enqueue, EnqueueResult, MessageView, QueueClient, QueueError, Read, SetsClient
from queues.model import ErrorResult, QueueResult
from queues.query_codec import IDS_PER_QUERY_MAX
from services.kafka.broker import SinkError
from services.kafka.ingest_records import Incoming, Rejection, decide, reject_record
from services.kafka.metrics import KafkaMetrics
from services.kafka.publisher import Sink
from submission.rules import HEADER_FINGERPRINT

log = logging.getLogger("compensator.kafka.ingest")
T = TypeVar("T")
A = TypeVar("A")
FRAME_PAYLOAD_BYTES_MAX: Final = 4 * 1024 * 1024
"""Payload bytes per store frame: a poll of large requests goes as several frames."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestSettings:
    topic: str
    rejects_topic: str
    producer: str
    batch_max: int = 500
    body_bytes_max: int = 256 * 1024 + 16 * 1024
    poll_ms: int = 500
    retry_ms: int = 500
    callback_targets: frozenset[str] = frozenset()
    """The registered callback targets (handlers.callback.targets): a callback naming another is rejected."""


class _Stopped(Exception):
    """Asked to stop while a call was being retried: nothing of this round is committed."""


class Ingest:
    def __init__(
        self, queue: QueueClient, consumer: AIOKafkaConsumer, rejects: Sink, settings: IngestSettings, *,
        metrics: KafkaMetrics, tracer: trace.Tracer, clock_ms: Callable[[], int],
        perf_clock_s: Callable[[], float] = time.perf_counter, sets: SetsClient | None = None,
    ) -> None:  # fmt: skip
        self._queue = queue
        self._sets = sets
        self._consumer = consumer
        self._rejects = rejects
        self._settings = settings
        self._metrics = metrics
        self._tracer = tracer
        self._clock_ms = clock_ms
        self._perf = perf_clock_s
        self._lag_labels: set[int] = set()

    async def run(self, stop: asyncio.Event) -> None:
        settings = self._settings
        while not stop.is_set():
            polled = await self._consumer.getmany(timeout_ms=settings.poll_ms, max_records=settings.batch_max)
            records = [record for partition in sorted(polled) for record in polled[partition]]
            if records:
                started_s = self._perf()
                try:
                    await self._round(records, stop)
                except _Stopped:
                    log.info("stopped mid-round: its %d records come again on the next start", len(records))
                    return
                await self._commit(polled)
                self._metrics.ingest_seconds.observe(self._perf() - started_s)
            await self._observe_lag()

    async def _round(self, records: Sequence[ConsumerRecord[bytes, bytes]], stop: asyncio.Event) -> None:
        attributes: dict[str, str | int] = {"messaging.system": "kafka", "messaging.source.name": self._settings.topic,
                      "messaging.batch.message_count": len(records)}  # fmt: skip
        with self._tracer.start_as_current_span("kafka.ingest", kind=trace.SpanKind.CONSUMER, attributes=attributes):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            incoming = [_incoming(record) for record in records]
            now_ms = self._clock_ms()
            decided = [decide(item, producer=self._settings.producer, body_bytes_max=self._settings.body_bytes_max,
                              now_ms=now_ms, trace_headers=carrier, callback_targets=self._settings.callback_targets)
                       for item in incoming]  # fmt: skip
            rejections = {index: d for index, d in enumerate(decided) if isinstance(d, Rejection)}
            commands = {index: d for index, d in enumerate(decided) if isinstance(d, Enqueue)}
            rejections.update(await self._store(commands, stop))
            if rejections:
                reject_records = [reject_record(incoming[index], rejections[index]) for index in sorted(rejections)]
                await self._retrying(stop, "rejects", lambda: self._rejects.send_all(self._settings.rejects_topic,
                                                                                      reject_records))  # fmt: skip
                for rejection in rejections.values():
                    self._metrics.rejects.labels(rejection.reason).inc()
                self._metrics.ingested.labels("rejected").inc(len(rejections))

    async def _store(self, commands: Mapping[int, Enqueue], stop: asyncio.Event) -> dict[int, Rejection]:
        """Submit until the store answered every command; the answers that refuse a record."""
        stamped = {
            index: msgspec.structs.replace(command, request_id=_request_id()) for index, command in commands.items()
        }
        results: dict[int, tuple[int, QueueResult]] = {}
        for chunk in _frames(list(stamped.items())):
            answers = await self._retrying(stop, "store", _bind(self._submit, [c for _, c in chunk]))
            results.update(zip((index for index, _ in chunk), answers, strict=True))
        refused: dict[int, Rejection] = {}
        existing: dict[int, tuple[int, EnqueueResult]] = {}
        created = 0
        for index, (set_id, result) in results.items():
            if isinstance(result, EnqueueResult) and result.code is Code.OK:
                created += 1
            elif isinstance(result, EnqueueResult) and result.code is Code.EXISTS:
                existing[index] = (set_id, result)
            else:
                refused[index] = _refusal(result)
        refused.update(await self._replays(stamped, existing, stop))
        self._metrics.ingested.labels("created").inc(created)
        self._metrics.ingested.labels("existing").inc(len(existing) - len(refused.keys() & existing.keys()))
        return refused

    async def _submit(self, commands: Sequence[Enqueue]) -> list[tuple[int, QueueResult]]:
        """One frame's enqueues, each answered with its set: the home set's alone, or (with sets)
        each in its key's home set, routed as the API routes them (queues/sets/). A set that could
        not be reached fails the whole frame, which is sent again: the request ids stamped once
        make a retry of an applied enqueue answer OK, whichever set applied it."""
        if self._sets is None:
            return [(0, answer) for answer in await self._queue.submit_many(commands)]
        placed = await self._sets.enqueue_many(commands)
        for _, answer in placed:
            if isinstance(answer, (ClientError, QueueError)):
                raise answer
        return [(set_id, answer) for set_id, answer in placed if not isinstance(answer, (ClientError, QueueError))]

    async def _replays(
        self, commands: Mapping[int, Enqueue], existing: Mapping[int, tuple[int, EnqueueResult]], stop: asyncio.Event
    ) -> dict[int, Rejection]:
        """EXISTS is a redelivery (or the same request sent again) when the stored body's
        fingerprint is this one's; another body under the key is refused, as the API does."""
        by_set: dict[int, list[int]] = {}
        for set_id, result in existing.values():
            by_set.setdefault(set_id, []).append(result.message_id)
        stored: dict[tuple[int, int], str | None] = {}
        for set_id, found in by_set.items():
            ids = list(dict.fromkeys(found))
            for start in range(0, len(ids), IDS_PER_QUERY_MAX):
                chunk = ids[start : start + IDS_PER_QUERY_MAX]
                read = await self._retrying(stop, "store", _bind(self._views_in(set_id), chunk))
                stored.update({(set_id, view.message_id): view.headers.get(HEADER_FINGERPRINT) for view in read.value})
        refused: dict[int, Rejection] = {}
        for index, (set_id, result) in existing.items():
            fingerprint = stored.get((set_id, result.message_id), commands[index].headers[HEADER_FINGERPRINT])  # purged: it ended
            if fingerprint != commands[index].headers[HEADER_FINGERPRINT]:
                refused[index] = Rejection(
                    "idempotency-key-reused", "this key was used with a different body; nothing was created"
                )
        return refused

    def _views_in(self, set_id: int) -> Callable[[Sequence[int]], Awaitable[Read[tuple[MessageView, ...]]]]:
        async def views(ids: Sequence[int]) -> Read[tuple[MessageView, ...]]:
            queue = self._queue if self._sets is None else await self._sets.client_of(set_id)
            return await queue.get_many(ids, with_history=False)

        return views

    async def _retrying(self, stop: asyncio.Event, stage: str, call: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await call()
            except (ClientError, QueueError, SinkError) as error:
                if stop.is_set():
                    raise _Stopped from error
                log.warning("%s call failed, retrying: %r", stage, error)
                self._metrics.ingest_retries.labels(stage).inc()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._settings.retry_ms / 1000)

    async def _commit(self, polled: Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]]) -> None:
        offsets = {tp: OffsetAndMetadata(records[-1].offset + 1, "") for tp, records in polled.items() if records}
        try:
            await self._consumer.commit(offsets)
        except KafkaError as error:  # a rebalance took the partition: its new owner reads them again
            log.warning("commit failed (the records come again, harmlessly): %r", error)
            self._metrics.ingest_retries.labels("commit").inc()

    async def _observe_lag(self) -> None:
        assigned = self._consumer.assignment()
        for tp in assigned:
            highwater = self._consumer.highwater(tp)
            if highwater is None:
                continue
            position = await self._consumer.position(tp)
            self._metrics.ingest_lag.labels(tp.topic, str(tp.partition)).set(max(0, highwater - position))
        current = {tp.partition for tp in assigned}
        for partition in self._lag_labels - current:
            with contextlib.suppress(KeyError):
                self._metrics.ingest_lag.remove(self._settings.topic, str(partition))
        self._lag_labels = current


def _bind(call: Callable[[A], Awaitable[T]], argument: A) -> Callable[[], Awaitable[T]]:
    return lambda: call(argument)


def _incoming(record: ConsumerRecord[bytes, bytes]) -> Incoming:
    return Incoming(topic=record.topic, partition=record.partition, offset=record.offset, key=record.key,
                    value=record.value, headers=tuple(record.headers))  # fmt: skip


def _refusal(result: QueueResult) -> Rejection:
    if isinstance(result, EnqueueResult) and result.code is Code.CONFLICT:
        return Rejection("idempotency-key-reused", "this key was used with a different body; nothing was created")
    detail = result.detail if isinstance(result, ErrorResult) else ""
    return Rejection("store-refused", f"the store refused the request: {result.code.name} {detail}".strip())


def _frames(items: list[tuple[int, Enqueue]]) -> list[list[tuple[int, Enqueue]]]:
    frames: list[list[tuple[int, Enqueue]]] = []
    size = 0
    for item in items:
        if not frames or size + len(item[1].payload) > FRAME_PAYLOAD_BYTES_MAX:
            frames.append([])
            size = 0
        frames[-1].append(item)
        size += len(item[1].payload)
    return frames


def _request_id() -> int:
    """Chosen once per command and kept across its retries: the store answers a retry of an
    applied enqueue OK, as its first application did (queues/client.py)."""
    return secrets.randbits(63) or 1
