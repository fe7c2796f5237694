"""The node's ticks: counted by the clock, handed to the core when one is due, not every period.

Why: a node ticking every `tick_ms` (30 ms) woke 33 times a second whatever it had to do, and an
idle set of three paid for 100 wakes a second of which only the leader's heartbeats (one tick in
two) did anything: on a machine that runs many sets that is the sets' standing cost. The core says
how many ticks may pass with nothing but its counters moving (`RaftCore.ticks_until_due`): a
follower's next deadline is its election timeout, a leader's its next heartbeat. So one timer is
armed for that tick, and every tick whose time has come is delivered, in order, before the node
steps any other input. The core sees the same ticks between the same messages as with a ticker
(ticks are numbered from the start by the monotonic clock, never skipped), so failure detection
is unchanged: a leader's heartbeats and check-quorum, a follower's election timeout, fire on the
same tick as before. The simulator checks the core's answer on every tick it runs
(raft_store/simulation/cluster.py, `_tick_view`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raft_store.core import RaftCore


class Ticks:
    """Tick n falls at `origin + n * tick_ms`; `delivered` ticks have been given to the core."""

    def __init__(self, tick_ms: int, wake: Callable[[], None]) -> None:
        self._interval = tick_ms / 1000
        self._wake = wake
        self._loop: asyncio.AbstractEventLoop | None = None
        self._origin = 0.0
        self.delivered = 0
        self._fired = 0  # the latest tick whose timer went off (the loop's clock may read a hair early)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()

    def deliver(self, core: RaftCore) -> None:
        """Every tick whose time has come, in order."""
        assert self._loop is not None
        now = max(self._fired, int((self._loop.time() - self._origin) / self._interval))
        while self.delivered < now:
            self.delivered += 1
            core.tick()

    def arm(self, core: RaftCore) -> None:
        """A timer for the core's next due tick, unless one is armed for it or before it. A timer
        armed for a tick the core has since put off (a follower heard its leader) goes off early,
        delivers the ticks that have passed, and is armed again."""
        assert self._loop is not None
        due = self.delivered + core.ticks_until_due()
        if self._timer is not None:
            if self._timer_tick <= due:
                return
            self._timer.cancel()
        self._timer_tick = due
        self._timer = self._loop.call_at(self._origin + due * self._interval, self._went_off, due)

    def _went_off(self, tick: int) -> None:
        self._timer = None
        self._fired = max(self._fired, tick)
        self._wake()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


__all__ = ["Ticks"]
