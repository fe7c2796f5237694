"""Intake quotas that slow a producer before they refuse it (QMQ: hard rejection caused retry
storms, because every refused producer retried at once).

Each producer has a token bucket in each API process, kept as GCRA's theoretical arrival time:
a request of n items reserves n slots, and is let through at once while the reservation stays
within the burst. Over it, the request *waits* for its slot, up to `hold_max_s`, in the order the
reservations were made; only a request whose slot is further away than that (or one that finds
`held_max` requests already waiting) is answered 429 with the seconds until its slot. A refused
request gives its slot back. Nothing is dropped without an answer.

The configured rate and burst are per producer across the deployment: each process enforces its
share (rate/processes, burst/processes), so a producer spread over N processes gets the whole
rate, and one that reaches a single process gets that process's share.

Must never: sleep while holding anything shared, or read a clock except the injected one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

BUCKETS_MAX: Final = 100_000
_EPSILON_S: Final = 1e-6


class Throttled(Exception):
    def __init__(self, retry_after_s: int, detail: str) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(detail)


@dataclass(slots=True)
class Bucket:
    """GCRA: `tat` is when the bucket would be empty again if no one else came."""

    interval_s: float
    """Seconds per item (1 / rate)."""
    tolerance_s: float
    """burst * interval: how far ahead of now reservations may run without waiting."""
    tat_s: float

    def reserve(self, count: int, now_s: float) -> float:
        """Reserve `count` slots; the seconds to wait before they are conforming (0: now)."""
        self.tat_s = max(self.tat_s, now_s) + count * self.interval_s
        wait_s = self.tat_s - now_s - self.tolerance_s
        return wait_s if wait_s > _EPSILON_S else 0.0  # sums of intervals leave float dust

    def release(self, count: int) -> None:
        self.tat_s -= count * self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaSettings:
    rate_per_s: int
    burst: int
    hold_max_s: float
    held_max: int
    processes: int = 1


class Quotas:
    def __init__(
        self, settings: QuotaSettings, *, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[str, tuple[tuple[int, int], Bucket]] = {}
        self.held = 0
        self.held_total = 0
        self.refused_total = 0

    def _bucket(self, name: str, rate_per_s: int | None, burst: int | None) -> Bucket:
        settings = self._settings
        shape = (rate_per_s or settings.rate_per_s, burst or settings.burst)
        known = self._buckets.get(name)
        if known is not None and known[0] == shape:
            return known[1]
        if len(self._buckets) >= BUCKETS_MAX:  # bounded: forget every idle bucket (they are full anyway)
            now = self._clock()
            self._buckets = {k: v for k, v in self._buckets.items() if v[1].tat_s > now}
        interval_s = settings.processes / shape[0]
        share = max(1.0, shape[1] / settings.processes)  # the rate and the burst are both split
        bucket = Bucket(interval_s=interval_s, tolerance_s=share * interval_s, tat_s=self._clock())
        self._buckets[name] = (shape, bucket)
        return bucket

    async def admit(self, name: str, count: int = 1, *, rate_per_s: int | None = None, burst: int | None = None) -> float:
        """Return once `count` items may go (the seconds waited), or raise Throttled."""
        bucket = self._bucket(name, rate_per_s, burst)
        wait_s = bucket.reserve(count, self._clock())
        if wait_s <= 0:
            return 0.0
        settings = self._settings
        if wait_s > settings.hold_max_s or self.held >= settings.held_max:
            bucket.release(count)
            self.refused_total += 1
            raise Throttled(max(1, math.ceil(wait_s)), f"{name} is over its rate; {count} item(s) would wait {wait_s:.2f} s")
        self.held += 1
        self.held_total += 1
        try:
            await self._sleep(wait_s)
        finally:
            self.held -= 1
        return wait_s
