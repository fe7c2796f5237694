"""The events publisher: the store's events, in sequence order, to the events topic.

One round: read the events after the cursor (a linearizable read, so a store leader change only
delays it: the client follows the new leader), look up the ref key and trace context of their
messages, send them all, and move the cursor only once the broker acknowledged every record
(acks=all). The cursor is saved in the store with the lease renewals (publisher_lease.py). A
crash, a lost lease or a failed round re-sends from the saved cursor: every event reaches the
topic at least once, and consumers keep the first record of each sequence number.

Must never: move the cursor past an event the broker did not acknowledge, skip an event it could
not place (an event of a type it does not know is published like any other), or go past events
the store purged without being told to (`accept_gap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from opentelemetry import trace

from queues import ClientError, Event, EventsPurged, EventType, QueueClient, QueueError
from queues.query_codec import IDS_PER_QUERY_MAX
from services.kafka.broker import SinkError
from services.kafka.event_records import TRACE_HEADERS, MessageRef, Record, event_record
from services.kafka.metrics import KafkaMetrics
from services.kafka.publisher_lease import PublisherLease

log = logging.getLogger("compensator.kafka.publisher")
RENEWALS_PER_LEASE: Final = 3


class Sink(Protocol):
    async def send_all(self, topic: str, records: Sequence[Record]) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherSettings:
    topic: str
    batch_max: int = 500
    poll_ms: int = 200
    lease_ms: int = 15_000
    retry_ms: int = 500
    refs_cached_max: int = 100_000
    """Messages whose ref key and trace context are remembered (their later events need them)."""
    accept_gap: bool = False
    """Events purged before they were published: go on from the oldest kept (logged) instead of stopping."""
    set_id: int = 1
    """The set whose events these are (`store.set_id`): in every record, since sequence numbers are per set."""


class PublisherError(Exception):
    """The publisher cannot go on without losing events (some were purged unpublished)."""


class MessageRefs:
    """message id -> ref key and trace context, read from the store once per message and kept in
    a bounded LRU: events other than `enqueued` carry only the message id."""

    def __init__(self, queue: QueueClient, entries_max: int) -> None:
        assert entries_max >= IDS_PER_QUERY_MAX
        self._queue = queue
        self._entries_max = entries_max
        self._known: OrderedDict[int, MessageRef] = OrderedDict()

    async def resolve(self, events: Sequence[Event]) -> dict[int, MessageRef]:
        wanted = list(dict.fromkeys(e.message_id for e in events if e.message_id))
        missing = [message_id for message_id in wanted if message_id not in self._known]
        for start in range(0, len(missing), IDS_PER_QUERY_MAX):
            read = await self._queue.get_many(missing[start : start + IDS_PER_QUERY_MAX], with_history=False)
            for view in read.value:
                trace_context: dict[str, str] = {
                    name: view.headers[name] for name in TRACE_HEADERS if name in view.headers
                }
                self._remember(view.message_id, MessageRef(view.ref_key, trace_context))
        for event in events:  # purged since: its enqueued event still names the ref key
            if event.type is EventType.ENQUEUED and event.message_id not in self._known:
                ref_key = event.data.get("ref_key")
                if isinstance(ref_key, str):
                    self._remember(event.message_id, MessageRef(ref_key))
        found: dict[int, MessageRef] = {}
        for message_id in wanted:
            ref = self._known.get(message_id)
            if ref is not None:
                self._known.move_to_end(message_id)
                found[message_id] = ref
        return found

    def _remember(self, message_id: int, ref: MessageRef) -> None:
        self._known[message_id] = ref
        self._known.move_to_end(message_id)
        while len(self._known) > self._entries_max:
            self._known.popitem(last=False)


class EventPublisher:
    def __init__(
        self, queue: QueueClient, sink: Sink, lease: PublisherLease, settings: PublisherSettings, *,
        metrics: KafkaMetrics, tracer: trace.Tracer, clock_s: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._queue = queue
        self._sink = sink
        self._lease = lease
        self._settings = settings
        self._metrics = metrics
        self._tracer = tracer
        self._clock_s = clock_s
        self._refs = MessageRefs(queue, settings.refs_cached_max)
        self._renew_at_s = float("-inf")
        self._renew_every_s = settings.lease_ms / RENEWALS_PER_LEASE / 1000
        self.acked = 0
        """Every event up to this sequence number was acknowledged by the broker (while active)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set, then save the cursor and free the lease for a standby."""
        settings = self._settings
        try:
            while not stop.is_set():
                try:
                    if not await self._hold_lease():
                        await _sleep(stop, self._renew_every_s)
                    elif not await self._publish_renewing():
                        await _sleep(stop, settings.poll_ms / 1000)
                except (ClientError, QueueError) as error:
                    log.warning("store call failed, retrying: %r", error)
                    self._metrics.publish_failures.labels("store").inc()
                    await _sleep(stop, settings.retry_ms / 1000)
                except SinkError as error:
                    log.warning("publishing failed, sending again from seq %d: %s", self.acked + 1, error)
                    self._metrics.publish_failures.labels("broker").inc()
                    await _sleep(stop, settings.retry_ms / 1000)
        finally:
            await self._release()

    async def _hold_lease(self) -> bool:
        now_s = self._clock_s()
        if self._lease.valid and now_s < self._renew_at_s:
            return True
        if self._lease.valid and await self._renew():
            return True
        cursor = await self._lease.acquire()
        self._metrics.publisher_active.set(0 if cursor is None else 1)
        if cursor is None:
            return False
        log.info("%s is the active publisher to %s from seq %d", self._lease.holder, self._settings.topic, cursor + 1)
        self.acked = cursor
        self._metrics.publisher_cursor.set(cursor)
        self._renew_at_s = now_s + self._renew_every_s
        return True

    async def _renew(self) -> bool:
        """Renew the claim now, saving the cursor; False (logged) when it was lost."""
        now_s = self._clock_s()
        if await self._lease.renew(self.acked):
            self._renew_at_s = now_s + self._renew_every_s
            return True
        log.warning("lease lost at seq %d (taken over or run out); standing by", self.acked)
        return False

    async def _publish_renewing(self) -> bool:
        """One round (`_publish_batch`), renewing the claim whenever a renewal falls due while it
        runs: a slow round (a broker electing a partition leader, a store leader change) must not
        let the claim lapse while this publisher still sends, which would hand it to a standby and
        publish the same events from two places. A round still running when the claim is lost is
        abandoned (its events go out again from the saved cursor, never skipped)."""
        round_ = asyncio.ensure_future(self._publish_batch())
        try:
            while True:
                wait_s = max(0.0, self._renew_at_s - self._clock_s())
                done, _ = await asyncio.wait((round_,), timeout=wait_s)
                if done:
                    return round_.result()
                if not await self._renew():
                    return False
        finally:
            if not round_.done():
                round_.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await round_

    async def _publish_batch(self) -> bool:
        """One round; False when there was nothing to publish."""
        try:
            read = await self._queue.events_after(self.acked, limit=self._settings.batch_max)
        except EventsPurged as gap:
            if not self._settings.accept_gap:
                raise PublisherError(
                    f"{gap}: the events topic would miss them (run with --accept-gap to go on)"
                ) from None
            log.error("%s; going on from %d as --accept-gap allows: the events topic misses them", gap, gap.first_seq)
            self.acked = gap.first_seq - 1
            return True
        events = read.value
        if not events:
            self._metrics.publisher_lag_seconds.set(0)
            return False
        self._metrics.publisher_lag_seconds.set(max(0, read.now_ms - events[0].ts_ms) / 1000)
        started_s = self._clock_s()
        attributes: dict[str, str | int] = {"messaging.system": "kafka", "messaging.destination.name": self._settings.topic,
                      "messaging.batch.message_count": len(events), "compensator.seq_first": events[0].seq,
                      "compensator.seq_last": events[-1].seq}  # fmt: skip
        with self._tracer.start_as_current_span("kafka.publish", kind=trace.SpanKind.PRODUCER, attributes=attributes):
            refs = await self._refs.resolve(events)
            records = [event_record(event, refs.get(event.message_id), self._settings.set_id) for event in events]
            await self._sink.send_all(self._settings.topic, records)
        self.acked = events[-1].seq
        self._metrics.publish_seconds.observe(self._clock_s() - started_s)
        self._metrics.publisher_cursor.set(self.acked)
        for event in events:
            self._metrics.published.labels(event.type.value).inc()
        return True

    async def _release(self) -> None:
        self._metrics.publisher_active.set(0)
        try:
            await self._lease.release(self.acked)
        except (ClientError, QueueError) as error:  # the claim expires by itself
            log.warning("could not free the lease (a standby takes over when it expires): %r", error)


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
