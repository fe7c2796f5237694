"""One set's share of the projector: its store client, its cursor, and the next batch read from it.

A lane reads on its own (a task the runner starts after each commit): the events after its cursor
(a long poll while the set is caught up, a linearizable read after a full batch), then the facts
they need and their rows. So a set that is down, or has no leader, only leaves its own lane
waiting; the runner writes what the other lanes have ready. A lane never reads past a batch that
is not committed: one batch in flight per set, so its `after` is always the ledger's cursor.

Must never: skip an event (a purged stretch raises ProjectorGap), or guess a fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence

from opentelemetry import trace

from queues import ClientError, LongPoll, QueueClient, RequestRefused
from queues.client import EventsPurged, QueueError, Read
from queues.model import Event
from services.projector.facts import FactsReader
from services.projector.metrics import ProjectorMetrics
from services.projector.rows import BatchRows, facts_needed, fold

log = logging.getLogger(__name__)


class ProjectorGap(RuntimeError):
    """Events the ledger needs were purged from the store before they were projected."""

    def __init__(self, set_id: int, after: int, first_seq: int) -> None:
        super().__init__(
            f"set {set_id}: events {after + 1}..{first_seq - 1} were purged from the store before the ledger"
            f" had them (cursor {after}, oldest event kept {first_seq}); the ledger cannot be completed from"
            " the log: restore it from a backup whose cursor is at least"
            f" {first_seq - 1}, or see docs/ledger.md ('A gap')"
        )
        self.set_id, self.after, self.first_seq = set_id, after, first_seq


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """A lane's next batch, ready to write: its events and their rows (after the lane's cursor)."""

    events: Sequence[Event]
    rows: BatchRows


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaneSettings:
    batch_max: int
    idle_poll_s: float


class SetLane:
    def __init__(
        self, set_id: int, queue: QueueClient, cursor: int, settings: LaneSettings, *, tracer: trace.Tracer,
        metrics: ProjectorMetrics,
    ) -> None:  # fmt: skip
        self.set_id, self.queue, self.cursor = set_id, queue, cursor
        self._settings, self._tracer, self._metrics = settings, tracer, metrics
        self.facts = FactsReader(queue)
        self._applied_seen: int | None = 0
        """The applied index the last read reflected (an idle wait is for one past it); None when
        the store refused a waiting read (a node that predates them): plain polling then."""
        self._caught_up = False
        """The last read returned fewer than `batch_max` events: the store had no more then."""
        self._look_at_lag = False
        """The last batch was full: how far behind the set is is asked before the next read."""
        self.next: asyncio.Task[Batch] | None = None

    def start(self) -> None:
        self.next = asyncio.ensure_future(self._next_batch())

    def cancel(self) -> None:
        if self.next is not None:
            self.next.cancel()
            self.next = None

    def use(self, queue: QueueClient) -> None:
        """The set's client after its addresses changed (the set table re-read): the next read uses it."""
        if queue is not self.queue:
            self.queue, self.facts = queue, FactsReader(queue)

    def committed(self, batch: Batch, now_ms: int) -> None:
        self.cursor = batch.rows.last_seq
        self._metrics.cursor.labels(str(self.set_id)).set(self.cursor)
        self._look_at_lag = len(batch.events) >= self._settings.batch_max
        if self._look_at_lag:  # behind, until the next look says otherwise
            self._metrics.lag_seconds.labels(str(self.set_id)).set(max(0, now_ms - batch.rows.last_ts_ms) / 1000)
        else:
            self._caught_up_now()

    async def _next_batch(self) -> Batch:
        """The next non-empty batch after the cursor, its facts read and its rows folded; a store
        that does not answer is waited out (the read is tried again from the same cursor)."""
        if self._look_at_lag:
            await self._measure_lag()
        while True:
            waited = await self._idle() if self._caught_up else None
            read = waited or await self._read()
            if read is None or not read.value:
                continue
            batch = await self._prepare(read)
            if batch is not None:
                return batch

    async def _read(self) -> Read[tuple[Event, ...]] | None:
        settings = self._settings
        self._caught_up = True
        try:
            read = await self.queue.events_after(self.cursor, limit=settings.batch_max)
        except EventsPurged as gap:
            raise ProjectorGap(self.set_id, gap.after, gap.first_seq) from None
        except (ClientError, QueueError) as error:
            log.warning("set %d: the store did not answer (%s); trying again", self.set_id, error)
            await asyncio.sleep(settings.idle_poll_s)
            return None
        if self._applied_seen is not None:
            self._applied_seen = max(self._applied_seen, read.applied_index)
        self._caught_up = len(read.value) < settings.batch_max
        if not read.value:
            self._caught_up_now()
        return read

    async def _idle(self) -> Read[tuple[Event, ...]] | None:
        """Caught up: wait until the store applies something after what the last read reflected
        (a long poll, a stale read the node holds), at most `idle_poll_s`, and take the events
        after the cursor from its answer (the facts read next are at least as new: facts.py).
        None when the wait ran out with nothing new, or failed: the next read is linearizable
        (which also finds the leader again, were the poll's node a follower cut off from it). An
        idle set costs one held read and one linearizable read per period."""
        settings = self._settings
        if self._applied_seen is None:
            await asyncio.sleep(settings.idle_poll_s)
            return None
        wait = LongPoll(self._applied_seen, settings.idle_poll_s)
        try:
            read = await self.queue.events_after(self.cursor, limit=settings.batch_max, wait=wait)
        except RequestRefused:  # a node that knows no waiting reads: plain polling from now on
            self._applied_seen = None
            return None
        except EventsPurged:  # the linearizable read says so, and stops
            return None
        except (ClientError, QueueError) as error:
            log.warning("set %d: the store did not answer a wait (%s); trying again", self.set_id, error)
            await asyncio.sleep(settings.idle_poll_s)
            return None
        self._applied_seen = max(self._applied_seen, read.applied_index)
        self._caught_up = len(read.value) < settings.batch_max
        return read if read.value else None

    async def _prepare(self, read: Read[tuple[Event, ...]]) -> Batch | None:
        events = read.value
        with self._tracer.start_as_current_span("projector.batch") as span:
            span.set_attributes({"compensator.set_id": self.set_id, "compensator.events": len(events),
                                 "compensator.first_seq": events[0].seq, "compensator.last_seq": events[-1].seq})  # fmt: skip
            try:
                facts = await self.facts.read(facts_needed(events), applied_index=read.applied_index)
            except (ClientError, QueueError) as error:
                log.warning("set %d: the store did not answer (%s); trying again", self.set_id, error)
                self._caught_up = False
                await asyncio.sleep(self._settings.idle_poll_s)
                return None
            return Batch(events, fold(events, set_id=self.set_id, facts=facts))

    def _caught_up_now(self) -> None:
        labels = str(self.set_id)
        self._metrics.lag_events.labels(labels).set(0)
        self._metrics.lag_seconds.labels(labels).set(0)

    async def _measure_lag(self) -> None:
        """After a full batch: how many events the set has beyond the cursor, and how old the
        first of them is (the last committed event's time: the next one is at least that old)."""
        with contextlib.suppress(ClientError, QueueError):
            last = (await self.queue.events_digest(self.cursor, 0)).value.last_seq
            labels = str(self.set_id)
            self._metrics.lag_events.labels(labels).set(max(0, last - self.cursor))
            if last <= self.cursor:
                self._metrics.lag_seconds.labels(labels).set(0)
