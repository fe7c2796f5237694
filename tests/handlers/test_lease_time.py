"""An attempt's time, on a clock the test moves: the lease's end never later than the store's, the
store's clock bounded from both sides, a request's expiry never past the lease, and the in-doubt
time reported as a duration the store can only over-count."""

from __future__ import annotations

from handlers.lease_time import LeaseTime

G = 1_700_000_000_000
"""The store's clock at the grant (ms)."""


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lease(clock: Clock, *, requested_s: float = 100.0, received_s: float = 100.25) -> LeaseTime:
    return LeaseTime.granted(lease_ms=30_000, deadline_ms=G + 30_000, requested_s=requested_s, received_s=received_s,
                             clock=clock)  # fmt: skip


def test_the_lease_ends_here_no_later_than_at_the_store() -> None:
    clock = Clock(100.25)
    held = lease(clock)
    assert held.send_by() == 130.0  # from the moment the Lease was sent, not when the grant arrived
    clock.now = 129.99
    assert not held.lease_passed()
    clock.now = 130.0
    assert held.lease_passed()
    held.extended(sent_s=125.0, deadline_ms=G + 55_100)
    assert (held.send_by(), held.deadline_ms, held.lease_passed()) == (155.0, G + 55_100, False)
    held.extended(sent_s=120.0, deadline_ms=G + 50_000)  # an older answer arriving late moves nothing back
    assert (held.send_by(), held.deadline_ms) == (155.0, G + 55_100)


def test_the_store_clock_is_bounded_from_both_sides() -> None:
    clock = Clock(101.25)
    held = lease(clock)  # sent at 100.0, arrived at 100.25: the grant was made in between
    assert held.store_now_ms() == G + 1000
    assert held.store_now_upper_ms() == G + 1250
    assert held.elapsed_s() == 1.0


def test_a_request_expires_at_the_attempt_deadline_or_the_lease_end_whichever_first() -> None:
    clock = Clock(101.25)
    held = lease(clock)
    assert held.expires_at_ms(10.0) == G + 11_250
    clock.now = 125.0
    assert held.expires_at_ms(10.0) == G + 30_000  # the store's deadline of the lease
    held.extended(sent_s=124.0, deadline_ms=G + 54_500)
    assert held.expires_at_ms(10.0) == G + 35_000


def test_the_in_doubt_report_covers_every_request_whose_outcome_is_unknown() -> None:
    clock = Clock(101.25)
    held = lease(clock)
    assert held.in_doubt_report_ms() is None  # a handler that does not report: the store assumes the lease's end
    held.report()
    assert held.in_doubt_report_ms() == 0  # nothing sent
    held.sending(G + 6000)
    held.settled(in_doubt=False)  # answered: known
    assert held.in_doubt_report_ms() == 0
    held.sending(G + 9000)
    clock.now = 103.25
    assert held.in_doubt_report_ms() == 6000  # cut off while sending: still in flight
    held.settled(in_doubt=True)
    held.sending(G + 7000)
    held.settled(in_doubt=True)
    assert held.in_doubt_report_ms() == 6000  # the latest of them, from a lower bound of the store's clock
    clock.now = 200.0
    assert held.in_doubt_report_ms() == 0
