"""The dead-letter list's count and totals: asks of one filter share reads, at most one in flight
per filter in this process, and every answer comes from a read that started after it was asked.

Why: a summary is one aggregate over every dead letter the filter matches, parsing each payload's
amount (bench/review.py: about 300 ms over 100,000 dead letters), and the store answers it on its
apply thread, so while it runs no entry is applied there and intake waits. During a payment
outage, when the tier is largest, every reviewer refreshes the list. Sharing reads bounds what they
cost the store: however many ask, one read of a filter runs at a time, and everyone who asked while
it ran shares the next one. A cache with a time to live would cost even less, but the list would
then show rows a moment newer than its count (a dead letter in the table, not in the total), which
is the kind of mismatch a finance reviewer must never have to explain; so every answer is a read
that started after the ask, as the token cache does for unknown tokens (api/auth.py).

Must never: answer an ask with a read that started before it; keep state for an idle filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from queues import DeadLetterFilter, DeadLetterSummary, QueueClient


@dataclass(frozen=True, slots=True)
class Summary:
    value: DeadLetterSummary
    read_at_s: float
    """When the store answered, on `time.time()`'s scale (the page shows it)."""


class _Flights:
    """One filter's reads: the one running, and the one planned after it."""

    __slots__ = ("planned", "running")

    def __init__(self) -> None:
        self.running: asyncio.Task[Summary] | None = None
        self.planned: asyncio.Task[Summary] | None = None


class SummaryReads:
    def __init__(self, queue: QueueClient, *, wall: Callable[[], float] = time.time) -> None:
        self._queue = queue
        self._wall = wall
        self._flights: dict[DeadLetterFilter, _Flights] = {}
        self.reads = 0
        """Summaries asked of the store by this process (tests read it to see reads shared)."""

    async def get(self, dead_filter: DeadLetterFilter) -> Summary:
        flights = self._flights.setdefault(dead_filter, _Flights())
        if flights.planned is not None:  # not asked of the store yet: its read starts after this ask
            task = flights.planned
        elif flights.running is None:
            task = flights.running = self._start(dead_filter, flights, after=None)
        else:  # the running read started before this ask: share the next one
            task = flights.planned = self._start(dead_filter, flights, after=flights.running)
        return await asyncio.shield(task)

    def _start(self, dead_filter: DeadLetterFilter, flights: _Flights, after: asyncio.Task[Summary] | None) -> asyncio.Task[Summary]:
        task = asyncio.get_running_loop().create_task(self._read(dead_filter, flights, after))
        task.add_done_callback(lambda done: self._finished(dead_filter, flights, done))
        return task

    async def _read(self, dead_filter: DeadLetterFilter, flights: _Flights, after: asyncio.Task[Summary] | None) -> Summary:
        if after is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(after)
            flights.running, flights.planned = flights.planned, None
        self.reads += 1
        answer = (await self._queue.dead_letter_summary(dead_filter)).value
        return Summary(answer, self._wall())

    def _finished(self, dead_filter: DeadLetterFilter, flights: _Flights, done: asyncio.Task[Summary]) -> None:
        if flights.running is done:
            flights.running = None
        if flights.running is None and flights.planned is None and self._flights.get(dead_filter) is flights:
            del self._flights[dead_filter]
        if not done.cancelled():
            done.exception()  # retrieved here: a failed read is its askers' error, never logged as unhandled

    def __len__(self) -> int:
        return len(self._flights)
