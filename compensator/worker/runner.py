"""The worker's loop: wait for work with reads, lease what there is room for, run each grant
through its kind's handler, settle it, and drain on SIGTERM.

Waiting is a read. An idle worker asks the leader which of its kinds have a message ready and when
the next delayed one is due (`QueueClient.work_due`, a stale read of the leader's applied state:
no ReadIndex round and no log entry), and leases only when something is ready. With nothing ready
it asks again as a long poll: the leader holds that read until a command after the one the last
answer reflected has applied (an enqueue, say), or until the next due time or `idle_poll_s`, and
then answers it from its new state; so an idle worker hears of new work one apply after it, and
four idle workers write nothing to the log.

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
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError

from compensator.worker.breaker import DOWNSTREAM_FAILURES, Breaker, BreakerSettings, Mode, holder
from compensator.worker.breaker import NAMESPACE as BREAKERS
from compensator.worker.completions import Completion, Completions
from compensator.worker.keeper import LeaseKeeper
from compensator.worker.limits import Limits
from compensator.worker.metrics import WorkerMetrics
from handlers.classification import ClassificationTable, decode_table
from handlers.contract import Attempt, Decision, Handler, Permanent, Retryable, Succeeded
from handlers.registry import Registry
from ledger.kinds import Kind, decode_payload
from queues import ClientError, Code, Grant, LeaseResult, QueueClient, QueueError, Read
from queues.lateness import grant_lateness_ms
from queues.model import Lease, QueueCommand
from queues.query_codec import WorkDueAnswer
from raft_store.client import RequestRefused

log = logging.getLogger("compensator.worker")
ERROR_BACKOFF_MAX_S: Final = 2.0
EMPTY_LEASE_BACKOFF_S: Final = 0.005
"""The first wait after a lease that found nothing the read said was ready; doubling while it recurs."""
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
    probe: bool = False


class Worker:
    def __init__(
        self, queue: QueueClient, handlers: Mapping[str, Handler], limits: Limits, settings: WorkerSettings, *,
        tracer: trace.Tracer, metrics: WorkerMetrics, wall_clock_ms: Callable[[], int] | None = None,
        registry: Registry | None = None,
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
        self._kinds = sorted(handlers)
        self._kinds_of: dict[str, list[str]] = {}
        for kind, handler in sorted(handlers.items()):
            self._kinds_of.setdefault(handler.downstream, []).append(kind)
        rng = random.Random()
        self.breakers = {
            downstream: Breaker(downstream, settings.breaker, clock=time.monotonic, rng=rng)
            for downstream in self._kinds_of
        }
        self._registry = registry
        self._modes_version = -1
        self._tables_version = -1
        self._modes_read_s = float("-inf")
        self._breaker_tasks: set[asyncio.Task[None]] = set()
        self.completions = Completions(queue, on_settled=self._settled, linger_s=settings.linger_s,
                                       busy=self._busy)  # fmt: skip
        self.keeper = LeaseKeeper(queue, lease_ms=settings.lease_ms)
        self.leased = 0
        self.lease_commands = 0
        self._due: Read[WorkDueAnswer] | None = None
        """The answer of the last long poll, not yet acted on."""
        self._applied_seen = 0
        """The applied index the last WorkDue answer reflected: a long poll waits for one past it."""
        self._long_poll = True
        """False once a node refused a waiting read (one that predates them): plain polling then."""
        self._empty_leases = 0
        self._starved = False
        """The last read found work ready for a kind without room here."""
        self._backlog: set[str] = set()
        """Kinds with more ready than this worker took: the last read said so, or their last lease
        was granted all it asked. Leased again without a read first (within `idle_poll_s`)."""
        self._read_at_s = float("-inf")

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
                self._due = None
                await _sleep_unless(stop, backoff_s)
                backoff_s = min(backoff_s * 2, ERROR_BACKOFF_MAX_S)
                continue
            if wait_s > 0:
                await self._wait_for_work(stop, wait_s)

    async def _wait_for_work(self, stop: asyncio.Event, wait_s: float) -> None:
        """Until the store changes (a long poll of WorkDue, whose answer the next lease uses), the
        wait runs out, the worker stops, or (when work was ready but room was not) an attempt
        ends. A poll given up is still answered by the node, which then wakes nobody else for that
        apply: so the worker gives polls up only when a freed slot matters."""
        if not self._long_poll or self._empty_leases > 1:
            # Leases came back empty while reads said ready: a read that answers at the next
            # apply would only say so again, so wait the time out.
            await _sleep_unless(stop, wait_s)
            return
        poll = asyncio.ensure_future(self._queue.work_due(
            self._kinds, wait_after_index=self._applied_seen, wait_s=wait_s))  # fmt: skip
        others = [asyncio.ensure_future(stop.wait())]
        if self._starved:  # work is ready, only room is missing: a slot freed ends the wait
            self._slot_freed.clear()
            others.append(asyncio.ensure_future(self._slot_freed.wait()))
        try:
            await asyncio.wait((poll, *others), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for other in others:
                other.cancel()
        if not poll.done():
            poll.cancel()  # the node answers it when it runs out; the answer is dropped
            return
        try:
            self._due = poll.result()
        except RequestRefused as error:  # a node that knows no waiting reads
            log.warning("the store refused a waiting read (%s); polling every %.0f ms instead", error,
                        self._settings.idle_poll_s * 1000)  # fmt: skip
            self._long_poll = False
        except (ClientError, QueueError) as error:
            log.warning("could not ask for work (will retry): %s", error)
            await _sleep_unless(stop, wait_s)

    async def _lease_once(self, room: dict[str, int]) -> float:
        """Lease what is ready; the seconds to wait before asking again (0: at once)."""
        if self._backlog and self._due is None and self._busy():
            await asyncio.sleep(self._settings.linger_s)  # slots freed meanwhile join one lease
            room = self._limits.free()
        backlog = self._backlog_room(room)
        if backlog:
            return await self._lease(backlog, [], room, from_read=False)
        read, self._due = self._due or await self._queue.work_due(self._kinds), None
        self._read_at_s = time.monotonic()
        self._applied_seen = max(self._applied_seen, read.applied_index)
        due = read.value
        await self._follow_breakers(due.paused)
        self._ramp(room)
        ready = [kind for kind in sorted(due.ready) if room.get(kind)]
        self._starved = len(ready) < len(due.ready)
        self._backlog = set(due.ready) - set(ready)
        probes = self._probes(due.paused, due.paused_ready, room)
        if not ready and not probes:
            if due.next_due_ms is None:
                return self._settings.idle_poll_s
            return min(self._settings.idle_poll_s, max(0.0, (due.next_due_ms - due.now_ms) / 1000))
        return await self._lease(ready, probes, room, from_read=True)

    def _backlog_room(self, room: dict[str, int]) -> list[str]:
        """The backlogged kinds with room, when a lease may skip the read: the worker's last read
        is recent (breakers and pauses are followed at least every `idle_poll_s`) and no answer
        is waiting to be used."""
        if not self._backlog or self._due is not None:
            return []
        if time.monotonic() - self._read_at_s >= self._settings.idle_poll_s:
            return []
        self._ramp(room)
        return [kind for kind in sorted(self._backlog) if room.get(kind)]

    async def _lease(self, ready: list[str], probes: list[str], room: dict[str, int], *, from_read: bool) -> float:
        """One Lease command per kind (`ready`, then one-grant probes), in one frame; starts the grants."""
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
        results = await self._queue.submit_many(commands)
        self.lease_commands += len(commands)
        granted = 0
        for index, result in enumerate(results):
            if not isinstance(result, LeaseResult):
                raise QueueError(f"expected a lease result, got {result!r}")
            self._metrics.leases_expired.inc(result.expired)
            asked = commands[index]
            assert isinstance(asked, Lease)
            if len(result.grants) >= asked.count_max and not asked.probe:
                self._backlog.add(asked.kinds[0])  # granted all it asked: likely more behind it
            else:
                self._backlog.discard(asked.kinds[0])
            grants = (await self._queue.checked(result)).grants
            probe = index >= len(ready)
            for grant in grants:
                self._start(grant, probe=probe)
                granted += 1
            if grants and not probe:
                self.breakers[self._handlers[grants[0].kind].downstream].took(len(grants))
        if granted or not from_read:  # an empty lease from the backlog: it is drained, read again
            self._empty_leases = 0
            return 0.0
        # Another worker took what the read said was ready (idle workers hear of an enqueue
        # together): wait for the store to change. Empty again and again: back off.
        self._empty_leases += 1
        backoff_s: float = EMPTY_LEASE_BACKOFF_S * 2 ** min(self._empty_leases - 1, 16)
        return min(self._settings.idle_poll_s, backoff_s)

    # ---- breakers ------------------------------------------------------------------------------
    async def _follow_breakers(self, paused: Mapping[str, tuple[str, ...]]) -> None:
        """Take in what the store says (held or not) and what operators forced."""
        await self._read_modes()
        for downstream, breaker in self.breakers.items():
            name = holder(downstream)
            held = any(name in paused.get(kind, ()) for kind in self._kinds_of[downstream])
            breaker.observe(held)
            self._metrics.breaker_open.labels(downstream).set(1 if breaker.open else 0)
            if breaker.mode is Mode.OPEN and not held:
                self._spawn(self._hold(downstream, "forced open by an operator"))
            elif breaker.mode is Mode.CLOSED and held:
                self._spawn(self._release_hold(downstream))

    async def _read_modes(self) -> None:
        now = time.monotonic()
        if now - self._modes_read_s < self._settings.modes_refresh_s:
            return
        self._modes_read_s = now
        answer = (await self._queue.documents(BREAKERS, known_version=self._modes_version, stale_ok=True)).value
        if answer.changed:
            modes = {doc.name: _mode(doc.body) for doc in answer.documents}
            for downstream, breaker in self.breakers.items():
                breaker.mode = modes.get(downstream, Mode.AUTO)
            self._modes_version = answer.version
        if self._registry is not None:
            await self._read_tables(self._registry)

    async def _read_tables(self, registry: Registry) -> None:
        """Operators' classification tables (settings documents, validated by the API before they
        were stored); a downstream without one is classified by its default table."""
        answer = (await self._queue.documents(TABLES, known_version=self._tables_version, stale_ok=True)).value
        if not answer.changed:
            return
        tables: dict[str, ClassificationTable] = {}
        for doc in answer.documents:
            try:
                tables[doc.name] = decode_table(doc.body)
            except (ValueError, msgspec.DecodeError) as error:
                log.error("classification table %s in the store is invalid; keeping the default: %s", doc.name, error)
        registry.use_tables(tables)
        self._tables_version = answer.version
        log.info("classification tables in force: %s", ", ".join(sorted(tables)) or "the defaults")

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
    def _start(self, grant: Grant, *, probe: bool = False) -> None:
        self._limits.acquire(grant.kind)
        self.keeper.hold(grant.message_id, grant.token)
        self.leased += 1
        handler = self._handlers[grant.kind]
        self._metrics.in_flight.labels(handler.downstream).inc()
        self._metrics.lateness_seconds.labels(grant.kind).observe(
            grant_lateness_ms(grant, self._settings.lease_ms) / 1000
        )
        task = asyncio.create_task(self._attempt(grant, handler, probe), name=f"attempt-{grant.message_id}")
        self._running[grant.message_id] = Running(grant, task, probe)

    async def _attempt(self, grant: Grant, handler: Handler, probe: bool) -> None:
        decision: Decision | None = None
        try:
            decision = await self._decide(grant, handler)
            self._record(grant, handler.downstream, decision, probe)
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
        if decision.status is not None and f"HTTP {decision.status}" not in text:
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


_FAILURES: Final = frozenset(DOWNSTREAM_FAILURES)
TABLES: Final = "classification"
"""The settings documents' namespace of classification tables, one per downstream."""


def _mode(body: bytes) -> Mode:
    try:
        return Mode(msgspec.json.decode(body).get("mode", "auto"))
    except (ValueError, AttributeError, msgspec.DecodeError):
        log.warning('a breaker document is not {"mode": "auto|open|closed"}: %r', body[:100])
        return Mode.AUTO


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _first(*waits: object) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
