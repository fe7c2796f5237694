"""What one call downstream came to, as values: the gateway makes them, classification reads them.

Three outcomes, and the difference between the last two is the whole point of the gateway:
- `Answer`: the downstream answered (any status): its status, headers and body.
- `NotSent`: the request certainly never reached the downstream (no connection could be made, or
  none was free in the pool): no effect can exist, so repeating it is always safe.
- `OutcomeUnknown`: the request was sent, or may have been, and no complete answer came back
  (a read timeout, a connection cut after the write): the effect may exist. Its error class is one
  of the contract's `UNKNOWN_OUTCOME_CLASSES`, so the next attempt checks before it repeats.

Must never: do I/O or read a clock (the gateway stamps `received_unix_s`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from handlers.contract import UNKNOWN_OUTCOME_CLASSES

BODY_BYTES_MAX: Final = 64 * 1024
"""How much of an answer's body the gateway reads; the rest is left unread (`body_truncated`)."""


class NotSentClass(enum.StrEnum):
    CONNECT_FAILED = "connect_failed"
    """No connection could be made (refused, unreachable, connect timeout)."""
    POOL_EXHAUSTED = "pool_exhausted"
    """Every pooled connection stayed busy for the pool timeout."""
    DEADLINE = "deadline"
    """The attempt's deadline passed before any byte of the request was written."""
    LEASE_ENDED = "lease_ended"
    """The attempt's lease had ended (by this worker's monotonic clock) before any byte was
    written: another delivery may hold the message now, so this one sends nothing."""


class UnknownClass(enum.StrEnum):
    TIMEOUT = "timeout"
    CONNECTION_LOST = "connection_lost"


assert {c.value for c in UnknownClass} <= UNKNOWN_OUTCOME_CLASSES, "the next attempt must know to look first"


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    """Lower-case names, in the order received."""
    body: bytes
    received_unix_s: float
    """When the answer arrived: a Retry-After given as an HTTP date is counted from here."""
    body_truncated: bool = False

    def header(self, name: str) -> str | None:
        """The first value of a header (names are case-insensitive)."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class NotSent:
    error_class: NotSentClass
    detail: str
    tries: int
    """Connection attempts made inside this one attempt (the gateway retries these, and only these)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeUnknown:
    error_class: UnknownClass
    detail: str


Outcome = Answer | NotSent | OutcomeUnknown
