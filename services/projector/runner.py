"""The projector's loop: follow one set's committed event log and write the compensation ledger.

One step: read up to `batch_max` events after the cursor, read the facts they need (at least as
new as the events: facts.py), fold them into row changes, and write the rows
and the new cursor in one transaction (ledger_writer.py). Then again while batches come back full;
caught up, a long poll (at most `idle_poll_s`) whose answer is the next batch's events.

Stopping: `stop` is looked at between steps, so SIGTERM ends the process after the transaction in
progress commits (or never began). A store that does not answer is waited out (the next step
reads from the same cursor); a lost PostgreSQL connection loses the lock with it, so the projector
reconnects and queues for the lock again like a standby. What must stop it, with one line saying
why and what to do: a gap in the log (events purged before they were projected), a message the
batch needs already purged, the ledger disagreeing with the log, or the cursor moved by another.

Must never: skip an event, or write a batch without holding the set's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import asyncpg
from opentelemetry import trace

from queues import ClientError, LongPoll, QueueClient, RequestRefused
from queues.client import EventsPurged, QueueError, Read
from queues.model import Event
from queues.query_codec import EVENTS_LIMIT_MAX
from services.projector import ledger_writer
from services.projector.facts import FactsReader
from services.projector.metrics import ProjectorMetrics
from services.projector.rows import BatchRows, facts_needed, fold

log = logging.getLogger(__name__)

CONNECTION_ERRORS = (
    OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InternalClientError,
)  # fmt: skip
"""PostgreSQL went away: its session (and the lock) with it. Reconnect and queue for the lock again.
A session ended by the server (pg_terminate_backend, a restart) shows as an operator intervention,
or, when it ends while the client is between operations, as a protocol left mid-state
(InternalClientError "another operation is in progress"): either way the connection is gone, and
the cursor read again under the lock keeps the ledger exact."""


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProjectorSettings:
    set_id: int
    owner: str
    """Who writes (host:pid): recorded in the cursor row, for people."""
    batch_max: int = 1000
    idle_poll_s: float = 1.0
    """A caught-up projector's wait for new events is held this long at most (a long poll: the
    store answers it at its next apply, so a longer wait costs no lag, only fewer reads)."""
    standby_poll_s: float = 1.0
    """A standby tries to take the set's lock this often."""

    def validate(self) -> None:
        if not 1 <= self.batch_max <= min(1000, EVENTS_LIMIT_MAX):
            raise ValueError("batch_max must be in 1..1000 (one query's ids)")
        if not 0 < self.idle_poll_s <= 60 or not 0 < self.standby_poll_s <= 60:
            raise ValueError("idle_poll_s and standby_poll_s must be in (0, 60]")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Projector:
    def __init__(
        self, queue: QueueClient, dsn: str, settings: ProjectorSettings, *, tracer: trace.Tracer,
        metrics: ProjectorMetrics, clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:  # fmt: skip
        settings.validate()
        self._queue, self._dsn, self._settings = queue, dsn, settings
        self._tracer, self.metrics, self._clock_ms = tracer, metrics, clock_ms
        self._facts = FactsReader(queue)
        self.projected = 0
        """Events this process wrote to the ledger."""
        self.cursor: int | None = None
        """The last seq in the ledger as this process knows it (None until it holds the lock)."""
        self._applied_seen: int | None = 0
        """The applied index the last read reflected (an idle wait is for one past it); None when
        the store refused a waiting read (a node that predates them): plain polling then."""
        self._caught_up = False
        """The last read returned fewer than `batch_max` events: the store had no more then."""

    @property
    def queue(self) -> QueueClient:
        return self._queue

    async def run(self, stop: asyncio.Event) -> None:
        """Project until `stop` is set; raise on what must not be skipped (see the module doc)."""
        while not stop.is_set():
            try:
                await self._session(stop)
            except CONNECTION_ERRORS as error:
                log.warning("set %d: lost PostgreSQL (%s); reconnecting", self._settings.set_id, error)
                self.cursor = None
                await _wait(stop, self._settings.standby_poll_s)

    async def _session(self, stop: asyncio.Event) -> None:
        connection = await asyncpg.connect(self._dsn)
        try:
            if not await self._acquire(connection, stop):
                return
            self.metrics.active.set(1)
            after = await ledger_writer.cursor(connection, self._settings.set_id)
            self.cursor = after
            log.info("set %d: projecting from event %d", self._settings.set_id, after + 1)
            waited: Read[tuple[Event, ...]] | None = None
            while not stop.is_set():
                written = await self._step(connection, after, waited)
                if written is not None:
                    after = self.cursor = written
                # Caught up (nothing new, or a batch short of batch_max: the store had no more):
                # the long poll's answer carries the next events, so a set under light load costs
                # one held read per batch, not a wake-up and two linearizable reads.
                waited = await self._idle(stop, after) if written is None or self._caught_up else None
        finally:
            self.metrics.active.set(0)
            with contextlib.suppress(*CONNECTION_ERRORS, TimeoutError):
                await asyncio.wait_for(connection.close(), 5)
            if not connection.is_closed():
                connection.terminate()

    async def _acquire(self, connection: asyncpg.Connection, stop: asyncio.Event) -> bool:
        told = False
        while not stop.is_set():
            if await ledger_writer.try_lock(connection, self._settings.set_id):
                if told:
                    log.info("set %d: took over as the active projector", self._settings.set_id)
                return True
            if not told:
                log.info("set %d: another projector is active; standing by", self._settings.set_id)
                told = True
            await _wait(stop, self._settings.standby_poll_s)
        return False

    async def _idle(self, stop: asyncio.Event, after: int) -> Read[tuple[Event, ...]] | None:
        """Caught up: wait until the store applies something after what the last read reflected
        (a long poll, a stale read the node holds), at most `idle_poll_s`, and take the events
        after `after` from its answer: the next step projects them without reading again (the
        facts it reads are at least as new: facts.py). None when the wait ran out with
        nothing new, or failed: the next step then reads linearizably (which also finds the
        leader again, were the poll's node a follower cut off from it). An idle set costs one held
        read and one linearizable read per period."""
        if self._applied_seen is None:
            await _wait(stop, self._settings.idle_poll_s)
            return None
        settings = self._settings
        wait = LongPoll(self._applied_seen, settings.idle_poll_s)
        poll = asyncio.ensure_future(self._queue.events_after(after, limit=settings.batch_max, wait=wait))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((poll, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not poll.done():
            poll.cancel()  # stopping: the node answers it when it runs out; the answer is dropped
            return None
        try:
            read = poll.result()
        except RequestRefused:  # a node that knows no waiting reads: plain polling from now on
            self._applied_seen = None
            return None
        except EventsPurged:  # the next step's linearizable read says so, and stops
            return None
        except (ClientError, QueueError) as error:
            log.warning("set %d: the store did not answer a wait (%s); trying again", settings.set_id, error)
            await _wait(stop, settings.idle_poll_s)
            return None
        return read if read.value else None

    async def _step(self, connection: asyncpg.Connection, after: int, waited: Read[tuple[Event, ...]] | None) -> int | None:
        """Project one batch after `after` (`waited`: a long poll's answer, else read now); its last
        seq, or None when there was nothing new (or the store did not answer: the next step tries
        again from the same cursor)."""
        settings = self._settings
        self._caught_up = True
        try:
            read = waited or await self._queue.events_after(after, limit=settings.batch_max)
            events = read.value
            if self._applied_seen is not None:
                self._applied_seen = max(self._applied_seen, read.applied_index)
            self._caught_up = len(events) < settings.batch_max
            if not events:
                self.metrics.lag_events.set(0)
                self.metrics.lag_seconds.set(0)
                return None
            with self._tracer.start_as_current_span("projector.batch") as span:
                span.set_attributes({"compensator.set_id": settings.set_id, "compensator.events": len(events),
                                     "compensator.first_seq": events[0].seq, "compensator.last_seq": events[-1].seq})  # fmt: skip
                facts = await self._facts.read(facts_needed(events), applied_index=read.applied_index)
                rows = fold(events, set_id=settings.set_id, facts=facts)
                started = time.perf_counter()
                await ledger_writer.write_batch(connection, set_id=settings.set_id, after=after, rows=rows,
                                                owner=settings.owner)  # fmt: skip
                self.metrics.batch_seconds.observe(time.perf_counter() - started)
        except EventsPurged as gap:
            raise ProjectorGap(settings.set_id, gap.after, gap.first_seq) from None
        except (ClientError, QueueError) as error:
            log.warning("set %d: the store did not answer (%s); trying again", settings.set_id, error)
            return None
        await self._count(events, rows)
        return rows.last_seq

    async def _count(self, events: Sequence[Event], rows: BatchRows) -> None:
        metrics, now_ms = self.metrics, self._clock_ms()
        self.projected += len(events)
        metrics.batches.inc()
        metrics.cursor.set(rows.last_seq)
        by_type: dict[str, int] = {}
        for event in events:
            by_type[event.type.value] = by_type.get(event.type.value, 0) + 1
            metrics.event_lag_seconds.observe(max(0, now_ms - event.ts_ms) / 1000)
        for name, count in by_type.items():
            metrics.events.labels(name).inc(count)
        unreadable = self._facts.unreadable_payloads
        if unreadable:
            metrics.unreadable_payloads.inc(unreadable)
            self._facts.unreadable_payloads = 0
        if len(events) < self._settings.batch_max:
            metrics.lag_events.set(0)
            metrics.lag_seconds.set(0)
            return
        with contextlib.suppress(ClientError, QueueError):
            last = (await self._queue.events_digest(rows.last_seq, 0)).value.last_seq
            metrics.lag_events.set(max(0, last - rows.last_seq))
            metrics.lag_seconds.set(max(0, now_ms - rows.last_ts_ms) / 1000 if last > rows.last_seq else 0)


async def rebuild(queue: QueueClient, dsn: str, set_id: int) -> int:
    """Empty the set's ledger and reset its cursor, so that the next run writes it again from the
    log's first event. Refused while another projector is active, or when the store no longer has
    the log's first event (the rebuilt ledger would have the same gap). Returns requests deleted."""
    first_seq = (await queue.events_digest(0, 0)).value.first_seq
    if first_seq > 1:
        raise ProjectorGap(set_id, 0, first_seq)
    connection = await asyncpg.connect(dsn)
    try:
        if not await ledger_writer.try_lock(connection, set_id):
            raise RebuildRefused(f"set {set_id}: another projector is active; stop it before a rebuild")
        return await ledger_writer.rebuild(connection, set_id)
    finally:
        await connection.close()


class RebuildRefused(RuntimeError):
    """A rebuild would race the active projector."""


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
