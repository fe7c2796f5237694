"""The queue's configuration: the values every replica must share, because they shape the state.

Must never: read the environment or a file (the composition root does, and passes a value).
"""

from __future__ import annotations

from dataclasses import dataclass

from delay.policy import DAY_MS, DEFAULT_POLICY, DELAY_MAX_MS, RetryPolicy

SCAN_LIMIT_MAX = 10_000
"""The most rows one bounded scan of the rules may read (expiries per lease, and the like)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueConfig:
    """Must be identical on every replica: it shapes the replicated state."""

    retention_ms: int = 7 * DAY_MS
    """Done and discarded messages stay as idempotency tombstones this long, then are purged."""
    event_retention_ms: int = 7 * DAY_MS
    """Events stay this long for projections to read, then Purge deletes them, oldest first.
    A reader that falls further behind is told so (`EventsAnswer.first_seq`), never silently
    skipped ahead: the Kafka contract, without which the table grows by every state change."""
    retention_floor_ms: int = DAY_MS
    """The shortest retention SetRetention accepts (the config's own values may be shorter, as the
    simulation's seconds are)."""
    expire_per_lease_max: int = 1024
    default_policy: RetryPolicy = DEFAULT_POLICY
    """The policy of the built-in kinds until a SetPolicy replaces it."""

    def validate(self) -> None:
        if not 0 < self.retention_ms <= DELAY_MAX_MS:
            raise ValueError("retention_ms must be in (0, DELAY_MAX_MS]")
        if not 0 < self.event_retention_ms <= DELAY_MAX_MS:
            raise ValueError("event_retention_ms must be in (0, DELAY_MAX_MS]")
        if not 0 < self.retention_floor_ms <= DELAY_MAX_MS:
            raise ValueError("retention_floor_ms must be in (0, DELAY_MAX_MS]")
        if not 1 <= self.expire_per_lease_max <= SCAN_LIMIT_MAX:
            raise ValueError(f"expire_per_lease_max must be in [1, {SCAN_LIMIT_MAX}]")
        self.default_policy.validate()
