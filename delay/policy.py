"""Retry policy: a pure function from (policy, failed attempt) to a decision value.

Owns: the per-kind `RetryPolicy` (explicit delay tiers like RocketMQ's, or exponential backoff
with full jitter), error-class overrides, Retry-After handling, max attempts and max age, and
`decide(...)`, which returns `Retry(due_ms)` or `DeadLetter(reason)`.

Must never: read a clock, use the global random generator, or do I/O. Time is an argument
(`now_ms`, stamped by the Raft leader). Jitter is either drawn from an injected
`random.Random` (caller-owned, for a decision taken before proposing) or derived from
(message id, attempt) through a hash, so every replica that applies the same command computes the
same due time.
"""

from __future__ import annotations

import enum
import hashlib
import random
from typing import Annotated, Final

import msgspec

SECOND_MS: Final = 1_000
MINUTE_MS: Final = 60 * SECOND_MS
HOUR_MS: Final = 60 * MINUTE_MS
DAY_MS: Final = 24 * HOUR_MS

DELAY_MAX_MS: Final = 2 * 366 * DAY_MS
"""The longest delay anything may schedule (QMQ: up to 2 years). Due times beyond it are refused."""

TIERS_MAX: Final = 64
OVERRIDES_MAX: Final = 64
ATTEMPTS_MAX_LIMIT: Final = 10_000
ERROR_CLASS_LENGTH_MAX: Final = 64

ROCKETMQ_TIERS_MS: Final[tuple[int, ...]] = (
    1 * SECOND_MS, 5 * SECOND_MS, 10 * SECOND_MS, 30 * SECOND_MS,
    1 * MINUTE_MS, 2 * MINUTE_MS, 3 * MINUTE_MS, 4 * MINUTE_MS, 5 * MINUTE_MS,
    6 * MINUTE_MS, 7 * MINUTE_MS, 8 * MINUTE_MS, 9 * MINUTE_MS, 10 * MINUTE_MS,
    20 * MINUTE_MS, 30 * MINUTE_MS, 1 * HOUR_MS, 2 * HOUR_MS,
)  # fmt: skip
"""RocketMQ's default messageDelayLevel: 18 graded delays, the last one 2 hours."""

ErrorClass = Annotated[str, msgspec.Meta(min_length=1, max_length=ERROR_CLASS_LENGTH_MAX)]
# Ranges are part of the types, so decoding a policy (from the log, or from an operator's JSON) is
# its validation and its JSON Schema states them; `problems()` adds the relations between fields.
DelayMs = Annotated[int, msgspec.Meta(gt=0, le=DELAY_MAX_MS)]
Attempts = Annotated[int, msgspec.Meta(ge=1, le=ATTEMPTS_MAX_LIMIT)]


class PolicyError(ValueError):
    """A policy whose settings contradict each other (a programmer or operator error)."""


class ErrorClassRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Overrides for one downstream error class, e.g. `insufficient_funds` -> permanent."""

    error_class: ErrorClass
    permanent: bool
    """Overrides the worker's retryable/permanent flag for this class."""
    attempts_max: Attempts | None = None
    """A tighter (or looser) attempt budget for this class; None keeps the policy's."""


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one kind of request is retried. Replicated: set at runtime by a SetPolicy command.

    With `tiers_ms` non-empty the n-th failed attempt waits `tiers_ms[n-1]` (the last tier repeats),
    stretched by up to `tier_jitter_ratio` of itself. With `tiers_ms` empty the wait is exponential
    with full jitter: uniform in [backoff_min_ms, min(backoff_max_ms, backoff_min_ms * 2**n)].
    """

    tiers_ms: Annotated[tuple[DelayMs, ...], msgspec.Meta(max_length=TIERS_MAX)] = ROCKETMQ_TIERS_MS
    tier_jitter_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.1
    backoff_min_ms: DelayMs = SECOND_MS
    backoff_max_ms: DelayMs = HOUR_MS
    """At least backoff_min_ms."""
    attempts_max: Attempts = len(ROCKETMQ_TIERS_MS) + 1
    """Deliveries before the message is dead-lettered: the first try plus the retries."""
    age_max_ms: DelayMs | None = None
    """No retry is scheduled later than budget start + age_max_ms; None: no age limit."""
    retry_after_max_ms: Annotated[int, msgspec.Meta(ge=0, le=DELAY_MAX_MS)] = DAY_MS
    """A downstream's Retry-After is honoured up to this far in the future."""
    overrides: Annotated[tuple[ErrorClassRule, ...], msgspec.Meta(max_length=OVERRIDES_MAX)] = ()
    """Each error class at most once."""

    def validate(self) -> None:
        """Raise PolicyError if the settings are out of range or contradict each other."""
        problems = self.problems()
        if problems:
            raise PolicyError("; ".join(problems))

    def problems(self) -> list[str]:
        found: list[str] = []
        if len(self.tiers_ms) > TIERS_MAX:
            found.append(f"more than {TIERS_MAX} tiers")
        if any(t <= 0 or t > DELAY_MAX_MS for t in self.tiers_ms):
            found.append(f"tiers must be in (0, {DELAY_MAX_MS}] ms")
        if not 0.0 <= self.tier_jitter_ratio <= 1.0:
            found.append("tier_jitter_ratio must be in [0, 1]")
        if not 0 < self.backoff_min_ms <= self.backoff_max_ms <= DELAY_MAX_MS:
            found.append("need 0 < backoff_min_ms <= backoff_max_ms <= DELAY_MAX_MS")
        if not 1 <= self.attempts_max <= ATTEMPTS_MAX_LIMIT:
            found.append(f"attempts_max must be in [1, {ATTEMPTS_MAX_LIMIT}]")
        if self.age_max_ms is not None and not 0 < self.age_max_ms <= DELAY_MAX_MS:
            found.append("age_max_ms must be in (0, DELAY_MAX_MS]")
        if not 0 <= self.retry_after_max_ms <= DELAY_MAX_MS:
            found.append("retry_after_max_ms must be in [0, DELAY_MAX_MS]")
        if len(self.overrides) > OVERRIDES_MAX:
            found.append(f"more than {OVERRIDES_MAX} overrides")
        classes = [rule.error_class for rule in self.overrides]
        if len(set(classes)) != len(classes):
            found.append("an error class is overridden twice")
        for rule in self.overrides:
            if rule.attempts_max is not None and not 1 <= rule.attempts_max <= ATTEMPTS_MAX_LIMIT:
                found.append(f"override {rule.error_class}: attempts_max out of range")
        return found

    def rule_for(self, error_class: str) -> ErrorClassRule | None:
        for rule in self.overrides:
            if rule.error_class == error_class:
                return rule
        return None


DEFAULT_POLICY: Final = RetryPolicy()


class DeadReason(enum.Enum):
    PERMANENT_ERROR = "permanent_error"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    AGE_EXCEEDED = "age_exceeded"


class Retry(msgspec.Struct, frozen=True, kw_only=True):
    due_ms: int
    delay_ms: int
    """The policy's own wait (before Retry-After), reported so lateness can be told from backoff."""


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    reason: DeadReason


Decision = Retry | DeadLetter


def jitter_fraction(message_id: int, attempt: int) -> float:
    """A fraction in [0, 1) derived from (message id, attempt): the same on every replica."""
    digest = hashlib.blake2b(f"{message_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / float(1 << 64)


def backoff_ms(*, attempt: int, fraction: float, min_ms: int, max_ms: int) -> int:
    """Exponential backoff with full jitter: uniform in [min_ms, min(max_ms, min_ms * 2**attempt)]."""
    assert attempt >= 1 and 0.0 <= fraction < 1.0 and 0 < min_ms <= max_ms
    ceiling_ms = max_ms if attempt >= 62 else min(max_ms, min_ms << attempt)
    delay_ms = min_ms + int(fraction * (ceiling_ms - min_ms + 1))
    assert min_ms <= delay_ms <= ceiling_ms
    return delay_ms


def tier_delay_ms(*, tiers_ms: tuple[int, ...], attempt: int, fraction: float, jitter_ratio: float) -> int:
    """The n-th tier (the last repeats), stretched by up to `jitter_ratio` of itself, never shortened."""
    assert tiers_ms and attempt >= 1 and 0.0 <= fraction < 1.0
    tier = tiers_ms[min(attempt, len(tiers_ms)) - 1]
    delay_ms = tier + int(fraction * tier * jitter_ratio)
    assert tier <= delay_ms <= tier + tier * jitter_ratio
    return delay_ms


def policy_delay_ms(policy: RetryPolicy, *, attempt: int, fraction: float) -> int:
    if policy.tiers_ms:
        return tier_delay_ms(
            tiers_ms=policy.tiers_ms,
            attempt=attempt,
            fraction=fraction,
            jitter_ratio=policy.tier_jitter_ratio,
        )
    return backoff_ms(
        attempt=attempt, fraction=fraction, min_ms=policy.backoff_min_ms, max_ms=policy.backoff_max_ms
    )


def decide(
    policy: RetryPolicy,
    *,
    message_id: int,
    attempt: int,
    budget_start_ms: int,
    now_ms: int,
    error_class: str,
    permanent: bool,
    not_before_ms: int | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """What to do after attempt number `attempt` (1-based, within the current budget) failed.

    Precedence: an error-class override decides permanence; a permanent error dead-letters at once;
    an exhausted attempt budget dead-letters; otherwise the retry waits the policy's delay, pushed
    later by a Retry-After (`not_before_ms`, capped at `retry_after_max_ms` from now); a retry that
    would fall after budget_start_ms + age_max_ms dead-letters instead. Jitter comes from `rng` if
    given, else from (message_id, attempt).
    """
    assert attempt >= 1
    rule = policy.rule_for(error_class)
    if rule is not None:
        permanent = rule.permanent
    if permanent:
        return DeadLetter(reason=DeadReason.PERMANENT_ERROR)
    attempts_max = (
        rule.attempts_max if rule is not None and rule.attempts_max is not None else policy.attempts_max
    )
    if attempt >= attempts_max:
        return DeadLetter(reason=DeadReason.ATTEMPTS_EXHAUSTED)
    fraction = rng.random() if rng is not None else jitter_fraction(message_id, attempt)
    delay_ms = policy_delay_ms(policy, attempt=attempt, fraction=fraction)
    due_ms = now_ms + delay_ms
    if not_before_ms is not None:
        due_ms = max(due_ms, min(not_before_ms, now_ms + policy.retry_after_max_ms))
    if policy.age_max_ms is not None and due_ms > budget_start_ms + policy.age_max_ms:
        return DeadLetter(reason=DeadReason.AGE_EXCEEDED)
    return Retry(due_ms=due_ms, delay_ms=delay_ms)


def horizon_ms(policy: RetryPolicy, *, attempt_ms: int) -> int:
    """The longest the policy can keep re-sending one request, from its first delivery to the start
    of its last: every retry's delay at its longest (its tier stretched by all its jitter, or its
    backoff ceiling, or a downstream's Retry-After at the cap when that is longer), bounded by the
    age limit when there is one, plus `attempt_ms` for every delivery before the last (how long
    one attempt may take, downstream calls and waits included).

    What it does not count: how late a due retry is leased (a backlog, an open breaker, a paused
    kind) and redrives, which start a new budget. A downstream that deduplicates for a window
    shorter than this may see a retry as a new request; one longer covers what the policy schedules.
    """
    assert attempt_ms >= 0
    retries = policy.attempts_max - 1
    delays = 0
    for attempt in range(1, retries + 1):
        longest = policy_delay_ms(policy, attempt=attempt, fraction=1.0 - 1e-12)
        delays += max(longest, policy.retry_after_max_ms)
    if policy.age_max_ms is not None:
        delays = min(delays, policy.age_max_ms)
    return delays + retries * attempt_ms
