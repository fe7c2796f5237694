"""The downstream payment system a worker calls: a stand-in with an effect ledger.

Why it exists: the queue promises at-least-once delivery and fencing tokens; "exactly one effect
per request" only holds if the downstream honours both, the way a bank API honours an
idempotency key and a lock service's client honours a fencing token (Kleppmann, "How to do
distributed locking"). The stand-in does, and records every call, so the checker can prove the
end-to-end property instead of trusting it. Planted bugs switch either rule off to prove that
the checker notices.

Errors are drawn per call: a timeout whose effect may or may not have happened, a Retry-After, a
permanent refusal, and an error class that the retry policy marks permanent.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field


class Effect(enum.Enum):
    APPLIED = "applied"
    """The effect happened in this call."""
    DUPLICATE = "duplicate"
    """The key's effect happened earlier: the idempotent answer, nothing done again."""
    FENCED = "fenced"
    """A newer token was already presented for this key: refused, nothing done."""
    TIMEOUT = "timeout"
    """The caller saw an error; the effect may have happened (`CallRecord.applied`)."""
    RETRY_AFTER = "retry_after"
    REJECTED = "rejected"
    """Permanent: retrying cannot help."""
    INSUFFICIENT_FUNDS = "insufficient_funds"
    """Retryable by the worker's flag; the kinds' policy overrides it to permanent."""


ACCEPTED = frozenset({Effect.APPLIED, Effect.DUPLICATE, Effect.TIMEOUT})
"""Outcomes in which the downstream acted on the token (so it must not have been stale)."""


@dataclass(frozen=True, slots=True)
class AppBugs:
    """Planted application bugs, outside the queue machine; each must be caught."""

    no_fencing: bool = False
    """The downstream ignores fencing tokens: a worker whose lease was taken over still acts."""
    no_dedup: bool = False
    """The downstream ignores idempotency keys: every redelivery repeats the effect."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    at_ms: int
    key: str
    message_id: int
    token: int
    worker: str
    outcome: Effect
    applied: bool
    """Whether this call performed the effect."""


@dataclass(frozen=True, slots=True)
class Answer:
    outcome: Effect
    retry_after_ms: int = 0


@dataclass(slots=True)
class Downstream:
    rng: random.Random
    bugs: AppBugs
    on_call: Callable[[CallRecord], None]
    clock: Callable[[], int]
    calls: list[CallRecord] = field(default_factory=list)
    _fence: dict[str, int] = field(default_factory=dict)
    _effects: dict[str, int] = field(default_factory=dict)  # key -> token of the call that did it

    def call(self, key: str, message_id: int, token: int, worker: str) -> Answer:
        if not self.bugs.no_fencing and token < self._fence.get(key, 0):
            return self._record(key, message_id, token, worker, Answer(Effect.FENCED), applied=False)
        self._fence[key] = max(self._fence.get(key, 0), token)
        draw = self.rng.random()
        if draw < 0.02:
            answer = Answer(Effect.REJECTED)
        elif draw < 0.04:
            answer = Answer(Effect.INSUFFICIENT_FUNDS)
        elif draw < 0.09:
            answer = Answer(Effect.RETRY_AFTER, self.rng.randint(50, 1500))
        elif draw < 0.19:
            applied = self.rng.random() < 0.5 and self._perform(key, token)
            return self._record(key, message_id, token, worker, Answer(Effect.TIMEOUT), applied=applied)
        else:
            applied = self._perform(key, token)
            outcome = Effect.APPLIED if applied else Effect.DUPLICATE
            return self._record(key, message_id, token, worker, Answer(outcome), applied=applied)
        return self._record(key, message_id, token, worker, answer, applied=False)

    def _perform(self, key: str, token: int) -> bool:
        if key in self._effects and not self.bugs.no_dedup:
            return False
        self._effects[key] = token
        return True

    def _record(self, key: str, message_id: int, token: int, worker: str, answer: Answer, *, applied: bool) -> Answer:
        record = CallRecord(self.clock(), key, message_id, token, worker, answer.outcome, applied)
        self.calls.append(record)
        self.on_call(record)
        return answer
