"""The breaker's decisions with an injected clock and random source."""

from __future__ import annotations

import itertools
import random

import pytest

from services.worker.breaker import Breaker, BreakerSettings, Mode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: Clock, **settings: float) -> Breaker:
    defaults = {"window_s": 10.0, "attempts_min": 10, "failure_ratio": 0.5, "ramp_jitter_s": 0.0}
    return Breaker("payment", BreakerSettings(**{**defaults, **settings}), clock=clock, rng=random.Random(7))  # type: ignore[arg-type]


def test_it_trips_on_the_downstreams_failures_only() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(20):
        breaker.record("insufficient_funds")  # the downstream answered: it works
    assert not breaker.should_trip()
    for _ in range(9):
        breaker.record("timeout")
    assert not breaker.should_trip()  # 9 of 29
    clock.now += 11  # the window moved on: only failures from now count
    for _ in range(9):
        breaker.record("server_error")
    assert not breaker.should_trip()  # 9 attempts, under the minimum of 10
    breaker.record(None)
    assert breaker.should_trip()  # 9 of 10
    assert breaker.tripped() == "9 of 10 attempts failed in 10 s"
    assert breaker.open and not breaker.should_trip()


def test_its_decision_is_the_windows_count_after_any_history() -> None:
    """The failures are counted as attempts come and leave the window (not recounted per check):
    over a random history of attempts, clock steps, and the store opening and closing the breaker,
    every decision and the trip's reason match a count of the window made from scratch."""
    rng = random.Random(11)
    clock = Clock()
    breaker = _breaker(clock, window_s=5.0, attempts_min=8)
    window: list[tuple[float, bool]] = []
    classes = [None, "timeout", "server_error", "insufficient_funds", "pool_exhausted", "connection_lost"]
    for _ in range(3000):
        step = rng.random()
        if step < 0.75:
            error_class = rng.choice(classes)
            breaker.record(error_class)
            window.append((clock.now, error_class in {"timeout", "server_error", "connection_lost"}))
        elif step < 0.95:
            clock.now += rng.choice([0.01, 0.3, 1.0, 2.5, 6.0])
        else:
            held = rng.random() < 0.5
            if not held and breaker.open:
                window.clear()  # closing forgets the failures that opened it
            breaker.observe(held)
        window = [(at, bad) for at, bad in window if at >= clock.now - 5.0]
        failed = sum(bad for _, bad in window)
        expected = not breaker.open and len(window) >= 8 and failed >= 0.5 * len(window)
        assert breaker.should_trip() is expected
        if expected and rng.random() < 0.1:
            assert breaker.tripped() == f"{failed} of {len(window)} attempts failed in 5 s"
            assert breaker.open


def test_probes_are_spaced_and_closing_starts_a_ramp_without_a_burst() -> None:
    clock = Clock()
    breaker = _breaker(clock, probe_every_s=1.0, ramp_start_per_s=5.0, ramp_double_s=2.0, ramp_until_per_s=80.0)
    assert not breaker.probe_due()  # closed: nothing to probe
    breaker.observe(held=True)
    assert breaker.probe_due() and not breaker.probe_due()
    clock.now += 1.6
    assert breaker.probe_due()
    assert breaker.allowance() is None  # open: the pause stops leasing, not the ramp
    breaker.observe(held=False)
    started = []
    for _ in range(200):  # up to 10 s in steps of 50 ms, starting all it may each step
        allowed = breaker.allowance()
        if allowed is None:
            break
        breaker.took(allowed)
        started.append(allowed)
        clock.now += 0.05
    assert breaker.allowance() is None  # the ramp ended at 80/s, after 2 * log2(80 / 5) = 8 s
    per_second = [sum(started[i : i + 20]) for i in range(0, len(started) - 19, 20)]  # whole seconds
    assert per_second[0] <= 8 and all(b >= a for a, b in itertools.pairwise(per_second))
    assert max(per_second) <= 80


@pytest.mark.parametrize("mode", [Mode.OPEN, Mode.CLOSED])
def test_a_forced_breaker_neither_trips_nor_probes(mode: Mode) -> None:
    clock = Clock()
    breaker = _breaker(clock)
    breaker.mode = mode
    for _ in range(20):
        breaker.record("timeout")
    assert not breaker.should_trip()
    breaker.observe(held=True)
    assert not breaker.probe_due()


def test_every_failure_class_it_counts_is_one_the_handlers_produce() -> None:
    from handlers.answers import NotSentClass, UnknownClass
    from handlers.classification import Action
    from handlers.tables import DEFAULT_TABLES
    from services.worker.breaker import DOWNSTREAM_FAILURES

    retried = {rule.error_class for table in DEFAULT_TABLES.values() for rule in table.rules
               if rule.action in (Action.RETRY, Action.RETRY_AFTER)}  # fmt: skip
    produced = {c.value for c in UnknownClass} | {NotSentClass.CONNECT_FAILED.value} | retried
    assert produced >= DOWNSTREAM_FAILURES, DOWNSTREAM_FAILURES - produced
