"""The worker's loop: for each set it leases from, wait for work with reads, lease what there is
room for, run each grant through its kind's handler, settle it with the set it came from; and
drain on SIGTERM.

Sets: the worker takes its sets as a mapping (set id -> client) and runs one lane per set
(lanes.py): its own loop, watch, completions, lease keeper and backoff, so a set that is down or
has no leader stalls only its own lane. The worker's room is shared among the sets that have work
(shares.py): a backlog on one set does not starve another. An attempt is keyed by (set, message
id), and everything it does after the lease (extensions, the ack or fail, the in-doubt report, a
release at drain) goes to its own set. A worker of one set is a mapping of one.

Waiting is a read: which of the worker's kinds have a message ready, and when the next delayed
one is due (`QueueClient.work_due`, a stale read of the leader's applied state: no log entry).
An idle worker's read is a long poll the leader answers one apply after new work arrives, and a
busy one leases its backlog without reading first (waiting.py). Idle workers write nothing.

Leasing is fair across kinds and bounded by room: one Lease command per ready kind, each for no
more than that kind's free slots (per kind and per downstream, limits.py, within the set's
share), all in one frame.

A grant runs as a task: its payload decoded with the kind's model (ledger/kinds.py), its trace
continued from the message's headers, its handler's decision settled through its set's
`Completions` (ack, or fail with the decision's class, Retry-After and permanence: the kind's
retry policy in the store picks the delay). A handler that raises is a bug, not a downstream
answer: the attempt is failed as `handler_error`, outcome unknown, and the traceback logged.

Each downstream has a circuit breaker shared through the store (breaker.py, across sets
breaker_board.py): the runner records every attempt's end in it, opens it for every worker when
it trips (a pause by ``breaker:<downstream>`` on each of its kinds, in every set), probes it with
single leases while it is open, closes it when a probe is answered, and ramps its starts up after
it closed.

Sets added while it runs: given a `discover` (the wiring's: a re-read of the control set's table
every `store.sets_refresh_s`), the worker opens a lane for each set it did not know, so a set
added by `compensator sets add` is leased from without a restart. A set the table no longer
lists keeps its lane (sets are never removed). A set whose addresses changed (the discover answers
a new client for it) keeps its lane, which sends through the new client from its next call; the
old one is closed once every call it carries has ended (`_retire`).

Drain (SIGTERM): stop leasing; let running attempts finish for up to `drain_grace_s`; cut off the
rest and hand them back at once (Release, interrupted: their next delivery checks downstream
first), so no message waits for a lease to expire; settle everything; stop.

Must never: lease more than it has room for, settle a grant twice or with another set, or run an
attempt whose payload failed its content check (QueueClient.lease drops those).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError

from delay.policy import DELAY_MAX_MS
from handlers.contract import Attempt, Decision, Handler, Permanent, Retryable, Succeeded
from handlers.lease_time import LeaseTime
from handlers.registry import Registry
from ledger.kinds import Kind, decode_payload
from queues import ClientError, Code, Grant, QueueClient, QueueError
from queues.lateness import grant_lateness_ms
from queues.model import LEASE_MS_MAX
from queues.sets.table import TableError
from services.worker.breaker import BreakerSettings
from services.worker.breaker_board import BreakerBoard
from services.worker.completions import Completion
from services.worker.documents import OperatorDocuments
from services.worker.lanes import SetLane
from services.worker.limits import Limits
from services.worker.metrics import WorkerMetrics
from services.worker.shares import Shares
from services.worker.turns import Turns

log = logging.getLogger("compensator.worker")
FENCED: Final = frozenset({Code.STALE_TOKEN, Code.LEASE_EXPIRED, Code.ILLEGAL_STATE})
"""A settlement of a lease this worker lost: a newer grant holds the message (STALE_TOKEN), the lease
expired (LEASE_EXPIRED), or the message has left the leased state under another delivery (failed
and waiting, dead-lettered, discarded): the store checks the lifecycle before the token, so that
stale token meets ILLEGAL_STATE (docs/queue.md). From a live lease every settlement is legal, so
for a grant this worker received ILLEGAL_STATE means nothing else."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    worker_id: str
    lease_ms: int = 30_000
    batch_max: int = 100
    """Grants per Lease command at most."""
    idle_poll_s: float = 0.1
    """How old a read may be for a lease from the backlog to skip it; the longest an idle worker
    waits with a breaker open (its probes are timed by it) or when the store cannot long-poll."""
    idle_wait_s: float = 1.0
    """The longest an idle worker's long poll is held: the store answers it at the first apply
    after the worker's last read, and the worker asks again by the next due time, so a longer wait
    costs no latency, only fewer reads (with several sets, of every set)."""
    drain_grace_s: float = 10.0
    linger_s: float = 0.005
    """Under load only (`siblings_min` attempts running): how long an ack waits for others to
    share its frame, and a lease from a backlog for more slots to free."""
    siblings_min: int = 4
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    modes_refresh_s: float = 1.0
    """How often the breakers' modes (operators' settings documents) are read."""


@dataclass(slots=True)
class Running:
    lane: SetLane
    grant: Grant
    task: asyncio.Task[None]
    lease: LeaseTime
    probe: bool = False


Discover = Callable[[], Awaitable[Mapping[int, QueueClient]]]
"""The sets the worker should lease from now (each set's client); raises or returns the known ones
when the table cannot be read."""
NewSet = Callable[[int, QueueClient], None]
"""Told of each set added while the worker runs, and of each set that moved (its new client): the
wiring starts the set's maintenance driver on it (stopping the one on the old client)."""
RETIRE_MARGIN_S: Final = 1.0
"""After a moved set's old client's longest call, before it is closed (`Worker._retire`)."""


class Worker:
    def __init__(
        self, sets: Mapping[int, QueueClient], handlers: Mapping[str, Handler], limits: Limits,
        settings: WorkerSettings, *, tracer: trace.Tracer, metrics: WorkerMetrics, registry: Registry | None = None,
        discover: Discover | None = None, discover_every_s: float = 30.0,
    ) -> None:  # fmt: skip
        if not sets:
            raise ValueError("a worker needs at least one set to lease from")
        self._handlers = handlers
        self._settings = settings
        self._tracer = tracer
        self._metrics = metrics
        self._running: dict[tuple[int, int], Running] = {}
        """(set, message id) -> the attempt: two sets both have a message 42."""
        self._sets = dict(sets)
        """The board and the documents read this mapping live: a set added to it is theirs too."""
        self._shares = Shares(limits, sets)
        self._turns = Turns(active=lambda: len(self.lanes) > 1 and self._busy())
        downstream_of = {kind: handler.downstream for kind, handler in handlers.items()}
        self._board = BreakerBoard(downstream_of, self._sets, settings.breaker, worker_id=settings.worker_id, metrics=metrics)
        self.breakers = self._board.breakers
        self.lanes = {set_id: self._lane(set_id, queue) for set_id, queue in sorted(sets.items())}
        self._documents = OperatorDocuments(self._sets, registry, refresh_s=settings.modes_refresh_s,
                                            reachable=lambda set_id: self.lanes[set_id].reachable)  # fmt: skip
        self._helpers: list[asyncio.Task[None]] = []
        self._discover_sets = discover
        self._discover_every_s = discover_every_s

    def _lane(self, set_id: int, queue: QueueClient) -> SetLane:
        return SetLane(set_id, queue, sorted(self._handlers), self._settings, shares=self._shares, board=self._board,
                       metrics=self._metrics, start=self._start, busy=self._busy, settled=self._settled,
                       turns=self._turns)  # fmt: skip

    @property
    def running(self) -> int:
        return len(self._running)

    def _busy(self) -> bool:
        """Enough attempts running that more completions and free slots come within a linger."""
        return len(self._running) >= self._settings.siblings_min

    @property
    def metrics(self) -> WorkerMetrics:
        return self._metrics

    @property
    def worker_id(self) -> str:
        return self._settings.worker_id

    @property
    def leased(self) -> int:
        return sum(lane.leased for lane in self.lanes.values())

    @property
    def lane_turns_waited(self) -> int:
        """Leases that waited for another set's lease to be answered (turns.py)."""
        return self._turns.waited

    @property
    def pending(self) -> int:
        """Completions not yet answered by their sets."""
        return sum(lane.completions.pending for lane in self.lanes.values())

    # ---- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, *, new_set: NewSet | None = None) -> None:
        """Lease from every set until `stop`, then drain. With a `discover`, ask it every
        `discover_every_s` for the sets to lease from and open a lane for each new one (`new_set`
        is told)."""
        self._helpers = [asyncio.create_task(self._documents.run(self.breakers))]
        for lane in self.lanes.values():
            self._start_helpers(lane)
        try:
            async with asyncio.TaskGroup() as lanes:  # one lane failing for a bug stops them all
                for lane in self.lanes.values():
                    lanes.create_task(lane.lease_until(stop), name=f"lane-{lane.set_id}")
                if self._discover_sets is not None:
                    lanes.create_task(self._discover(lanes, stop, self._discover_sets, new_set), name="discover-sets")
            await self._drain()
        finally:
            for helper in self._helpers:
                helper.cancel()
            for helper in self._helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper

    def _start_helpers(self, lane: SetLane) -> None:
        self._helpers += [asyncio.create_task(lane.completions.run()), asyncio.create_task(lane.keeper.run())]

    async def _discover(self, lanes: asyncio.TaskGroup, stop: asyncio.Event, discover: Discover,
                        new_set: NewSet | None) -> None:  # fmt: skip
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._discover_every_s)
            if stop.is_set():
                return
            try:
                found = await discover()
            except (ClientError, QueueError, TableError) as error:  # the control set is down: keep the lanes
                log.warning("cannot re-read the set table; leasing from the %d known sets: %s", len(self.lanes), error)
                continue
            for set_id, queue in sorted(found.items()):
                if stop.is_set() or (set_id in self.lanes and self.lanes[set_id].queue is queue):
                    continue
                if set_id in self.lanes:
                    self._moved(set_id, queue)
                    if new_set is not None:
                        new_set(set_id, queue)
                    continue
                self._sets[set_id] = queue
                self._shares.add(set_id)
                lane = self.lanes[set_id] = self._lane(set_id, queue)
                self._start_helpers(lane)
                lanes.create_task(lane.lease_until(stop), name=f"lane-{set_id}")
                log.info("set %d joined the table: leasing from it too (%d sets)", set_id, len(self.lanes))
                if new_set is not None:
                    new_set(set_id, queue)

    def _moved(self, set_id: int, queue: QueueClient) -> None:
        """The set's addresses changed in the table (the discover answers a new client for it): its
        lane, the breakers and the documents use the new client from their next call, and the old
        one is closed once nothing can be in flight on it (`_retire`)."""
        old = self.lanes[set_id].use(queue)
        self._sets[set_id] = queue
        log.warning("set %d moved (its addresses changed in the table): leasing from it through a new client", set_id)
        self._helpers.append(asyncio.create_task(self._retire(old), name=f"retire-{set_id}"))

    async def _retire(self, old: QueueClient) -> None:
        """Close a moved set's old client after the longest a call on it can last: every call ends
        by its client's deadline, a waiting read by that and its hold (at most `idle_wait_s`), so
        an extension, a completion or a long poll sent before the move ends on it first. Closed at
        once when the worker stops first (its drain has settled everything by then)."""
        try:
            await asyncio.sleep(old.raft.deadline_s + max(self._settings.idle_wait_s, self._settings.idle_poll_s)
                                + RETIRE_MARGIN_S)  # fmt: skip
        finally:
            await old.raft.close()

    # ---- one attempt ---------------------------------------------------------------------------
    def _start(self, lane: SetLane, grant: Grant, lease: LeaseTime, probe: bool) -> None:
        """Run a grant of `lane`'s set, in the slot the lane took for it."""
        lane.keeper.hold(grant.message_id, grant.token, lease)
        handler = self._handlers[grant.kind]
        self._metrics.in_flight.labels(handler.downstream).inc()
        self._metrics.lateness_seconds.labels(grant.kind).observe(
            grant_lateness_ms(grant, self._settings.lease_ms) / 1000
        )
        task = asyncio.create_task(self._attempt(lane, grant, handler, lease, probe),
                                   name=f"attempt-{lane.set_id}-{grant.message_id}")  # fmt: skip
        self._running[(lane.set_id, grant.message_id)] = Running(lane, grant, task, lease, probe)

    async def _attempt(self, lane: SetLane, grant: Grant, handler: Handler, lease: LeaseTime, probe: bool) -> None:
        decision: Decision | None = None
        try:
            decision = await self._decide(lane.set_id, grant, handler, lease)
            self._board.record(lane.set_id, grant, decision, probe)
        finally:
            self._running.pop((lane.set_id, grant.message_id), None)
            lane.keeper.forget(grant.message_id)
            self._shares.give(lane.set_id, grant.kind)
            self._metrics.in_flight.labels(handler.downstream).dec()
            if decision is not None:
                self._settle(lane, grant, decision, lease)

    async def _decide(self, set_id: int, grant: Grant, handler: Handler, lease: LeaseTime) -> Decision:
        context = propagate.extract(grant.headers)
        attributes: dict[str, str | int] = {"compensator.kind": grant.kind, "compensator.ref_key": grant.ref_key,
                      "compensator.attempt": grant.attempt, "compensator.message_id": grant.message_id,
                      "compensator.set_id": set_id, "compensator.request_id": f"{set_id}-{grant.message_id}"}  # fmt: skip
        with self._tracer.start_as_current_span(f"attempt {grant.kind}", context=context, kind=SpanKind.CONSUMER,
                                                attributes=attributes) as span:  # fmt: skip
            started = time.perf_counter()
            decision = await self._handle(set_id, grant, handler, lease)
            self._metrics.handler_seconds.labels(grant.kind).observe(time.perf_counter() - started)
            outcome = {Succeeded: "succeeded", Retryable: "retryable", Permanent: "permanent"}[type(decision)]
            self._metrics.attempts.labels(grant.kind, outcome).inc()
            span.set_attribute("compensator.outcome", outcome)
            if not isinstance(decision, Succeeded):
                span.set_attribute("compensator.error_class", decision.error_class)
                span.set_status(Status(StatusCode.ERROR, decision.error_class))
            return decision

    async def _handle(self, set_id: int, grant: Grant, handler: Handler, lease: LeaseTime) -> Decision:
        try:
            payload = decode_payload(Kind(grant.kind), grant.payload)
        except (ValueError, ValidationError) as error:  # stored by another client, or edited badly
            return Permanent(error_class="invalid_payload", detail=f"the payload is not a valid {grant.kind}: {error}")
        attempt = Attempt(
            message_id=grant.message_id, kind=Kind(grant.kind), ref_key=grant.ref_key,
            idempotency_key=grant.idempotency_key, payload=payload, attempt=grant.attempt,
            previous_error_class=grant.previous_error_class, headers=grant.headers, in_doubt_ms=grant.in_doubt_ms,
            budget_attempt=grant.budget_attempt, lease=lease,
        )  # fmt: skip
        try:
            return await handler.handle(attempt)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler for %s raised on request %d-%d", grant.kind, set_id, grant.message_id)
            return Retryable(error_class="handler_error", detail="the handler raised; see the worker's log",
                             outcome_unknown=True)  # fmt: skip

    def _settle(self, lane: SetLane, grant: Grant, decision: Decision, lease: LeaseTime) -> None:
        if isinstance(decision, Succeeded):
            lane.completions.ack(grant.message_id, grant.token, grant.kind, decision.detail)
            return
        retry_after_ms = None
        if isinstance(decision, Retryable) and decision.retry_after_s is not None:
            # A duration: the store adds it to the log's clock. This worker's clock may be off.
            retry_after_ms = min(DELAY_MAX_MS, max(0, math.ceil(decision.retry_after_s * 1000)))
        lane.completions.fail(
            grant.message_id, grant.token, grant.kind, error_class=decision.error_class, error_text=_failure_text(decision),
            permanent=isinstance(decision, Permanent), retry_after_ms=retry_after_ms, in_doubt_ms=_in_doubt_ms(lease),
        )  # fmt: skip

    def _settled(self, set_id: int, completion: Completion, code: Code) -> None:
        result = _settlement(set_id, completion, code)
        self._metrics.settled.labels(completion.action, result).inc()
        self._metrics.set_completions.labels(str(set_id), completion.action, result).inc()

    # ---- drain ---------------------------------------------------------------------------------
    async def _drain(self) -> None:
        running = [r.task for r in self._running.values()]
        if running:
            log.info("draining: %d attempts running, %.1f s to finish", len(running), self._settings.drain_grace_s)
            await asyncio.wait(running, timeout=self._settings.drain_grace_s)
        cut = list(self._running.values())
        for entry in cut:
            entry.task.cancel()
        for entry in cut:
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
            entry.lane.completions.release(entry.grant.message_id, entry.grant.token, entry.grant.kind,
                                           interrupted=True, in_doubt_ms=_in_doubt_ms(entry.lease))  # fmt: skip
        if cut:
            log.info("draining: %d attempts cut off and handed back", len(cut))
        drained = [lane.completions.drained() for lane in self.lanes.values()]
        with contextlib.suppress(TimeoutError):  # a set that does not answer keeps its own: their leases expire
            await asyncio.wait_for(asyncio.gather(*drained), self._settings.drain_grace_s)
        if self.pending:
            log.warning("stopping with %d completions unsettled: their leases will expire", self.pending)


def _failure_text(decision: Retryable | Permanent) -> str:
    """What the attempt's history and the review pages show of a failure: the detail, the status,
    the downstream's words."""
    text = decision.detail
    if decision.status is not None and f"HTTP {decision.status}" not in text:
        text = f"{text} [HTTP {decision.status}]"
    return f"{text} {decision.excerpt}" if decision.excerpt else text


def _settlement(set_id: int, completion: Completion, code: Code) -> str:
    """The store's answer to a settlement, as the metric's result label."""
    if code in (Code.OK, Code.ALREADY_ACKED):
        return "ok"
    if code is Code.DONE_ELSEWHERE:
        return "done_elsewhere"
    if code in FENCED:
        return "fenced"
    log.warning("%s of request %d-%d refused: %s", completion.action, set_id, completion.message_id, code.name)
    return code.name.lower()


def _in_doubt_ms(lease: LeaseTime) -> int | None:
    """What the attempt reports of how long its requests stay in doubt (None: it does not report)."""
    reported = lease.in_doubt_report_ms()
    return None if reported is None else min(reported, LEASE_MS_MAX)
