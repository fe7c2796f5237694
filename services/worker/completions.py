"""Acks, fails and releases, batched by what is waiting: one frame in flight at a time (one log
entry, one fsync), acks as one AckMany, each fail and release as a command of its own beside it.

The Nagle trade-off, tuned by what is waiting rather than by a timer: a completion goes to the
store at once when no frame is in flight and few attempts are running (after the event loop's
current turn, so the attempts that finished in that turn share its frame); the completions that
finish while a frame is in flight wait for its answer and go together; and while many attempts
run (`busy`: more completions are moments away) the first of a batch lingers `linger_s` for them,
as PostgreSQL's commit_delay does only with commit_siblings. An idle worker acks in one store
round trip; a busy one sends one frame per round trip or linger, as large as what finished.

Under load they ride with the lane's next lease (`take`, lanes.py): an attempt that ends frees a
slot, and a lane with a backlog leases that slot again a linger later, so the lease frame carries
the settlements of the attempts whose slots it refills: one frame and one log entry for both,
where a frame of acks and a frame of leases went apart before (the leader joins two frames only
when they arrive in the same turn of its loop). While the lane will lease soon (`carried`) the
pending completions wait up to `carry_wait_s()` for that lease (a linger; a turn's hold while
the lanes take turns, turns.py), then go on their own; a lane that
has nothing to lease, is draining or cannot reach its set leaves them to this loop, as before.

A frame whose answer is lost is sent again. That is safe without session lanes to protect it:
the machine fences every one of these by the lease's token, so a second ack is ALREADY_ACKED, a
second fail or release is refused (the message is no longer leased: ILLEGAL_STATE, or STALE_TOKEN
once another lease holds it), and nothing is applied twice.

Must never: drop a completion without an answer from the store (it is retried until the worker
stops; after that its lease expires and another worker retries the message, which is safe too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from queues import ClientError, Code, QueueClient, QueueError
from queues.model import (
    BATCH_IDS_MAX,
    TEXT_LENGTH_MAX,
    Ack,
    AckMany,
    Fail,
    Outcome,
    Outcomes,
    QueueCommand,
    QueueResult,
    Release,
)

log = logging.getLogger("compensator.worker")
RETRY_BACKOFF_MAX_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Completion:
    """One settled attempt, as the store is told it."""

    message_id: int
    token: int
    kind: str
    action: str
    """ack, fail or release."""
    command: Ack | Fail | Release


Settled = Callable[[Completion, Code], None]


class Completions:
    def __init__(
        self, queue: QueueClient, *, on_settled: Settled, frame_max: int = 2000, linger_s: float = 0.005,
        busy: Callable[[], bool] = lambda: False, carried: Callable[[], bool] = lambda: False,
        carry_wait_s: Callable[[], float] = lambda: 0.005,
    ) -> None:  # fmt: skip
        self._queue = queue
        self._on_settled = on_settled
        self._frame_max = frame_max
        self._linger_s = linger_s
        self._busy = busy
        self._carried = carried
        self._carry_wait_s = carry_wait_s
        """Under load: the lane leases again within a linger (it has a backlog), so its lease frame
        can carry what is pending."""
        self._carrying = 0
        """Batches taken by a lease frame and not yet answered."""
        self._taken = asyncio.Event()
        self._pending: list[Completion] = []
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def use(self, queue: QueueClient) -> None:
        """Send through `queue` from the next call on (the set moved: SetLane.use)."""
        self._queue = queue

    def ack(self, message_id: int, token: int, kind: str, summary: str) -> None:
        self._add(Completion(message_id, token, kind, "ack",
                             Ack(message_id=message_id, token=token, summary=summary[:TEXT_LENGTH_MAX])))  # fmt: skip

    def fail(
        self,
        message_id: int,
        token: int,
        kind: str,
        *,
        error_class: str,
        error_text: str,
        permanent: bool,
        retry_after_ms: int | None,
        in_doubt_ms: int | None = None,
    ) -> None:
        """`retry_after_ms`: a duration; the store adds it to its own time (never this worker's clock)."""
        command = Fail(message_id=message_id, token=token, error_class=error_class,
                       error_text=error_text[:TEXT_LENGTH_MAX], permanent=permanent, retry_after_ms=retry_after_ms,
                       in_doubt_ms=in_doubt_ms)  # fmt: skip
        self._add(Completion(message_id, token, kind, "fail", command))

    def release(self, message_id: int, token: int, kind: str, *, interrupted: bool, in_doubt_ms: int | None = None) -> None:
        self._add(Completion(message_id, token, kind, "release",
                             Release(message_id=message_id, token=token, interrupted=interrupted,
                                     in_doubt_ms=in_doubt_ms if interrupted else None)))  # fmt: skip

    def _add(self, completion: Completion) -> None:
        self._pending.append(completion)
        self._idle.clear()
        self._wake.set()
        self._arrived.set()

    async def arrival(self, timeout_s: float) -> bool:
        """Until a completion is pending, at most `timeout_s`: a lease that would go alone waits for
        one to carry (lanes.py). True if one is pending."""
        if not self._pending:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
        return bool(self._pending)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        """Flush whenever something is pending and no frame is in flight (the one awaited here)."""
        backoff_s = 0.05
        while True:
            await self._wake.wait()
            # The rest of this loop turn's completions join the frame; under load, a linger's.
            busy = self._busy()
            await asyncio.sleep(self._linger_s if busy else 0)
            if busy and self._pending and self._carried():
                # The lane's next lease is a linger away and takes them along (`take`): one frame
                # for both. What it has not taken by then goes on its own.
                self._taken.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._taken.wait(), self._carry_wait_s())
            try:
                await self.flush()
                backoff_s = 0.05
            except (ClientError, QueueError) as error:
                log.warning("could not settle %d attempts (will retry): %s", len(self._pending), error)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    async def drained(self) -> None:
        await self._idle.wait()

    # ---- carried by a lease ----------------------------------------------------------------------
    def take(self) -> list[Completion]:
        """What is pending, for a frame the lane sends anyway (its lease); answered through
        `carried`, or handed back through `not_carried` when that frame fails."""
        batch, self._pending = self._pending[: self._frame_max], self._pending[self._frame_max :]
        if not self._pending:
            self._wake.clear()
        if batch:
            self._carrying += 1
            self._taken.set()
        return batch

    def carried(self, batch: list[Completion], results: Sequence[QueueResult]) -> None:
        """The store's answers to a taken batch's commands (`commands(batch)`, in that order)."""
        if not batch:
            return
        try:
            codes = self._codes(batch, results)
        except QueueError:
            self.not_carried(batch)
            raise
        self._carrying -= 1
        for completion, code in zip(batch, codes, strict=True):
            self._on_settled(completion, code)
        self._idle_if_done()

    def not_carried(self, batch: list[Completion]) -> None:
        """The frame that carried a taken batch failed: in doubt, sent again (fenced by its token)."""
        if not batch:
            return
        self._carrying -= 1
        self._pending[:0] = batch
        self._wake.set()

    def _idle_if_done(self) -> None:
        if not self._pending and not self._carrying:
            self._idle.set()

    # ---- sent on their own -----------------------------------------------------------------------
    async def flush(self) -> None:
        batch, self._pending = self._pending[: self._frame_max], self._pending[self._frame_max :]
        if not self._pending:
            self._wake.clear()
        if not batch:
            self._idle_if_done()
            return
        try:
            codes = self._codes(batch, await self._queue.submit_many(commands(batch)))
        except BaseException:
            self._pending[:0] = batch  # in doubt: sent again, and fenced by its token if it had landed
            self._wake.set()
            raise
        for completion, code in zip(batch, codes, strict=True):
            self._on_settled(completion, code)
        self._idle_if_done()

    @staticmethod
    def _codes(batch: list[Completion], results: Sequence[QueueResult]) -> list[Code]:
        acks = [c for c in batch if c.action == "ack"]
        others = [c for c in batch if c.action != "ack"]
        codes: dict[int, Code] = {}
        ack_outcomes = [o for r in results if isinstance(r, Outcomes) for o in r.outcomes]
        for completion, outcome in zip(acks, ack_outcomes, strict=True):
            codes[id(completion)] = outcome.code
        for completion, result in zip(others, results[len(results) - len(others) :], strict=True):
            if not isinstance(result, Outcome):
                raise QueueError(f"expected an outcome for {completion.action}, got {result!r}")
            codes[id(completion)] = result.code
        return [codes[id(c)] for c in batch]


def commands(batch: Sequence[Completion]) -> list[QueueCommand]:
    """A batch as the store is told it: its acks as AckMany commands, then each fail and release."""
    acks = [c.command for c in batch if c.action == "ack"]
    found: list[QueueCommand] = [
        AckMany(acks=tuple(acks[i : i + BATCH_IDS_MAX]))  # type: ignore[arg-type]
        for i in range(0, len(acks), BATCH_IDS_MAX)
    ]
    return found + [c.command for c in batch if c.action != "ack"]
