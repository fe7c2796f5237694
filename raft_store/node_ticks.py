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
    """Tick n falls at `origin + (n + dropped) * tick_ms`; `delivered` ticks have been given to the
    core; `dropped` ticks were lost to stalls (below)."""

    def __init__(self, tick_ms: int, wake: Callable[[], None]) -> None:
        self._interval = tick_ms / 1000
        self._wake = wake
        self._loop: asyncio.AbstractEventLoop | None = None
        self._origin = 0.0
        self.delivered = 0
        self.dropped = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick = 0
        self._held = False  # a passed deadline put off for one turn, for the inputs of a stall

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()

    def _now(self) -> int:
        assert self._loop is not None
        # A twentieth of a tick early still counts: the loop's timers fire on whole milliseconds.
        return int((self._loop.time() - self._origin) / self._interval + 0.05) - self.dropped

    def deliver(self, core: RaftCore) -> None:
        """Every tick whose time has come, in order. After a stall (the loop ran late: the process
        was starved of CPU, a long pause), the Raft clock stands still with the loop, as a node's
        own ticker did: of the ticks past the core's next deadline one is kept and the rest are
        dropped, and that deadline is checked only after the inputs that arrived meanwhile were
        stepped (the quiet ticks now, the due one next turn). Which came first, a follower's
        heartbeat or its election timeout, a leader's answers or its check-quorum, cannot be
        known after a stall; taking the messages first keeps a starved but healthy set from
        electing or stepping down for nothing. A node that was not running could not have seen
        its peers fail either: detection resumes where it stood, within one election timeout."""
        now = self._now()
        while self.delivered < now:
            due = self.delivered + core.ticks_until_due()
            if now > due + 1:
                self.dropped += now - (due + 1)
                now = due + 1
            for _ in range(min(due, now + 1) - 1 - self.delivered):  # the quiet ones
                self.delivered += 1
                core.tick()
            if due > now:
                self._held = False
                return
            if due < now and not self._held:  # passed during a stall: the inputs first
                self._held = True
                assert self._loop is not None
                self._loop.call_soon(self._wake)
                return
            self._held = False
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
        self._timer = self._loop.call_at(self._origin + (due + self.dropped) * self._interval, self._went_off)

    def _went_off(self) -> None:
        self._timer = None
        self._wake()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


__all__ = ["Ticks"]
