"""The compensation ledger's states, and how the queue's states map to them.

The queue knows six states (delayed, ready, leased, done, dead, discarded); the ledger that finance
and the nightly reconciliation read records five, because "delayed" and "ready" differ only by
whether the due time has passed, which is the queue's business, not the ledger's.

Must never: do I/O. Every queue state maps to exactly one ledger state (checked by a test).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from queues.model import State


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


LEDGER_STATE_OF: Final[Mapping[State, LedgerState]] = {
    State.DELAYED: LedgerState.PENDING,
    State.READY: LedgerState.PENDING,
    State.LEASED: LedgerState.IN_FLIGHT,
    State.DONE: LedgerState.SUCCEEDED,
    State.DEAD: LedgerState.DEAD_LETTERED,
    State.DISCARDED: LedgerState.CANCELLED,
}

OPEN_STATES: Final = frozenset({LedgerState.PENDING, LedgerState.IN_FLIGHT})
"""A request in an open state has no finish time; every other state has one."""
