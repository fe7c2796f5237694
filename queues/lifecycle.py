"""The message lifecycle: one table of (state, action) -> the states the action may lead to.

Owns: which actions are legal in which state. The machine consults `transition()` before it
changes a message and asserts that the state it reaches is one the table allows; an illegal pair
is `Code.ILLEGAL_STATE`, never a crash and never a silent no-op.

Token checks (fencing) are separate and come after the lifecycle check: the table says what may
happen to a message at all, the token says whether this caller may make it happen.

Must never: touch storage or decide retry timing (delay/policy.py does).
"""

from __future__ import annotations

import enum
from typing import Final

from queues.model import Code, State


class Action(enum.Enum):
    LEASE = "lease"
    EXTEND = "extend"
    ACK = "ack"
    FAIL = "fail"
    RELEASE = "release"
    """Handed back (a draining worker): ready again, the delivery not counted; an interrupted one
    whose requests may still take effect is delayed until they no longer can."""
    EXPIRE = "expire"
    """The lease deadline passed: counted as a failed attempt (explicit ExpireLeases or lazily)."""
    REDRIVE = "redrive"
    DISCARD = "discard"
    PURGE = "purge"
    """A tombstone's retention ended: the message leaves the store."""


GONE: Final = frozenset[State]()
"""The target of PURGE: the message no longer exists."""

_RETRY_OR_DEAD: Final = frozenset({State.DELAYED, State.READY, State.DEAD})

TABLE: Final[dict[tuple[State, Action], frozenset[State]]] = {
    (State.DELAYED, Action.REDRIVE): frozenset({State.READY}),  # an operator's "retry now"
    (State.DELAYED, Action.DISCARD): frozenset({State.DISCARDED}),
    # Late ack: the holder of an expired lease finished the work, and no newer lease was granted
    # (the token check enforces that): accepting it avoids a needless duplicate delivery.
    (State.DELAYED, Action.ACK): frozenset({State.DONE}),
    (State.READY, Action.LEASE): frozenset({State.LEASED}),
    (State.READY, Action.DISCARD): frozenset({State.DISCARDED}),
    (State.READY, Action.ACK): frozenset({State.DONE}),  # late ack, as above
    (State.LEASED, Action.EXTEND): frozenset({State.LEASED}),
    (State.LEASED, Action.ACK): frozenset({State.DONE}),
    (State.LEASED, Action.FAIL): _RETRY_OR_DEAD,
    (State.LEASED, Action.RELEASE): frozenset({State.READY, State.DELAYED}),
    (State.LEASED, Action.EXPIRE): _RETRY_OR_DEAD,
    (State.DEAD, Action.REDRIVE): frozenset({State.READY}),
    (State.DEAD, Action.DISCARD): frozenset({State.DISCARDED}),
    (State.DEAD, Action.ACK): frozenset({State.DONE}),  # late ack after an expiry that dead-lettered
    (State.DONE, Action.PURGE): GONE,
    (State.DISCARDED, Action.PURGE): GONE,
}
"""Every pair not listed is illegal. Dead letters are never purged: they wait for an operator."""


def transition(state: State, action: Action) -> frozenset[State] | Code:
    """The states `action` may lead to from `state`, or Code.ILLEGAL_STATE."""
    allowed = TABLE.get((state, action))
    if allowed is None:
        return Code.ILLEGAL_STATE
    return allowed


def is_legal(state: State, action: Action) -> bool:
    return (state, action) in TABLE


TERMINAL: Final = frozenset({State.DONE, State.DISCARDED})
"""States that end a message's life (kept as idempotency tombstones until the retention ends)."""
