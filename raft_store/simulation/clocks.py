"""The simulated nodes' clocks and their faults, and the bound the log's clock must keep.

Each node has a wall clock (offset from true time, running at its own rate, stepped forward or
back at chosen moments, as NTP steps or a resumed VM do) and a monotonic clock (the same rate,
never stepped). Some seeds give one node (a minority) a large fault: an offset of seconds, a step,
or a rate of 1.5x, and move leadership to it. Drawn from a generator of their own, so the run's
other draws stay what they were.

The bound (docs/queue.md, "One clock"): the log's clock reads no further ahead of true time than
the majority's time (`majority_ahead_ms`: the k-th highest of the nodes' clock errors, k a
majority, each clock at the highest value a sample still in use can hold), except that it never
goes back: once ahead it moves on only as the majority's time does. One node's clock, however
wrong, is never the majority's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

EPOCH_MS: Final = 1_700_000_000_000
"""Simulated time 0 on a perfect clock."""
SAMPLE_TTL_MS: Final = 500
"""The nodes' LogClock sample lifetime: five election timeouts here, as 2 s is in a deployment."""
SLACK_MS: Final = 100
"""Message delay and the rounding of integer clocks, on top of the computed bound."""


@dataclass(slots=True)
class SimClock:
    offset_ms: int
    rate: float
    steps: list[tuple[int, int]] = field(default_factory=list)
    """(true ms, change ms), in time order: the wall clock jumps by `change` at that moment."""

    def wall(self, now_ms: int) -> int:
        stepped = sum(change for at, change in self.steps if at <= now_ms)
        return EPOCH_MS + self.offset_ms + int(now_ms * self.rate) + stepped

    def monotonic(self, now_ms: int) -> int:
        return int(now_ms * self.rate)

    def highest_sample(self, now_ms: int, window_ms: int) -> int:
        """The highest value a sample of this clock taken up to `window_ms` ago can hold (samples are
        used as they came: the clock now, or just before a step back inside the window)."""
        start = now_ms - window_ms
        return max([self.wall(now_ms)] + [self.wall(at - 1) for at, _ in self.steps if start < at <= now_ms])


@dataclass(frozen=True, slots=True)
class ClockFaults:
    """Per seed, at most a minority of nodes gets one of these."""

    skew_probability: float = 0.3
    skew_ms_max: int = 30_000
    step_probability: float = 0.3
    step_ms_max: int = 30_000
    fast_probability: float = 0.15
    fast_rate: float = 1.5
    takeovers_max: int = 3
    """Leader transfers to the node with the bad clock during the chaos phase."""


@dataclass(slots=True)
class ClockPlan:
    bad: list[int]
    """Nodes given a large fault (a minority)."""
    takeovers: list[int]
    """True times at which leadership is moved to a bad node."""
    described: list[str]


def plan_clock_faults(
    rng: random.Random, clocks: dict[int, SimClock], faults: ClockFaults, horizon_ms: int
) -> ClockPlan:
    ids = sorted(clocks)
    minority = (len(ids) - 1) // 2
    bad: list[int] = []
    described: list[str] = []
    for kind in ("skew", "step", "fast"):
        probability = {"skew": faults.skew_probability, "step": faults.step_probability,
                       "fast": faults.fast_probability}[kind]  # fmt: skip
        if rng.random() >= probability:
            continue
        candidates = [n for n in ids if n not in bad] if len(bad) < minority else bad
        node = rng.choice(candidates)
        if node not in bad:
            bad.append(node)
        clock = clocks[node]
        if kind == "skew":
            clock.offset_ms += rng.choice((-1, 1)) * rng.randint(faults.skew_ms_max // 6, faults.skew_ms_max)
            described.append(f"n{node} offset {clock.offset_ms} ms")
        elif kind == "step":
            at = rng.randint(horizon_ms // 8, horizon_ms)
            change = rng.choice((-1, 1)) * rng.randint(faults.step_ms_max // 15, faults.step_ms_max)
            clock.steps.append((at, change))
            clock.steps.sort()
            described.append(f"n{node} steps {change:+} ms at {at} ms")
        else:
            clock.rate = faults.fast_rate
            described.append(f"n{node} runs at {faults.fast_rate}x")
    takeovers = sorted(rng.randint(200, horizon_ms) for _ in range(rng.randint(1, faults.takeovers_max))) if bad else []
    return ClockPlan(bad, takeovers, described)


def majority_ahead_ms(clocks: dict[int, SimClock], now_ms: int) -> int:
    """How far ahead of true time the highest time a majority of the clocks may be read at is."""
    window = SAMPLE_TTL_MS + SLACK_MS
    estimates = sorted((c.highest_sample(now_ms, window) for c in clocks.values()), reverse=True)
    majority = len(estimates) // 2 + 1
    return estimates[majority - 1] - (EPOCH_MS + now_ms)


__all__ = ["EPOCH_MS", "SAMPLE_TTL_MS", "SLACK_MS", "ClockFaults", "ClockPlan", "SimClock", "majority_ahead_ms",
           "plan_clock_faults"]  # fmt: skip
