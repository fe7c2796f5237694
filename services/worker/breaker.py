"""A circuit breaker per downstream, shared by every worker through the store.

Open is a fact in the store: each kind that calls the downstream is paused by the holder
``breaker:<downstream>``, so every worker stops leasing them at once (and a worker that dies holds
nothing). Each worker keeps what it saw itself: its attempts of the last `window_s`; when at least
`attempts_min` of them were made and `failure_ratio` of them failed *because of the downstream*
(timeouts, lost connections, 5xx, 429, refused connections; a business refusal such as
insufficient funds is the downstream working), it opens the breaker for everyone.

While open, each worker probes now and then (every `probe_every_s`, stretched by a random factor
so workers do not probe together): it leases one message of the paused kinds, which the store
allows a lease naming the breaker as its `probe` while the breaker is the kind's only holder (an
operator's own pause is respected). A probe the downstream answers (success, or a business
refusal) closes the breaker for everyone.

Closing is not "the whole backlog at once": Temporal's docs warn that resuming many activities
together overwhelms a recovering service. Every worker that sees the breaker close starts its own
ramp after a random delay of up to `ramp_jitter_s`: it may start `ramp_start_per_s` attempts a
second at first, doubling every `ramp_double_s`, until `ramp_until_per_s`, after which its limits
alone apply.

An operator forces a breaker through a settings document (namespace "breakers", name the
downstream): mode "open" holds the pause and never probes, "closed" never trips (and releases the
breaker's pause), "auto" is the default.

Must never: read a clock or a random source it was not given, or count a permanent refusal as the
downstream failing.
"""

from __future__ import annotations

import collections
import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

DOWNSTREAM_FAILURES: Final = frozenset(
    {"timeout", "connection_lost", "connect_failed", "server_error", "rate_limited", "request_timeout"}
)
"""Error classes that say the downstream itself is failing: the gateway's (handlers/answers.py:
no connection, no answer) and the default tables' for 5xx, 429 and 408 (handlers/tables.py). Not
`pool_exhausted` or `deadline`: those are this worker's own connections all busy."""
NAMESPACE: Final = "breakers"


class Mode(enum.StrEnum):
    AUTO = "auto"
    OPEN = "open"
    CLOSED = "closed"


def holder(downstream: str) -> str:
    return f"breaker:{downstream}"


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSettings:
    window_s: float = 10.0
    attempts_min: int = 50
    failure_ratio: float = 0.5
    probe_every_s: float = 1.0
    ramp_start_per_s: float = 5.0
    ramp_double_s: float = 2.0
    ramp_until_per_s: float = 1000.0
    ramp_jitter_s: float = 1.0

    def validate(self) -> None:
        if not (self.window_s > 0 and self.attempts_min >= 1 and 0 < self.failure_ratio <= 1):
            raise ValueError("breaker: window_s > 0, attempts_min >= 1, failure_ratio in (0, 1]")
        if not (
            self.probe_every_s > 0 and 0 < self.ramp_start_per_s <= self.ramp_until_per_s and self.ramp_double_s > 0
        ):
            raise ValueError("breaker: probe_every_s > 0, 0 < ramp_start_per_s <= ramp_until_per_s, ramp_double_s > 0")


class Breaker:
    """One downstream's breaker as one worker sees and drives it."""

    def __init__(
        self, downstream: str, settings: BreakerSettings, *, clock: Callable[[], float], rng: random.Random
    ) -> None:
        self.downstream = downstream
        self.settings = settings
        self._clock = clock
        self._rng = rng
        self._outcomes: collections.deque[tuple[float, bool]] = collections.deque()
        self._failed = 0
        """How many of `_outcomes` failed because of the downstream: kept as they come and go, so
        a worker's check after every attempt costs the same whatever the window holds (recounting
        it after every attempt was 11-12 % of a loaded worker's CPU in bench.e2e)."""
        self.mode = Mode.AUTO
        self.open = False
        """As the store last said (or as this worker just made it)."""
        self._next_probe_s = 0.0
        self._ramp_from_s: float | None = None
        self._ramp_taken = 0.0
        self.trips = 0
        self.probes = 0

    # ---- what happened -------------------------------------------------------------------------
    def record(self, error_class: str | None) -> None:
        """One attempt's end: None for an answer from the downstream, else the failure's class."""
        now = self._clock()
        failed = error_class in DOWNSTREAM_FAILURES
        self._outcomes.append((now, failed))
        self._failed += failed
        self._forget_before(now - self.settings.window_s)

    def observe(self, held: bool) -> None:
        """The store says whether the breaker holds the downstream's kinds."""
        if held and not self.open:
            self.open = True
            self._ramp_from_s = None
        elif not held and self.open:
            self.open = False
            self._outcomes.clear()  # the failures were before the recovery
            self._failed = 0
            self._ramp_from_s = self._clock() + self._rng.uniform(0, self.settings.ramp_jitter_s)
            self._ramp_taken = 0.0

    # ---- what to do ----------------------------------------------------------------------------
    def should_trip(self) -> bool:
        if self.open or self.mode is not Mode.AUTO:
            return False
        self._forget_before(self._clock() - self.settings.window_s)
        attempts = len(self._outcomes)
        if attempts < self.settings.attempts_min:
            return False
        return self._failed >= self.settings.failure_ratio * attempts

    def tripped(self) -> str:
        """Marks it open; the reason recorded with the pause."""
        reason = f"{self._failed} of {len(self._outcomes)} attempts failed in {self.settings.window_s:g} s"
        self.open = True
        self.trips += 1
        self._ramp_from_s = None
        return reason

    def probe_due(self) -> bool:
        if not self.open or self.mode is not Mode.AUTO:
            return False
        now = self._clock()
        if now < self._next_probe_s:
            return False
        self._next_probe_s = now + self.settings.probe_every_s * self._rng.uniform(0.5, 1.5)
        self.probes += 1
        return True

    def allowance(self) -> int | None:
        """Attempts this worker may start now while ramping (None: no ramp, its limits alone)."""
        if self._ramp_from_s is None:
            return None
        elapsed = self._clock() - self._ramp_from_s
        if elapsed < 0:
            return 0
        settings = self.settings
        rate = settings.ramp_start_per_s * 2 ** (elapsed / settings.ramp_double_s)
        if rate >= settings.ramp_until_per_s:
            self._ramp_from_s = None
            return None
        # Attempts allowed so far: the integral of the rate since the ramp began, less those taken.
        budget = (
            settings.ramp_start_per_s * settings.ramp_double_s / _LN2 * (2 ** (elapsed / settings.ramp_double_s) - 1)
        )
        return max(0, int(budget + 1 - self._ramp_taken))

    def took(self, count: int) -> None:
        """Attempts started (negative: taken for a lease that was granted fewer)."""
        if self._ramp_from_s is not None:
            self._ramp_taken = max(0.0, self._ramp_taken + count)

    def _forget_before(self, cutoff_s: float) -> None:
        outcomes = self._outcomes
        while outcomes and outcomes[0][0] < cutoff_s:
            self._failed -= outcomes.popleft()[1]


_LN2: Final = 0.6931471805599453
