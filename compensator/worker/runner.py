"""The worker's loop: wait for work with reads, lease what there is room for, run each grant
through its kind's handler, settle it, and drain on SIGTERM.

Waiting is a read. An idle worker asks the leader which of its kinds have a message ready and when
the next delayed one is due (`QueueClient.work_due`, a stale read of the leader's applied state:
no ReadIndex round and no log entry), sleeps until then or for `idle_poll_s`, and leases only when
something is ready. Four idle workers write nothing to the log.

Leasing is fair across kinds and bounded by room: one Lease command per ready kind, each for no
more than that kind's free slots (per kind and per downstream, limits.py), all in one frame.

A grant runs as a task: its payload decoded with the kind's model (ledger/kinds.py), its trace
continued from the message's headers, its handler's decision settled through `Completions`
(ack, or fail with the decision's class, Retry-After and permanence: the kind's retry policy in
the store picks the delay). A handler that raises is a bug, not a downstream answer: the attempt
is failed as `handler_error`, outcome unknown, and the traceback logged.

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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError

from compensator.worker.completions import Completion, Completions
from compensator.worker.keeper import LeaseKeeper
from compensator.worker.limits import Limits
from compensator.worker.metrics import WorkerMetrics
from handlers.contract import Attempt, Decision, Handler, Permanent, Retryable, Succeeded
from ledger.kinds import Kind, decode_payload
from queues import ClientError, Code, Grant, LeaseResult, QueueClient, QueueError
from queues.lateness import grant_lateness_ms
from queues.model import Lease, QueueCommand

log = logging.getLogger("compensator.worker")
ERROR_BACKOFF_MAX_S: Final = 2.0
FENCED: Final = frozenset({Code.STALE_TOKEN, Code.LEASE_EXPIRED})


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    worker_id: str
    lease_ms: int = 30_000
    batch_max: int = 100
    """Grants per Lease command at most."""
    idle_poll_s: float = 0.1
    drain_grace_s: float = 10.0
    flush_s: float = 0.005


@dataclass(slots=True)
class Running:
    grant: Grant
    task: asyncio.Task[None]


class Worker:
    def __init__(
        self, queue: QueueClient, handlers: Mapping[str, Handler], limits: Limits, settings: WorkerSettings, *,
        tracer: trace.Tracer, metrics: WorkerMetrics, wall_clock_ms: Callable[[], int] | None = None,
    ) -> None:  # fmt: skip
        self._queue = queue
        self._handlers = handlers
        self._limits = limits
        self._settings = settings
        self._tracer = tracer
        self._metrics = metrics
        self._wall_ms = wall_clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._running: dict[int, Running] = {}
        self._slot_freed = asyncio.Event()
        self.completions = Completions(queue, on_settled=self._settled, flush_s=settings.flush_s)
        self.keeper = LeaseKeeper(queue, lease_ms=settings.lease_ms)
        self.leased = 0
        self.lease_commands = 0

    @property
    def running(self) -> int:
        return len(self._running)

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
                wait_s, backoff_s = backoff_s, min(backoff_s * 2, ERROR_BACKOFF_MAX_S)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait_s)

    async def _lease_once(self, room: dict[str, int]) -> float:
        """Lease what is ready; the seconds to wait before asking again (0: at once)."""
        due = (await self._queue.work_due(sorted(room))).value
        ready = [kind for kind in sorted(due.ready) if kind in room]
        if not ready:
            if due.next_due_ms is None:
                return self._settings.idle_poll_s
            return min(self._settings.idle_poll_s, max(0.0, (due.next_due_ms - due.now_ms) / 1000))
        commands: list[QueueCommand] = [
            Lease(worker_id=self._settings.worker_id, kinds=(kind,), lease_ms=self._settings.lease_ms,
                  count_max=min(room[kind], self._settings.batch_max))
            for kind in ready
        ]  # fmt: skip
        results = await self._queue.submit_many(commands)
        self.lease_commands += len(commands)
        granted = 0
        for result in results:
            if not isinstance(result, LeaseResult):
                raise QueueError(f"expected a lease result, got {result!r}")
            self._metrics.leases_expired.inc(result.expired)
            for grant in (await self._queue.checked(result)).grants:
                self._start(grant)
                granted += 1
        return 0.0 if granted else self._settings.idle_poll_s  # raced another worker to it: back off

    # ---- one attempt ---------------------------------------------------------------------------
    def _start(self, grant: Grant) -> None:
        self._limits.acquire(grant.kind)
        self.keeper.hold(grant.message_id, grant.token)
        self.leased += 1
        handler = self._handlers[grant.kind]
        self._metrics.in_flight.labels(handler.downstream).inc()
        self._metrics.lateness_seconds.labels(grant.kind).observe(grant_lateness_ms(grant, self._settings.lease_ms) / 1000)
        task = asyncio.create_task(self._attempt(grant, handler), name=f"attempt-{grant.message_id}")
        self._running[grant.message_id] = Running(grant, task)

    async def _attempt(self, grant: Grant, handler: Handler) -> None:
        decision: Decision | None = None
        try:
            decision = await self._decide(grant, handler)
        finally:
            self._running.pop(grant.message_id, None)
            self.keeper.forget(grant.message_id)
            self._limits.release(grant.kind)
            self._metrics.in_flight.labels(handler.downstream).dec()
            self._slot_freed.set()
            if decision is not None:
                self._settle(grant, decision)

    async def _decide(self, grant: Grant, handler: Handler) -> Decision:
        context = propagate.extract(grant.headers)
        attributes: dict[str, str | int] = {"compensator.kind": grant.kind, "compensator.ref_key": grant.ref_key,
                      "compensator.attempt": grant.attempt, "compensator.message_id": grant.message_id}  # fmt: skip
        with self._tracer.start_as_current_span(f"attempt {grant.kind}", context=context, kind=SpanKind.CONSUMER,
                                                attributes=attributes) as span:  # fmt: skip
            started = time.perf_counter()
            decision = await self._handle(grant, handler)
            self._metrics.handler_seconds.labels(grant.kind).observe(time.perf_counter() - started)
            outcome = {Succeeded: "succeeded", Retryable: "retryable", Permanent: "permanent"}[type(decision)]
            self._metrics.attempts.labels(grant.kind, outcome).inc()
            span.set_attribute("compensator.outcome", outcome)
            if not isinstance(decision, Succeeded):
                span.set_attribute("compensator.error_class", decision.error_class)
                span.set_status(Status(StatusCode.ERROR, decision.error_class))
            return decision

    async def _handle(self, grant: Grant, handler: Handler) -> Decision:
        try:
            payload = decode_payload(Kind(grant.kind), grant.payload)
        except (ValueError, ValidationError) as error:  # stored by another client, or edited badly
            return Permanent(error_class="invalid_payload", detail=f"the payload is not a valid {grant.kind}: {error}")
        attempt = Attempt(
            message_id=grant.message_id, kind=Kind(grant.kind), ref_key=grant.ref_key,
            idempotency_key=grant.idempotency_key, payload=payload, attempt=grant.attempt,
            previous_error_class=grant.previous_error_class, headers=grant.headers,
        )  # fmt: skip
        try:
            return await handler.handle(attempt)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler for %s raised on message %d", grant.kind, grant.message_id)
            return Retryable(error_class="handler_error", detail="the handler raised; see the worker's log",
                             outcome_unknown=True)  # fmt: skip

    def _settle(self, grant: Grant, decision: Decision) -> None:
        if isinstance(decision, Succeeded):
            self.completions.ack(grant.message_id, grant.token, grant.kind, decision.detail)
            return
        text = decision.detail
        if decision.status is not None:
            text = f"{text} [HTTP {decision.status}]"
        if decision.excerpt:
            text = f"{text} {decision.excerpt}"
        not_before_ms = None
        if isinstance(decision, Retryable) and decision.retry_after_s is not None:
            not_before_ms = self._wall_ms() + int(decision.retry_after_s * 1000)
        self.completions.fail(
            grant.message_id, grant.token, grant.kind, error_class=decision.error_class, error_text=text,
            permanent=isinstance(decision, Permanent), not_before_ms=not_before_ms,
        )  # fmt: skip

    def _settled(self, completion: Completion, code: Code) -> None:
        if code in (Code.OK, Code.ALREADY_ACKED):
            result = "ok"
        elif code is Code.DONE_ELSEWHERE:
            result = "done_elsewhere"
        elif code in FENCED:
            result = "fenced"
        else:
            result = code.name.lower()
            log.warning("%s of message %d refused: %s", completion.action, completion.message_id, code.name)
        self._metrics.settled.labels(completion.action, result).inc()

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
            self.completions.release(entry.grant.message_id, entry.grant.token, entry.grant.kind, interrupted=True)
        if cut:
            log.info("draining: %d attempts cut off and handed back", len(cut))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.completions.drained(), self._settings.drain_grace_s)
        if self.completions.pending:
            log.warning("stopping with %d completions unsettled: their leases will expire", self.completions.pending)


async def _first(*waits: object) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
