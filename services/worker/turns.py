"""A busy worker's lanes take turns to lease: one Lease frame on its way at a time across the sets.

Why: a worker's rate of lease frames is set by its round trips, not by its number of sets. Each
lane leases the slots freed since its last lease, so with three sets leasing independently a
worker sends about as many lease frames per second as with one, each set's carrying a third of
the grants and of the settlements that ride with them (lanes.py), and every frame is a log entry
with its fsync on three replicas and six messages (docs/benchmarks.md, "Fewer, fuller entries per
set"). Taking turns, a set's lease waits for the other sets' frames, so it carries what finished
and freed meanwhile in that set: per set, about one frame per turn of all the sets, as full as one
set's. Only while the worker is busy (`active`): with few attempts running a lease goes at once,
so light load waits for nothing.

A turn is handed to the lane that asked first. A lane that keeps its turn longer than `hold_s` (its
set is slow or down: its calls wait out the client's deadline) loses it to the next, so a set in
trouble delays the others by at most `hold_s` per lease of its own, and it backs off between
those (lanes.py, `ERROR_BACKOFF_MAX_S`).

Must never: leave a lane waiting with no turn held, or hold a turn that nobody releases.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Final

HOLD_S: Final = 0.1
"""The longest one lane's lease keeps the others waiting: above a busy set's usual round trip on
this 2-core machine (10-30 ms), far below a client's deadline (5 s)."""


class Turns:
    def __init__(self, *, active: Callable[[], bool], hold_s: float = HOLD_S) -> None:
        self._active = active
        self._hold_s = hold_s
        self._holder: int | None = None
        self._numbers = 0
        self._timer: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[int]] = deque()
        self.waited = 0
        """Turns that had to wait for another lane's (for the tests and the benchmarks)."""

    def active(self) -> bool:
        return self._active()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        number = await self._acquire()
        try:
            yield
        finally:
            if number is not None:
                self._release(number)

    async def _acquire(self) -> int | None:
        if not self._active():
            return None
        if self._holder is None and not self._waiters:
            return self._take()
        self.waited += 1
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(future.result())  # handed over as it was cancelled: pass it on
            else:
                self._waiters.remove(future)
            raise

    def _take(self) -> int:
        self._numbers += 1
        self._holder = self._numbers
        self._timer = asyncio.get_running_loop().call_later(self._hold_s, self._release, self._holder)
        return self._holder

    def _release(self, number: int) -> None:
        if self._holder != number:
            return  # released already: its hold ran out and the turn went on
        self._holder = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._take())
                return
