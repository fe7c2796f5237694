"""The worker's loop: wait for work with reads, lease what there is room for, run each grant
through its kind's handler, settle it, and drain on SIGTERM.

Waiting is a read: which of the worker's kinds have a message ready, and when the next delayed
one is due (`QueueClient.work_due`, a stale read of the leader's applied state: no log entry).
An idle worker's read is a long poll the leader answers one apply after new work arrives, and a
busy one leases its backlog without reading first (waiting.py). Idle workers write nothing.

Leasing is fair across kinds and bounded by room: one Lease command per ready kind, each for no
more than that kind's free slots (per kind and per downstream, limits.py), all in one frame.

A grant runs as a task: its payload decoded with the kind's model (ledger/kinds.py), its trace
continued from the message's headers, its handler's decision settled through `Completions`
(ack, or fail with the decision's class, Retry-After and permanence: the kind's retry policy in
the store picks the delay). A handler that raises is a bug, not a downstream answer: the attempt
is failed as `handler_error`, outcome unknown, and the traceback logged.

Each downstream has a circuit breaker shared through the store (breaker.py): the runner records
every attempt's end in it, opens it for every worker when it trips (a pause by
``breaker:<downstream>`` on each of its kinds), probes it with single leases while it is open,
closes it when a probe is answered, and ramps its starts up after it closed.

Drain (SIGTERM): stop leasing; let running attempts finish for up to `drain_grace_s`; cut off the
rest and hand them back at once (Release, interrupted: their next delivery checks downstream
first), so no message waits for a lease to expire; settle everything; stop.

Must never: lease more than it has room for, settle a grant twice, or run an attempt whose payload
failed its content check (QueueClient.lease drops those).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError

from delay.policy import DELAY_MAX_MS
from handlers.contract import Attempt, Decision, Handler, Permanent, Retryable, Succeeded
from handlers.lease_time import LeaseTime
from handlers.registry import Registry
from ledger.kinds import Kind, decode_payload
from queues import ClientError, Code, Grant, LeaseResult, QueueClient, QueueError
from queues.lateness import grant_lateness_ms
from queues.model import LEASE_MS_MAX, Lease, QueueCommand
from services.worker.breaker import DOWNSTREAM_FAILURES, Breaker, BreakerSettings, Mode, holder
from services.worker.completions import Completion, Completions
from services.worker.documents import OperatorDocuments
from services.worker.keeper import LeaseKeeper
from services.worker.limits import Limits
from services.worker.metrics import WorkerMetrics
from services.worker.waiting import WorkWatch, sleep_unless

log = logging.getLogger("compensator.worker")
ERROR_BACKOFF_MAX_S: Final = 2.0
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
    """The longest a worker waits for work before it asks again (a long poll ends sooner when the
    store changes)."""
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
    grant: Grant
    task: asyncio.Task[None]
    lease: LeaseTime
    probe: bool = False


class Worker:
    def __init__(
        self, queue: QueueClient, handlers: Mapping[str, Handler], limits: Limits, settings: WorkerSettings, *,
        tracer: trace.Tracer, metrics: WorkerMetrics, registry: Registry | None = None,
    ) -> None:  # fmt: skip
        self._queue = queue
        self._handlers = handlers
        self._limits = limits
        self._settings = settings
        self._tracer = tracer
        self._metrics = metrics
        self._running: dict[int, Running] = {}
        self._slot_freed = asyncio.Event()
        self._kinds_of: dict[str, list[str]] = {}
        for kind, handler in sorted(handlers.items()):
            self._kinds_of.setdefault(handler.downstream, []).append(kind)
        rng = random.Random()
        self.breakers = {
            downstream: Breaker(downstream, settings.breaker, clock=time.monotonic, rng=rng)
            for downstream in self._kinds_of
        }
        self._documents = OperatorDocuments(queue, registry, refresh_s=settings.modes_refresh_s)
        self._breaker_tasks: set[asyncio.Task[None]] = set()
        self.completions = Completions(queue, on_settled=self._settled, linger_s=settings.linger_s,
                                       busy=self._busy)  # fmt: skip
        self.keeper = LeaseKeeper(queue, lease_ms=settings.lease_ms)
        self.leased = 0
        self.lease_commands = 0
        self._watch = WorkWatch(queue, sorted(handlers), idle_poll_s=settings.idle_poll_s)

    @property
    def running(self) -> int:
        return len(self._running)

    def _busy(self) -> bool:
        """Enough attempts running that more completions and free slots come within a linger."""
        return len(self._running) >= self._settings.siblings_min

    @property
    def queue(self) -> QueueClient:
        return self._queue

    @property
    def metrics(self) -> WorkerMetrics:
        return self._metrics

    @property
    def worker_id(self) -> str:
        return self._settings.worker_id

    # ---- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        helpers = [asyncio.create_task(self.completions.run()), asyncio.create_task(self.keeper.run())]
        try:
            await self._lease_until(stop)
            await self._drain()
        finally:
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper

    async def _lease_until(self, stop: asyncio.Event) -> None:
        backoff_s = 0.05
        while not stop.is_set():
            room = self._limits.free()
            if not room:
                self._slot_freed.clear()
                await _first(stop.wait(), self._slot_freed.wait())
                continue
            try:
                wait_s = await self._lease_once(room)
                backoff_s = 0.05
            except (ClientError, QueueError) as error:
                log.warning("could not lease (will retry): %s", error)
                self._watch.forget()
                await sleep_unless(stop, backoff_s)
                backoff_s = min(backoff_s * 2, ERROR_BACKOFF_MAX_S)
                continue
            if wait_s > 0:
                await self._watch.wait(stop, wait_s, self._slot_freed)

    async def _lease_once(self, room: dict[str, int]) -> float:
        """Lease what is ready; the seconds to wait before asking again (0: at once)."""
        watch = self._watch
        self._ramp(room)
        backlog = watch.backlogged(room)
        if backlog and self._busy():
            await asyncio.sleep(self._settings.linger_s)  # slots freed meanwhile join one lease
            room = self._limits.free()
            self._ramp(room)
            backlog = watch.backlogged(room)
        if backlog:
            return watch.wait_after(await self._lease(backlog, [], room), from_read=False)
        due = await watch.read()
        await self._follow_breakers(due.paused)
        self._ramp(room)
        ready = [kind for kind in sorted(due.ready) if room.get(kind)]
        watch.found(sorted(due.ready), ready)
        probes = self._probes(due.paused, due.paused_ready, room)
        if not ready and not probes:
            if due.next_due_ms is None:
                return self._settings.idle_poll_s
            return min(self._settings.idle_poll_s, max(0.0, (due.next_due_ms - due.now_ms) / 1000))
        return watch.wait_after(await self._lease(ready, probes, room), from_read=True)

    async def _lease(self, ready: list[str], probes: list[str], room: dict[str, int]) -> int:
        """One Lease command per kind (`ready`, then one-grant probes), in one frame; starts the
        grants and says how many there were."""
        settings = self._settings
        commands: list[QueueCommand] = [
            Lease(worker_id=settings.worker_id, kinds=(kind,), lease_ms=settings.lease_ms,
                  count_max=min(room[kind], settings.batch_max))
            for kind in ready
        ]  # fmt: skip
        commands += [
            Lease(worker_id=settings.worker_id, kinds=(kind,), lease_ms=settings.lease_ms, count_max=1,
                  probe=holder(self._handlers[kind].downstream))
            for kind in probes
        ]  # fmt: skip
        requested_s = time.monotonic()  # the store grants after this: the lease ends no earlier here
        results = await self._queue.submit_many(commands)
        received_s = time.monotonic()
        self.lease_commands += len(commands)
        granted = 0
        for index, result in enumerate(results):
            if not isinstance(result, LeaseResult):
                raise QueueError(f"expected a lease result, got {result!r}")
            self._metrics.leases_expired.inc(result.expired)
            probe = index >= len(ready)
            if not probe:
                self._watch.leased(ready[index], len(result.grants), min(room[ready[index]], settings.batch_max))
            grants = (await self._queue.checked(result)).grants
            for grant in grants:
                lease = LeaseTime.granted(lease_ms=settings.lease_ms, deadline_ms=grant.deadline_ms,
                                          requested_s=requested_s, received_s=received_s)  # fmt: skip
                self._start(grant, lease, probe=probe)
                granted += 1
            if grants and not probe:
                self.breakers[self._handlers[grants[0].kind].downstream].took(len(grants))
        return granted

    # ---- breakers ------------------------------------------------------------------------------
    async def _follow_breakers(self, paused: Mapping[str, tuple[str, ...]]) -> None:
        """Take in what the store says (held or not) and what operators forced."""
        await self._documents.refresh(self.breakers)
        for downstream, breaker in self.breakers.items():
            name = holder(downstream)
            held = any(name in paused.get(kind, ()) for kind in self._kinds_of[downstream])
            breaker.observe(held)
            self._metrics.breaker_open.labels(downstream).set(1 if breaker.open else 0)
            if breaker.mode is Mode.OPEN and not held:
                self._spawn(self._hold(downstream, "forced open by an operator"))
            elif breaker.mode is Mode.CLOSED and held:
                self._spawn(self._release_hold(downstream))

    def _ramp(self, room: dict[str, int]) -> None:
        """Cap each downstream's room by its breaker's ramp, if it is ramping."""
        for downstream, breaker in self.breakers.items():
            allowed = breaker.allowance()
            if allowed is None:
                continue
            for kind in self._kinds_of[downstream]:
                if kind in room:
                    room[kind] = min(room[kind], allowed)
                    allowed -= room[kind]

    def _probes(
        self, paused: Mapping[str, tuple[str, ...]], paused_ready: tuple[str, ...], room: dict[str, int]
    ) -> list[str]:
        """One kind per open breaker to probe now, among those only the breaker holds."""
        chosen: list[str] = []
        for downstream, breaker in self.breakers.items():
            candidates = [kind for kind in self._kinds_of[downstream] if kind in paused_ready and room.get(kind)
                          and paused.get(kind) == (holder(downstream),)]  # fmt: skip
            if candidates and breaker.probe_due():
                chosen.append(candidates[0])
        return chosen

    def _record(self, grant: Grant, downstream: str, decision: Decision, probe: bool) -> None:
        breaker = self.breakers[downstream]
        failure = decision.error_class if isinstance(decision, Retryable) else None
        breaker.record(failure)
        if probe and breaker.open and failure not in _FAILURES:
            log.info("breaker %s: the probe of message %d was answered; closing", downstream, grant.message_id)
            breaker.observe(held=False)
            self._spawn(self._release_hold(downstream))
        elif breaker.should_trip():
            reason = breaker.tripped()
            log.warning("breaker %s opens: %s", downstream, reason)
            self._spawn(self._hold(downstream, reason))

    async def _hold(self, downstream: str, reason: str) -> None:
        for kind in self._kinds_of[downstream]:
            await self._queue.pause(kind, holder(downstream), reason, actor=self._settings.worker_id)

    async def _release_hold(self, downstream: str) -> None:
        for kind in self._kinds_of[downstream]:
            await self._queue.resume(kind, holder(downstream), actor=self._settings.worker_id)

    def _spawn(self, step: Coroutine[Any, Any, None]) -> None:
        async def guarded() -> None:
            try:
                await step
            except (ClientError, QueueError) as error:  # the next loop sees the store as it is and tries again
                log.warning("breaker change failed: %s", error)

        task = asyncio.create_task(guarded())
        self._breaker_tasks.add(task)
        task.add_done_callback(self._breaker_tasks.discard)

    # ---- one attempt ---------------------------------------------------------------------------
    def _start(self, grant: Grant, lease: LeaseTime, *, probe: bool = False) -> None:
        self._limits.acquire(grant.kind)
        self.keeper.hold(grant.message_id, grant.token, lease)
        self.leased += 1
        handler = self._handlers[grant.kind]
        self._metrics.in_flight.labels(handler.downstream).inc()
        self._metrics.lateness_seconds.labels(grant.kind).observe(
            grant_lateness_ms(grant, self._settings.lease_ms) / 1000
        )
        task = asyncio.create_task(self._attempt(grant, handler, lease, probe), name=f"attempt-{grant.message_id}")
        self._running[grant.message_id] = Running(grant, task, lease, probe)

    async def _attempt(self, grant: Grant, handler: Handler, lease: LeaseTime, probe: bool) -> None:
        decision: Decision | None = None
        try:
            decision = await self._decide(grant, handler, lease)
            self._record(grant, handler.downstream, decision, probe)
        finally:
            self._running.pop(grant.message_id, None)
            self.keeper.forget(grant.message_id)
            self._limits.release(grant.kind)
            self._metrics.in_flight.labels(handler.downstream).dec()
            self._slot_freed.set()
            if decision is not None:
                self._settle(grant, decision, lease)

    async def _decide(self, grant: Grant, handler: Handler, lease: LeaseTime) -> Decision:
        context = propagate.extract(grant.headers)
        attributes: dict[str, str | int] = {"compensator.kind": grant.kind, "compensator.ref_key": grant.ref_key,
                      "compensator.attempt": grant.attempt, "compensator.message_id": grant.message_id}  # fmt: skip
        with self._tracer.start_as_current_span(f"attempt {grant.kind}", context=context, kind=SpanKind.CONSUMER,
                                                attributes=attributes) as span:  # fmt: skip
            started = time.perf_counter()
            decision = await self._handle(grant, handler, lease)
            self._metrics.handler_seconds.labels(grant.kind).observe(time.perf_counter() - started)
            outcome = {Succeeded: "succeeded", Retryable: "retryable", Permanent: "permanent"}[type(decision)]
            self._metrics.attempts.labels(grant.kind, outcome).inc()
            span.set_attribute("compensator.outcome", outcome)
            if not isinstance(decision, Succeeded):
                span.set_attribute("compensator.error_class", decision.error_class)
                span.set_status(Status(StatusCode.ERROR, decision.error_class))
            return decision

    async def _handle(self, grant: Grant, handler: Handler, lease: LeaseTime) -> Decision:
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
            log.exception("handler for %s raised on message %d", grant.kind, grant.message_id)
            return Retryable(error_class="handler_error", detail="the handler raised; see the worker's log",
                             outcome_unknown=True)  # fmt: skip

    def _settle(self, grant: Grant, decision: Decision, lease: LeaseTime) -> None:
        if isinstance(decision, Succeeded):
            self.completions.ack(grant.message_id, grant.token, grant.kind, decision.detail)
            return
        retry_after_ms = None
        if isinstance(decision, Retryable) and decision.retry_after_s is not None:
            # A duration: the store adds it to the log's clock. This worker's clock may be off.
            retry_after_ms = min(DELAY_MAX_MS, max(0, math.ceil(decision.retry_after_s * 1000)))
        self.completions.fail(
            grant.message_id, grant.token, grant.kind, error_class=decision.error_class, error_text=_failure_text(decision),
            permanent=isinstance(decision, Permanent), retry_after_ms=retry_after_ms, in_doubt_ms=_in_doubt_ms(lease),
        )  # fmt: skip

    def _settled(self, completion: Completion, code: Code) -> None:
        self._metrics.settled.labels(completion.action, _settlement(completion, code)).inc()

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
            self.completions.release(entry.grant.message_id, entry.grant.token, entry.grant.kind, interrupted=True,
                                     in_doubt_ms=_in_doubt_ms(entry.lease))  # fmt: skip
        if cut:
            log.info("draining: %d attempts cut off and handed back", len(cut))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.completions.drained(), self._settings.drain_grace_s)
        if self.completions.pending:
            log.warning("stopping with %d completions unsettled: their leases will expire", self.completions.pending)


_FAILURES: Final = frozenset(DOWNSTREAM_FAILURES)


def _failure_text(decision: Retryable | Permanent) -> str:
    """What the attempt's history and the review pages show of a failure: the detail, the status,
    the downstream's words."""
    text = decision.detail
    if decision.status is not None and f"HTTP {decision.status}" not in text:
        text = f"{text} [HTTP {decision.status}]"
    return f"{text} {decision.excerpt}" if decision.excerpt else text


def _settlement(completion: Completion, code: Code) -> str:
    """The store's answer to a settlement, as the metric's result label."""
    if code in (Code.OK, Code.ALREADY_ACKED):
        return "ok"
    if code is Code.DONE_ELSEWHERE:
        return "done_elsewhere"
    if code in FENCED:
        return "fenced"
    log.warning("%s of message %d refused: %s", completion.action, completion.message_id, code.name)
    return code.name.lower()


def _in_doubt_ms(lease: LeaseTime) -> int | None:
    """What the attempt reports of how long its requests stay in doubt (None: it does not report)."""
    reported = lease.in_doubt_report_ms()
    return None if reported is None else min(reported, LEASE_MS_MAX)


async def _first(*waits: object) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
