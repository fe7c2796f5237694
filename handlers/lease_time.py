"""What an attempt knows of time: its lease's end on the worker's monotonic clock, and the store's
clock bounded from both sides, without trusting the worker's wall clock at all.

Three instants anchor everything, all on the worker's monotonic clock except the store's stamps:
- `requested_s`: the moment the Lease command was sent. The store granted after it, so the lease
  the store holds ends no earlier than `requested_s + lease_ms` here (`send_by`): a worker that
  finds this passed (resumed after SIGSTOP, a long GC pause, a slow VM) must not write a request.
  A successful extension moves it to the moment the extension was sent plus `lease_ms`.
- `received_s`: the moment the grant arrived. The store's clock read `granted_ms` (the grant's
  deadline minus `lease_ms`) before that, so `granted_ms + (now - received_s)` is a lower bound of
  the store's clock now (`store_now_ms`), and `granted_ms + (now - requested_s)` an upper bound.
- the store's own deadline of the lease (`deadline_ms`, the grant's, then each extension's).

A request that must not take effect after the lease ends carries `expires_at_ms`: the store's
deadline of the lease, or sooner the attempt's own deadline (the upper bound of the store's clock
plus the gateway's attempt timeout). It is in the store's time, so the next delivery, perhaps on
another worker after this one died, can tell from the store's grant alone when it has passed.

The attempt reports how long what it sent stays in doubt as a duration (`in_doubt_report_ms`),
which the store adds to its own clock (capped at the lease's deadline): the latest expiry of a
request whose outcome is unknown (or still in flight when the attempt was cut off) minus the lower
bound of the store's clock, so the store's deadline is never earlier than the request's.

Must never: read the wall clock (its only clock is the injected monotonic one), or report less
than the time a request sent may still take effect.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

STANDALONE_LEASE_MS: Final = 3_600_000
"""`standalone`: a lease for a handler driven without a worker (a test, a tool)."""


@dataclass(slots=True, kw_only=True)
class LeaseTime:
    lease_ms: int
    requested_s: float
    received_s: float
    granted_ms: int
    deadline_ms: int
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    local_deadline_s: float = 0.0
    reports: bool = False
    """Whether the attempt reports its in-doubt time: set by a handler whose downstream's guarantee
    needs the next delivery to know it (expiry, none); otherwise the store assumes the lease's end."""
    in_doubt_until_ms: int | None = None
    """The latest expiry of a request whose outcome stayed unknown (store time)."""
    sending_ms: int | None = None
    """The expiry of the request being sent now, until its outcome is known."""

    def __post_init__(self) -> None:
        if not self.local_deadline_s:
            self.local_deadline_s = self.requested_s + self.lease_ms / 1000

    @classmethod
    def granted(
        cls, *, lease_ms: int, deadline_ms: int, requested_s: float, received_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> LeaseTime:  # fmt: skip
        """From a grant: the store's deadline is its time at the grant plus the lease asked for."""
        return cls(lease_ms=lease_ms, requested_s=requested_s, received_s=received_s,
                   granted_ms=deadline_ms - lease_ms, deadline_ms=deadline_ms, clock=clock)  # fmt: skip

    @classmethod
    def standalone(cls, *, now_ms: Callable[[], int] | None = None, lease_ms: int = STANDALONE_LEASE_MS) -> LeaseTime:
        """A lease starting now, with the wall clock standing in for the store's (tests, tools)."""
        now = time.monotonic()
        granted = now_ms() if now_ms is not None else time.time_ns() // 1_000_000
        return cls(lease_ms=lease_ms, requested_s=now, received_s=now, granted_ms=granted,
                   deadline_ms=granted + lease_ms)  # fmt: skip

    # ---- the lease -----------------------------------------------------------------------------
    def send_by(self) -> float:
        """The monotonic moment after which no byte of a request of this attempt may be written."""
        return self.local_deadline_s

    def lease_passed(self) -> bool:
        return self.clock() >= self.local_deadline_s

    def extended(self, *, sent_s: float, deadline_ms: int | None) -> None:
        """An extension sent at `sent_s` succeeded; the store's new deadline, if it said."""
        self.local_deadline_s = max(self.local_deadline_s, sent_s + self.lease_ms / 1000)
        if deadline_ms is not None:
            self.deadline_ms = max(self.deadline_ms, deadline_ms)

    # ---- the store's clock ---------------------------------------------------------------------
    def elapsed_s(self) -> float:
        """Seconds since the grant arrived: the store's clock has moved at least this far since the grant."""
        return self.clock() - self.received_s

    def store_now_ms(self) -> int:
        """A lower bound of the store's clock now."""
        return self.granted_ms + math.floor((self.clock() - self.received_s) * 1000)

    def store_now_upper_ms(self) -> int:
        """An upper bound of the store's clock now (while it runs at the rate of this one)."""
        return self.granted_ms + math.ceil((self.clock() - self.requested_s) * 1000)

    def expires_at_ms(self, within_s: float) -> int:
        """When a request written now must no longer take effect, in the store's time: `within_s`
        from now at the latest, and never after the lease's deadline."""
        return min(self.deadline_ms, self.store_now_upper_ms() + math.ceil(within_s * 1000))

    # ---- what was sent -------------------------------------------------------------------------
    def report(self) -> None:
        """This attempt reports its in-doubt time (0 when nothing it sent is in doubt)."""
        self.reports = True

    def sending(self, expires_at_ms: int) -> None:
        """A request that may take effect until `expires_at_ms` (store time) is about to be written."""
        self.sending_ms = expires_at_ms

    def settled(self, *, in_doubt: bool) -> None:
        """The request being sent came back: its outcome known (`in_doubt` False: an answer that
        says what happened, or certainly not sent) or not (a timeout, a cut connection, a 5xx)."""
        if in_doubt and self.sending_ms is not None:
            self.in_doubt_until_ms = max(self.in_doubt_until_ms or self.sending_ms, self.sending_ms)
        self.sending_ms = None

    def in_doubt_report_ms(self) -> int | None:
        """How long, as a duration for the store, what this attempt sent may still take effect:
        None when the attempt does not report; a request still being sent counts (a cut-off attempt)."""
        if not self.reports:
            return None
        until = max((t for t in (self.in_doubt_until_ms, self.sending_ms) if t is not None), default=None)
        if until is None:
            return 0
        return max(0, until - self.store_now_ms())  # the store caps it at the lease's deadline
