"""The projector's loop: follow every set's committed event log and write the compensation ledger.

Every set the process knows (one, `store.set_id`'s; or with a control set every set of its table,
re-read every `discover_every_s`, so a set added later is projected too) has a lane (lane.py) that
reads its next batch on its own. A round writes every lane's ready batch, each set's rows and each
set's cursor move, in one PostgreSQL transaction (ledger_writer.write_round), then starts those
lanes' next reads. A lane still waiting (its set caught up, down, or without a leader) is not in the
round: it joins a later one, and holds up no other set.

Each set has its own advisory lock, taken by whichever projector process gets it first and tried
again every `standby_poll_s` for the sets this process does not hold: a second process is a
standby for every set, and two processes started together may split the sets between them; when
one dies (its PostgreSQL session, and its locks, with it) the other takes its sets over from
their committed cursors.

Stopping: `stop` is looked at between rounds, so SIGTERM ends the process after the transaction in
progress commits (or never began). A lost PostgreSQL connection loses every lock with it, so the
projector reconnects and queues for the locks again like a standby.

What must stop a set's projection, with one line saying why and what to do: a gap in its log
(events purged before they were projected), a message a batch needs already purged, the ledger
disagreeing with the log, or its cursor moved by another. It stops that set only, as losing a
set's majority does: the lane is stopped (its cursor where it was, nothing of its batch written:
a round it was in is rolled back and written again without it), the line logged once, the stop
recorded in the set's cursor row (`compensator status`) and in `compensator_projector_lane_stopped`,
and the other sets go on. The stopped set's lock stays held, so a standby does not take it over
only to stop on the same gap, again and again; a restart after the fix releases it. When every set
this process knows is stopped there is nothing left for it to do: it ends with the stop's line
(one set: exactly as before this existed) or one line for all of them.

Must never: skip an event, or write a set's batch without holding that set's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import asyncpg
from opentelemetry import trace

from queues import QueueClient
from queues.query_codec import EVENTS_LIMIT_MAX
from services.projector import ledger_writer
from services.projector.lane import Batch, LaneSettings, ProjectorGap, SetLane
from services.projector.metrics import ProjectorMetrics
from services.projector.rows import ProjectionError

log = logging.getLogger(__name__)

__all__ = [
    "CONNECTION_ERRORS", "EveryLaneStopped", "Projector", "ProjectorGap", "ProjectorSettings", "RebuildRefused", "rebuild",
]  # fmt: skip

LANE_STOPS = (ProjectorGap, ProjectionError)
"""What a lane's read raises that stops its set's projection (the writer's are `SetStopped`)."""

CONNECTION_ERRORS = (
    OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InternalClientError,
)  # fmt: skip
"""PostgreSQL went away: its session (and the locks) with it. Reconnect and queue for the locks again.
A session ended by the server (pg_terminate_backend, a restart) shows as an operator intervention,
or, when it ends while the client is between operations, as a protocol left mid-state
(InternalClientError "another operation is in progress"): either way the connection is gone, and
the cursors read again under the locks keep the ledger exact."""

Discover = Callable[[], Awaitable[Mapping[int, QueueClient]]]
"""The sets of the table as re-read now (the cached ones when the control set does not answer)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProjectorSettings:
    owner: str
    """Who writes (host:pid): recorded in the cursor rows, for people."""
    batch_max: int = 1000
    """Events of one set in one round at most."""
    idle_poll_s: float = 1.0
    """A caught-up set's wait for new events is held this long at most (a long poll: the store
    answers it at its next apply, so a longer wait costs no lag, only fewer reads)."""
    standby_poll_s: float = 1.0
    """The locks of the sets this process does not hold are tried this often."""
    discover_every_s: float = 30.0
    """The set table is re-read this often (with a control set), so a set added later is projected."""
    round_gather_s: float = 0.0
    """With several sets held: once one lane's batch is ready, the others' are waited for this long
    at most, so that a round carries every busy set's batch (one transaction for them all rather
    than one each). 0: a round takes what is ready when the first is."""

    def validate(self) -> None:
        if not 1 <= self.batch_max <= min(1000, EVENTS_LIMIT_MAX):
            raise ValueError("batch_max must be in 1..1000 (one query's ids)")
        if not 0 < self.idle_poll_s <= 60 or not 0 < self.standby_poll_s <= 60:
            raise ValueError("idle_poll_s and standby_poll_s must be in (0, 60]")
        if not 0 <= self.round_gather_s <= 1:
            raise ValueError("round_gather_s must be in [0, 1]")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Projector:
    def __init__(
        self, sets: Mapping[int, QueueClient], dsn: str, settings: ProjectorSettings, *, tracer: trace.Tracer,
        metrics: ProjectorMetrics, clock_ms: Callable[[], int] = wall_clock_ms, discover: Discover | None = None,
    ) -> None:  # fmt: skip
        settings.validate()
        self.sets = dict(sets)
        """Every set's client this process projects (or stands by for), by id."""
        self._dsn, self._settings, self._discover = dsn, settings, discover
        self._tracer, self.metrics, self._clock_ms = tracer, metrics, clock_ms
        self._lane_settings = LaneSettings(batch_max=settings.batch_max, idle_poll_s=settings.idle_poll_s)
        self.lanes: dict[int, SetLane] = {}
        """The sets whose lock this process holds (their cursors: the ledger's as it knows them)."""
        self.projected = 0
        """Events this process wrote to the ledger."""
        self.rounds = 0
        """Transactions this process committed (each with one batch of one set or more)."""
        self._lock_tried_at = self._discovered_at = float("-inf")
        self._standing_by: set[int] = set()
        self.stopped: dict[int, str] = {}
        """Sets whose projection stopped, and the line that says why: never projected again by this
        process (a restart after the fix is), their locks kept (taken again after a reconnect)."""

    @property
    def cursor(self) -> int | None:
        """With one set: its last seq in the ledger as this process knows it (None until it holds
        the set's lock). With several: the lowest set's it holds (see `cursors`)."""
        return self.lanes[min(self.lanes)].cursor if self.lanes else None

    @property
    def cursors(self) -> dict[int, int]:
        return {set_id: lane.cursor for set_id, lane in sorted(self.lanes.items())}

    async def run(self, stop: asyncio.Event) -> None:
        """Project until `stop` is set; raise on what must not be skipped (see the module doc)."""
        while not stop.is_set():
            try:
                await self._session(stop)
            except CONNECTION_ERRORS as error:
                log.warning("lost PostgreSQL (%s); reconnecting", error)
                self.lanes.clear()  # every lock went with the session
                await _wait(stop, self._settings.standby_poll_s)

    async def _session(self, stop: asyncio.Event) -> None:
        connection = await asyncpg.connect(self._dsn)
        self._lock_tried_at = float("-inf")
        self.lanes.clear()
        try:
            while not stop.is_set():
                await self._take_locks(connection)
                ready = await self._ready(stop)
                if ready:
                    await self._write(connection, ready)
        finally:
            for set_id, lane in self.lanes.items():  # their cursors stay known (the last committed)
                lane.cancel()
                self.metrics.active.labels(str(set_id)).set(0)
            with contextlib.suppress(*CONNECTION_ERRORS, TimeoutError):
                await asyncio.wait_for(connection.close(), 5)
            if not connection.is_closed():
                connection.terminate()

    async def _take_locks(self, connection: asyncpg.Connection) -> None:
        """Every `standby_poll_s`: the lock of each set this process does not hold, tried (with a
        control set, the table re-read first when due, so a set added later is tried too)."""
        now = time.monotonic()
        if self._discover is not None and now - self._discovered_at >= self._settings.discover_every_s:
            self._discovered_at = now
            self.sets = dict(await self._discover())
            for set_id, lane in self.lanes.items():
                if set_id in self.sets:
                    lane.use(self.sets[set_id])
        free = sorted(set(self.sets) - set(self.lanes))
        if not free or now - self._lock_tried_at < self._settings.standby_poll_s:
            return
        self._lock_tried_at = now
        for set_id in free:
            if not await ledger_writer.try_lock(connection, set_id):
                if set_id not in self._standing_by:
                    log.info("set %d: another projector is active; standing by", set_id)
                    self._standing_by.add(set_id)
                continue
            if set_id in self._standing_by:
                log.info("set %d: took over as the active projector", set_id)
                self._standing_by.discard(set_id)
            after = await ledger_writer.cursor(connection, set_id)
            lane = self.lanes[set_id] = SetLane(set_id, self.sets[set_id], after, self._lane_settings,
                                                tracer=self._tracer, metrics=self.metrics)  # fmt: skip
            self.metrics.active.labels(str(set_id)).set(1)
            self.metrics.cursor.labels(str(set_id)).set(after)
            if set_id in self.stopped:  # held again after a reconnect, still stopped
                await ledger_writer.mark_stopped(connection, set_id, self.stopped[set_id])
                continue
            await ledger_writer.mark_stopped(connection, set_id, None)
            self.metrics.lane_stopped.labels(str(set_id)).set(0)
            log.info("set %d: projecting from event %d", set_id, after + 1)
            lane.start()

    async def _ready(self, stop: asyncio.Event) -> list[SetLane]:
        """The lanes with a batch ready, once one has (or the locks are due again, or stopping)."""
        waiting = {lane.next: lane for lane in self.lanes.values() if lane.next is not None}
        timeout = None
        if set(self.sets) - set(self.lanes) or self._discover is not None:
            timeout = self._settings.standby_poll_s
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((*waiting, stopping), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            pending = [task for task in waiting if not task.done()]
            if self._settings.round_gather_s and pending and len(pending) < len(waiting) and not stop.is_set():
                # One is ready: the busy sets' batches are a few milliseconds behind it (their
                # long polls answer at their next apply); wait for them, not for an idle set's poll.
                await asyncio.wait(pending, timeout=self._settings.round_gather_s, return_when=asyncio.ALL_COMPLETED)
        finally:
            stopping.cancel()
        return [lane for task, lane in waiting.items() if task.done()]

    async def _write(self, connection: asyncpg.Connection, ready: list[SetLane]) -> None:
        """One transaction: every ready lane's batch and cursor. A lane whose read stopped on a gap
        (or a fact gone) is stopped and not in it; a set the writer refuses fails the transaction,
        is stopped, and the round is written again without it."""
        batches: dict[int, Batch] = {}
        for lane in ready:
            if lane.next is None:
                continue
            error = lane.next.exception()
            if isinstance(error, LANE_STOPS):
                await self._stop(connection, lane.set_id, error)
            else:
                batches[lane.set_id] = lane.next.result()  # anything else is raised, as before
        while batches:
            try:
                await self._write_round(connection, batches)
                return
            except ledger_writer.SetStopped as refused:
                if refused.set_id not in batches:
                    raise
                del batches[refused.set_id]
                await self._stop(connection, refused.set_id, refused)

    async def _stop(self, connection: asyncpg.Connection, set_id: int, error: Exception) -> None:
        """Stop the set's projection: its lane reads no more, its cursor stays where it is, the line
        is logged once and recorded in its cursor row; its lock stays held. Raised instead when no
        set is left for this process (one set: the error itself, as before)."""
        lane = self.lanes[set_id]
        lane.cancel()
        reason = str(error)
        prefix = f"set {set_id}: "
        line = f"set {set_id}: projection stopped at event {lane.cursor}: {reason.removeprefix(prefix)}"
        self.stopped[set_id] = line
        self.metrics.lane_stopped.labels(str(set_id)).set(1)
        last = set(self.sets) <= set(self.stopped)
        if not last:
            log.error("%s; the other sets go on; this set's lock stays held until the projector restarts"
                      " (docs/ledger.md, 'One set stopped')", line)  # fmt: skip
        try:
            await ledger_writer.mark_stopped(connection, set_id, line)
        except CONNECTION_ERRORS:
            if not last:
                raise  # reconnect; the set is marked again when its lock is taken again
        if last:
            if len(self.stopped) == 1:
                raise error
            raise EveryLaneStopped(
                f"every set's projection stopped ({'; '.join(self.stopped[k] for k in sorted(self.stopped))})"
            )

    async def _write_round(self, connection: asyncpg.Connection, batches: dict[int, Batch]) -> None:
        started = time.perf_counter()
        with self._tracer.start_as_current_span("projector.round") as span:
            span.set_attributes({"compensator.sets": len(batches),
                                 "compensator.events": sum(len(b.events) for b in batches.values())})  # fmt: skip
            await ledger_writer.write_round(
                connection, [ledger_writer.SetBatch(set_id, self.lanes[set_id].cursor, b.rows) for set_id, b in batches.items()],
                owner=self._settings.owner,
            )  # fmt: skip
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.rounds.inc()
        self.rounds += 1
        now_ms = self._clock_ms()
        for set_id, batch in batches.items():
            lane = self.lanes[set_id]
            lane.committed(batch, now_ms)
            self._count(batch, lane, now_ms)
            lane.start()

    def _count(self, batch: Batch, lane: SetLane, now_ms: int) -> None:
        metrics = self.metrics
        self.projected += len(batch.events)
        metrics.batches.inc()
        by_type: dict[str, int] = {}
        for event in batch.events:
            by_type[event.type.value] = by_type.get(event.type.value, 0) + 1
            metrics.event_lag_seconds.observe(max(0, now_ms - event.ts_ms) / 1000)
        for name, count in by_type.items():
            metrics.events.labels(name).inc(count)
        unreadable = lane.facts.unreadable_payloads
        if unreadable:
            metrics.unreadable_payloads.inc(unreadable)
            lane.facts.unreadable_payloads = 0


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


class EveryLaneStopped(RuntimeError):
    """Every set this process projects is stopped (each logged as it stopped): nothing left to do."""


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
