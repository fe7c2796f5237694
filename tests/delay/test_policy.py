"""Retry policy: tiers, exponential backoff with full jitter, determinism, overrides, Retry-After,
max attempts and max age, validation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delay.policy import (
    DAY_MS,
    DELAY_MAX_MS,
    HOUR_MS,
    ROCKETMQ_TIERS_MS,
    SECOND_MS,
    DeadLetter,
    DeadReason,
    ErrorClassRule,
    PolicyError,
    Retry,
    RetryPolicy,
    backoff_ms,
    decide,
    jitter_fraction,
)

NOW_MS = 1_700_000_000_000


def retry(policy: RetryPolicy, attempt: int, **kwargs: object) -> Retry:
    arguments: dict[str, object] = {
        "message_id": 7, "attempt": attempt, "budget_start_ms": NOW_MS, "now_ms": NOW_MS,
        "error_class": "timeout", "permanent": False,
    }  # fmt: skip
    arguments.update(kwargs)
    decision = decide(policy, **arguments)  # type: ignore[arg-type]
    assert isinstance(decision, Retry), decision
    return decision


def test_rocketmq_tiers_in_order_and_last_repeats() -> None:
    policy = RetryPolicy(tier_jitter_ratio=0.0, attempts_max=100)
    delays = [retry(policy, n).due_ms - NOW_MS for n in range(1, 21)]
    assert delays[:18] == list(ROCKETMQ_TIERS_MS)
    assert delays[18:] == [2 * HOUR_MS, 2 * HOUR_MS]


@given(message_id=st.integers(1, 10**12), attempt=st.integers(1, 30))
def test_tier_jitter_only_stretches(message_id: int, attempt: int) -> None:
    policy = RetryPolicy(tiers_ms=(1000, 5000), tier_jitter_ratio=0.2, attempts_max=100)
    delay = retry(policy, attempt, message_id=message_id).delay_ms
    tier = 1000 if attempt == 1 else 5000
    assert tier <= delay <= tier * 1.2


@given(attempt=st.integers(1, 200), fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_full_jitter_bounds(attempt: int, fraction: float) -> None:
    delay = backoff_ms(attempt=attempt, fraction=fraction, min_ms=500, max_ms=60_000)
    assert 500 <= delay <= min(60_000, 500 * 2**attempt)


def test_full_jitter_spreads_a_burst() -> None:
    """Many messages failing together do not retry together (no retry storm)."""
    policy = RetryPolicy(tiers_ms=(), backoff_min_ms=1000, backoff_max_ms=HOUR_MS, attempts_max=100)
    dues = {retry(policy, 5, message_id=i).due_ms for i in range(1000)}
    assert len(dues) > 900
    assert min(dues) - NOW_MS < 5000 and max(dues) - NOW_MS > 25_000


def test_derived_jitter_is_the_same_on_every_replica() -> None:
    policy = RetryPolicy(tiers_ms=(), attempts_max=50)
    first = [retry(policy, a, message_id=m).due_ms for m in (1, 2, 99) for a in (1, 2, 10)]
    again = [retry(policy, a, message_id=m).due_ms for m in (1, 2, 99) for a in (1, 2, 10)]
    assert first == again
    assert jitter_fraction(5, 1) == jitter_fraction(5, 1) != jitter_fraction(5, 2)
    assert 0.0 <= jitter_fraction(2**62, 10_000) < 1.0


def test_injected_rng_is_reproducible() -> None:
    policy = RetryPolicy(tiers_ms=(), attempts_max=50)
    a = [retry(policy, 3, rng=random.Random(42)).due_ms for _ in range(3)]
    b = [retry(policy, 3, rng=random.Random(42)).due_ms for _ in range(3)]
    assert a == b


def test_attempts_exhausted_dead_letters_never_drops() -> None:
    policy = RetryPolicy(tiers_ms=(1000,), attempts_max=3)
    retry(policy, 2)
    decision = decide(policy, message_id=1, attempt=3, budget_start_ms=NOW_MS, now_ms=NOW_MS,
                      error_class="timeout", permanent=False)  # fmt: skip
    assert decision == DeadLetter(reason=DeadReason.ATTEMPTS_EXHAUSTED)


def test_permanent_error_dead_letters_at_once() -> None:
    decision = decide(RetryPolicy(), message_id=1, attempt=1, budget_start_ms=NOW_MS, now_ms=NOW_MS,
                      error_class="bad_request", permanent=True)  # fmt: skip
    assert decision == DeadLetter(reason=DeadReason.PERMANENT_ERROR)


def test_error_class_overrides() -> None:
    policy = RetryPolicy(
        overrides=(
            ErrorClassRule(error_class="insufficient_funds", permanent=True),
            ErrorClassRule(error_class="timeout", permanent=False, attempts_max=2),
        )
    )
    funds = decide(policy, message_id=1, attempt=1, budget_start_ms=NOW_MS, now_ms=NOW_MS,
                   error_class="insufficient_funds", permanent=False)  # fmt: skip
    assert funds == DeadLetter(reason=DeadReason.PERMANENT_ERROR)
    # The worker called the timeout permanent; the policy knows better.
    retry(policy, 1, error_class="timeout", permanent=True)
    spent = decide(policy, message_id=1, attempt=2, budget_start_ms=NOW_MS, now_ms=NOW_MS,
                   error_class="timeout", permanent=False)  # fmt: skip
    assert spent == DeadLetter(reason=DeadReason.ATTEMPTS_EXHAUSTED)
    retry(policy, 2, error_class="http_503")  # other classes keep the policy's budget


def test_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(tier_jitter_ratio=0.0, retry_after_max_ms=DAY_MS)
    assert retry(policy, 1, not_before_ms=NOW_MS + 90 * SECOND_MS).due_ms == NOW_MS + 90 * SECOND_MS
    assert (
        retry(policy, 1, not_before_ms=NOW_MS + 10).due_ms == NOW_MS + SECOND_MS
    )  # never sooner than policy
    assert retry(policy, 1, not_before_ms=NOW_MS + 30 * DAY_MS).due_ms == NOW_MS + DAY_MS


def test_max_age() -> None:
    policy = RetryPolicy(
        tiers_ms=(10 * SECOND_MS,), tier_jitter_ratio=0.0, attempts_max=100, age_max_ms=HOUR_MS
    )
    assert (
        retry(policy, 5, budget_start_ms=NOW_MS - HOUR_MS + 10 * SECOND_MS).due_ms == NOW_MS + 10 * SECOND_MS
    )
    late = decide(policy, message_id=1, attempt=5, budget_start_ms=NOW_MS - HOUR_MS, now_ms=NOW_MS,
                  error_class="timeout", permanent=False)  # fmt: skip
    assert late == DeadLetter(reason=DeadReason.AGE_EXCEEDED)


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (RetryPolicy(tiers_ms=(0,)), "tiers"),
        (RetryPolicy(tiers_ms=(DELAY_MAX_MS + 1,)), "tiers"),
        (RetryPolicy(backoff_min_ms=10, backoff_max_ms=5), "backoff"),
        (RetryPolicy(attempts_max=0), "attempts_max"),
        (RetryPolicy(tier_jitter_ratio=1.5), "jitter"),
        (RetryPolicy(age_max_ms=0), "age_max_ms"),
        (RetryPolicy(overrides=(ErrorClassRule(error_class="a", permanent=True),) * 2), "twice"),
        (
            RetryPolicy(overrides=(ErrorClassRule(error_class="a", permanent=False, attempts_max=0),)),
            "override",
        ),
    ],
)
def test_validate_refuses_contradictions(policy: RetryPolicy, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem):
        policy.validate()


def test_default_policy_is_valid() -> None:
    RetryPolicy().validate()
    RetryPolicy(tiers_ms=()).validate()
