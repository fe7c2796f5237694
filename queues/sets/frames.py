"""One set's intake frames: at most one on its way, what arrives meanwhile goes in the next.

Why: the queue client gathers the commands of one event-loop turn into one frame and one log
entry (queues/client.py, `_Coalescer`). With one set a turn's answers release all the callers at
once and they come back together, so entries stay large under load (256 commands each at 256
callers, docs/benchmarks.md). With three sets the answers of the three sets release the callers in
three turns, each turn's posts are split three ways by key, and each set's entries shrink to a
tenth of that (26 per entry): the per-entry costs of the leader and both followers (a frame, a WAL
record, an fsync's share, an apply's transaction) are paid ten times as often, and CPU per request
grows by most of it. Holding a set's next frame while one is in flight is group commit at the
client: under load every set's frame carries everything routed to it during one round trip, as one
set's does; with nothing in flight a command leaves at the end of its turn, as before.

Semantics are the client's own: a frame's commands share its fate (one error for all of them,
`OutcomeUnknown` or `Unavailable`), each command's answer is its own result. A command waits for
the frame ahead of it at most `HOLD_MAX_S`, then goes anyway: a frame that slow is a set in
trouble (a lost majority waits out the client's deadline), and its keys must be answered within
one deadline as before, not two. Each set has its own frames, so a set never delays another's.

Must never: reorder a caller's commands, or let one frame's failure answer commands of another.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Final

from queues.client import COALESCE_COMMANDS_MAX, QueueClient
from queues.model import QueueCommand, QueueResult

IN_FLIGHT: Final = 1
"""Frames on their way to one set at once. One is enough to keep a set's leader busy under load
(the leader pipelines every client's frames; this is one client of many), and it is what keeps
the frames as large as one set's."""

HOLD_MAX_S: Final = 0.2
"""The longest a command waits for the frame ahead of it: above a loaded set's p99 round trip on
this 2-core machine (90 ms, docs/benchmarks.md), far below a client's deadline (5 s)."""

_Waiting = tuple[Sequence[QueueCommand], "asyncio.Future[list[QueueResult]]"]


class HeldFrames:
    """The frames of one process to one set (see the module docstring)."""

    def __init__(
        self, client: QueueClient, *, in_flight: int = IN_FLIGHT, limit: int = COALESCE_COMMANDS_MAX,
        hold_max_s: float = HOLD_MAX_S,
    ) -> None:  # fmt: skip
        self.client = client
        self._in_flight = in_flight
        self._hold_max_s = hold_max_s
        self._overdue: asyncio.TimerHandle | None = None
        self._limit = limit
        self._waiting: deque[_Waiting] = deque()
        self._flying = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.frames = 0  # frames sent, for the benchmarks and tests
        self.commands = 0

    async def submit_many(self, commands: Sequence[QueueCommand]) -> list[QueueResult]:
        """The commands' results, in order; they travel in one frame with whatever else waits."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[QueueResult]] = loop.create_future()
        self._waiting.append((commands, future))
        if self._flying < self._in_flight:
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._flush)  # the end of this turn: its other callers come along
        elif self._overdue is None:
            self._overdue = loop.call_later(self._hold_max_s, self._flush, True)
        return await future

    def _flush(self, overdue: bool = False) -> None:
        """Send what waits, as far as the frames in flight allow (all of it when it waited
        `hold_max_s`)."""
        if overdue:
            self._overdue = None
        else:
            self._scheduled = False
        loop = asyncio.get_running_loop()
        while self._waiting and (overdue or self._flying < self._in_flight):
            batch: list[_Waiting] = []
            size = 0
            while self._waiting and (not batch or size + len(self._waiting[0][0]) <= self._limit):
                waiting = self._waiting.popleft()
                batch.append(waiting)
                size += len(waiting[0])
            self._flying += 1
            task = loop.create_task(self._send(batch))
            self._tasks.add(task)  # a strong reference until it is done
            task.add_done_callback(self._tasks.discard)
        if not self._waiting and self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None

    async def _send(self, batch: list[_Waiting]) -> None:
        commands = [command for part, _ in batch for command in part]
        self.frames += 1
        self.commands += len(commands)
        try:
            results = await self.client.submit_many(commands)
        except BaseException as error:  # the whole frame's outcome: each of its callers gets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        finally:
            self._flying -= 1
            if self._waiting:
                self._flush()
        start = 0
        for part, future in batch:
            if not future.done():
                future.set_result(results[start : start + len(part)])
            start += len(part)


__all__ = ["HOLD_MAX_S", "IN_FLIGHT", "HeldFrames"]
