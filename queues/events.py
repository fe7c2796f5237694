"""The store's events: what happened to a message or a kind, in log order, for the projector, the
publisher, the timelines and the audit.

Owns: the event types and the `Event` shape the machine writes and the queries read (re-exported
by queues.model, where the other values of the queue are).

Must never: import the machine, SQLite, a clock or a network module.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec


class EventType(enum.Enum):
    ENQUEUED = "enqueued"
    LEASED = "leased"
    LEASE_EXTENDED = "lease_extended"
    SUCCEEDED = "succeeded"
    ATTEMPT_FAILED = "attempt_failed"
    LEASE_EXPIRED = "lease_expired"
    DEAD_LETTERED = "dead_lettered"
    REDRIVEN = "redriven"
    DISCARDED = "discarded"
    PURGED = "purged"
    PAUSED = "paused"
    RESUMED = "resumed"
    POLICY_SET = "policy_set"
    RETENTION_SET = "retention_set"
    RELEASED = "released"
    TOKEN_PUT = "token_put"
    TOKEN_REVOKED = "token_revoked"
    QUOTA_SET = "quota_set"
    DOCUMENT_PUT = "document_put"
    ROUTE_FENCED = "route_fenced"


OPERATOR_EVENT_TYPES: Final = (EventType.DEAD_LETTERED, EventType.REDRIVEN, EventType.DISCARDED)
"""The events of a message that its row and attempt history do not already tell (who redrove or
discarded it, and why it went dead each time): indexed by message, for its timeline."""


EventValue = str | int | bool | None


class Event(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    """Dense, starting at 1: a projection saves the last seq it wrote, in its own transaction."""
    log_index: int
    ts_ms: int
    type: EventType
    message_id: int
    """0 for kind-level events (pause, resume, policy)."""
    kind: str
    data: dict[str, EventValue]
