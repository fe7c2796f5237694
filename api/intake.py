"""From validated submissions to stored requests, and from the store's answers to HTTP answers.

Exactly once per key comes from the store: a request is stored under ``{producer}:{key}`` (keys are
per producer, as the IETF idempotency-key draft has them per client), and the store answers OK
for the first, EXISTS for the same kind, ref key and payload again, CONFLICT for another. The
store compares only what is stored as the message; the draft asks that *the same body* be
recognised, so a fingerprint of the whole validated body travels in the message's headers and an
EXISTS is answered 200 (a replay, with the original's current state) only when it matches, and
422 otherwise. Nothing is created in either case.

The store call's own failures are told apart, because the caller's next step differs:
`Unavailable` (the request certainly was not stored: retry) and `OutcomeUnknown` (it may have
been: retry *with the same key*). Both are 503 with Retry-After; neither is ever a 500.

Must never: answer 201 before the store acknowledged (a majority fsynced the entry), or read a
clock other than the injected one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import propagate, trace

from api.auth import Principal
from api.problems import Problem, problem_of
from api.schemas import utc
from ledger.request_ids import RequestId
from ledger.states import LEDGER_STATE_OF
from queues import (
    ClientError,
    Code,
    Enqueue,
    EnqueueResult,
    MessageView,
    OutcomeUnknown,
    QueueClient,
    QueueError,
    SetsClient,
    State,
    Unavailable,
)
from submission.models import AnySubmission
from submission.rules import HEADER_FINGERPRINT, Invalid, build_enqueue

RETRY_AFTER_S: Final = "1"


@dataclass(frozen=True, slots=True)
class Item:
    key: str
    """The producer's Idempotency-Key, as sent."""
    submission: AnySubmission


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    document: dict[str, Any] | None = None
    problem: Problem | None = None
    location: str | None = None


def store_failure(error: ClientError | QueueError) -> Problem:
    retry = {"Retry-After": RETRY_AFTER_S}
    if isinstance(error, QueueError):
        return Problem("invalid-request", f"the store refused the request: {error}")
    if isinstance(error, Unavailable):
        return Problem("store-unavailable", "no store leader took the request; nothing was stored", headers=retry)
    reason = "no answer" if isinstance(error, OutcomeUnknown) else "the store call failed"
    return Problem(
        "outcome-unknown", f"{reason}: the request may or may not be stored; retry with the same Idempotency-Key",
        headers=retry,
    )  # fmt: skip


class Intake:
    def __init__(
        self, queue: QueueClient, *, set_id: int, clock_ms: Callable[[], int], tracer: trace.Tracer,
        callback_targets: Collection[str] = (),
        observe_store_s: Callable[[str, float], None] = lambda operation, seconds: None,
        perf_clock_s: Callable[[], float] = time.perf_counter, sets: SetsClient | None = None,
    ) -> None:
        self._queue = queue
        self._sets = sets
        """Many sets (store.control_addresses): each key goes to its home set (docs/sets.md)."""
        self._callback_targets = frozenset(callback_targets)
        """The registered callback targets (handlers.callback.targets): a callback to another is refused."""
        self._set_id = set_id
        self._clock_ms = clock_ms
        self._tracer = tracer
        self._observe = observe_store_s
        self._perf = perf_clock_s

    def public_id(self, message_id: int) -> str:
        return str(RequestId(self._set_id, message_id))

    def _queue_of(self, set_id: int) -> QueueClient:
        return self._queue if self._sets is None else self._sets.client(set_id)

    def command(self, principal: Principal, item: Item, trace_headers: dict[str, str]) -> Enqueue | Problem:
        try:
            return build_enqueue(producer=principal.name, key=item.key, submission=item.submission,
                                 trace_headers=trace_headers, now_ms=self._clock_ms(),
                                 callback_targets=self._callback_targets)  # fmt: skip
        except Invalid as refused:
            return problem_of(refused)

    def _accepted(
        self, set_id: int, message_id: int, kind: str, ref_key: str, state: State, due_ms: int, replayed: bool
    ) -> Answer:
        public = str(RequestId(set_id, message_id))
        document = {
            "id": public, "kind": kind, "ref_key": ref_key, "state": state.value,
            "ledger_state": LEDGER_STATE_OF[state.value].value, "due_at": utc(due_ms), "replayed": replayed,
        }  # fmt: skip
        return Answer(200 if replayed else 201, document, location=f"/v1/requests/{public}")

    async def submit(self, principal: Principal, items: Sequence[Item | Problem]) -> list[Answer]:
        """Each item's answer, in order. Valid items go to the store in one frame (a single
        submission joins the frames of concurrent ones through the client's coalescing)."""
        answers: list[Answer | None] = [None] * len(items)
        commands: list[tuple[int, Enqueue]] = []
        # A child span only under a recorded one: an unrecorded trace still travels into the
        # message (its ids), and this is the intake's hot path.
        recording = trace.get_current_span().is_recording()
        spanned = self._tracer.start_as_current_span(
            "store.enqueue", kind=trace.SpanKind.CLIENT,
            attributes={"compensator.items": len(items), "compensator.producer": principal.name},
        ) if recording else contextlib.nullcontext(trace.INVALID_SPAN)  # fmt: skip
        with spanned as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            for index, item in enumerate(items):
                built = item if isinstance(item, Problem) else self.command(principal, item, carrier)
                if isinstance(built, Problem):
                    answers[index] = Answer(built.type.status, problem=built)
                else:
                    commands.append((index, built))
            if len(commands) == 1:
                span.set_attribute("compensator.ref_key", commands[0][1].ref_key)
            results = await self._enqueue([command for _, command in commands])
        if isinstance(results, Problem):
            for index, _ in commands:
                answers[index] = Answer(results.type.status, problem=results)
        else:
            await self._answer(items, commands, results, answers)
        return [answer for answer in answers if answer is not None]

    async def _enqueue(self, commands: list[Enqueue]) -> list[tuple[int, EnqueueResult | Problem]] | Problem:
        if self._sets is not None:
            return await self._enqueue_routed(commands)
        found = await self._enqueue_one_set(commands)
        return found if isinstance(found, Problem) else [(self._set_id, result) for result in found]

    async def _enqueue_routed(self, commands: list[Enqueue]) -> list[tuple[int, EnqueueResult | Problem]]:
        """Each command in its key's home set; a set that failed fails only its own items."""
        assert self._sets is not None
        if not commands:
            return []
        started = self._perf()
        try:
            placed = await self._sets.enqueue_many(commands)
        finally:
            self._observe("enqueue", self._perf() - started)
        return [(s, r if isinstance(r, EnqueueResult) else store_failure(r)) for s, r in placed]

    async def _enqueue_one_set(self, commands: list[Enqueue]) -> list[EnqueueResult] | Problem:
        if not commands:
            return []
        started = self._perf()
        try:
            if len(commands) == 1:
                result = await self._queue.submit(commands[0])
                if not isinstance(result, EnqueueResult):
                    raise QueueError(f"expected an enqueue result, got {result!r}")
                return [result]
            return await self._queue.enqueue_many(commands)
        except (ClientError, QueueError) as error:
            return store_failure(error)
        finally:
            self._observe("enqueue", self._perf() - started)

    async def _answer(
        self, items: Sequence[Item | Problem], commands: list[tuple[int, Enqueue]],
        results: list[tuple[int, EnqueueResult | Problem]], answers: list[Answer | None],
    ) -> None:  # fmt: skip
        existing: list[tuple[int, Enqueue, int, EnqueueResult]] = []
        for (index, command), (set_id, result) in zip(commands, results, strict=True):
            if isinstance(result, Problem):
                answers[index] = Answer(result.type.status, problem=result)
            elif result.code is Code.OK and result.state is not None and result.due_ms is not None:
                answers[index] = self._accepted(
                    set_id, result.message_id, command.kind, command.ref_key, result.state, result.due_ms, False
                )
            elif result.code is Code.EXISTS:
                existing.append((index, command, set_id, result))
            elif result.code is Code.CONFLICT:
                answers[index] = Answer(422, problem=_reused())
            else:
                problem = Problem("invalid-request", f"the store refused the request: {result.code.name}")
                answers[index] = Answer(problem.type.status, problem=problem)
        if existing:
            await self._replays(existing, answers)

    async def _replays(
        self, existing: list[tuple[int, Enqueue, int, EnqueueResult]], answers: list[Answer | None]
    ) -> None:
        """EXISTS: a replay when the stored body's fingerprint is this body's, else key reuse."""
        views: dict[tuple[int, int], MessageView] = {}
        for set_id in sorted({set_id for _, _, set_id, _ in existing}):
            started = self._perf()
            try:
                ids = [result.message_id for _, _, s, result in existing if s == set_id]
                found = (await self._queue_of(set_id).get_many(ids, with_history=False)).value
                views.update(((set_id, v.message_id), v) for v in found)
            except (ClientError, QueueError) as error:
                problem = store_failure(error)
                for index, _, s, _ in existing:
                    if s == set_id:
                        answers[index] = Answer(problem.type.status, problem=problem)
            finally:
                self._observe("replay_read", self._perf() - started)
        for index, command, set_id, result in existing:
            if answers[index] is not None:
                continue
            view: MessageView | None = views.get((set_id, result.message_id))
            if view is None:  # purged between the enqueue and this read: the key is free again
                problem = Problem("store-unavailable", "the original request ended as this was answered; retry",
                                  headers={"Retry-After": RETRY_AFTER_S})  # fmt: skip
                answers[index] = Answer(problem.type.status, problem=problem)
            elif view.headers.get(HEADER_FINGERPRINT) != command.headers[HEADER_FINGERPRINT]:
                answers[index] = Answer(422, problem=_reused())
            else:
                answers[index] = self._accepted(
                    set_id, view.message_id, view.kind, view.ref_key, view.state, view.due_ms, True
                )


def _reused() -> Problem:
    return Problem("idempotency-key-reused", "this Idempotency-Key was used with a different body; nothing was created")
