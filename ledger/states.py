"""The compensation ledger's states, and how the queue's states map to them.

The queue knows six states (delayed, ready, leased, done, dead, discarded); the ledger that finance
and the nightly reconciliation read records five, because "delayed" and "ready" differ only by
whether the due time has passed, which is the queue's business, not the ledger's.

The mapping is keyed by the queue state's name (`queues.model.State`'s value, the name the API and
the events show), not by the store's enum: this vocabulary sits below the packages that use it
(the API, the projector, the reconciliation), so it imports none of them, nor the store's wire
model, and the reconciliation ships without the queue.

Must never: do I/O, or import another package of the service. Every queue state maps to exactly
one ledger state (checked by a test against the queue's enum).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final


class LedgerState(enum.StrEnum):
    PENDING = "PENDING"
    """Waiting for its next attempt (delayed or ready)."""
    IN_FLIGHT = "IN_FLIGHT"
    """An attempt is running (leased)."""
    SUCCEEDED = "SUCCEEDED"
    DEAD_LETTERED = "DEAD_LETTERED"
    """Out of attempts or refused for good: waiting for finance to redrive or discard it."""
    CANCELLED = "CANCELLED"
    """Discarded by an operator, with a reason."""


LEDGER_STATE_OF: Final[Mapping[str, LedgerState]] = {
    "delayed": LedgerState.PENDING,
    "ready": LedgerState.PENDING,
    "leased": LedgerState.IN_FLIGHT,
    "done": LedgerState.SUCCEEDED,
    "dead": LedgerState.DEAD_LETTERED,
    "discarded": LedgerState.CANCELLED,
}
"""The ledger state of each queue state, by the queue state's name (`State.value`)."""

OPEN_STATES: Final = frozenset({LedgerState.PENDING, LedgerState.IN_FLIGHT})
"""A request in an open state has no finish time; every other state has one."""


class AttemptOutcome(enum.StrEnum):
    """How the ledger records one attempt; the queue's attempt outcomes map onto these."""

    IN_PROGRESS = "IN_PROGRESS"
    """Leased, not yet ended."""
    SUCCEEDED = "SUCCEEDED"
    """Acked, also after its lease expired (the queue's "succeeded_late")."""
    RETRYABLE_ERROR = "RETRYABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"
    """Failed as permanent by the worker (the retry policy may still have overridden that)."""
    TIMEOUT = "TIMEOUT"
    """The lease expired before the worker settled it."""
    RELEASED = "RELEASED"
    """Handed back by a draining worker before it started: does not count against the budget."""
    INTERRUPTED = "INTERRUPTED"
    """Cut off mid-call by a drain: its effect downstream is unknown, the next attempt checks first."""


_QUEUE_ATTEMPT_OUTCOMES: Final[Mapping[str | None, AttemptOutcome]] = {
    None: AttemptOutcome.IN_PROGRESS,
    "succeeded": AttemptOutcome.SUCCEEDED,
    "succeeded_late": AttemptOutcome.SUCCEEDED,
    "expired": AttemptOutcome.TIMEOUT,
    "released": AttemptOutcome.RELEASED,
    "interrupted": AttemptOutcome.INTERRUPTED,
}


def attempt_outcome_of(queue_outcome: str | None, *, permanent: bool) -> AttemptOutcome:
    """The ledger's outcome of an attempt the queue recorded as ``queue_outcome`` (its attempts
    table: None while leased, else succeeded, succeeded_late, failed, expired, released,
    interrupted). The queue's "failed" is one word for both kinds of failure, so the caller says
    which (the attempt_failed event's ``permanent``)."""
    if queue_outcome == "failed":
        return AttemptOutcome.FATAL_ERROR if permanent else AttemptOutcome.RETRYABLE_ERROR
    return _QUEUE_ATTEMPT_OUTCOMES[queue_outcome]
