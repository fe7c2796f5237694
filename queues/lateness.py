"""Lateness of deliveries: how long after its due time a message was leased.

Owns: the lateness of one grant, `now_ms - due_ms`, where `now_ms` is the leader's clock stamped
into the Lease command's log entry (recovered exactly as `deadline_ms - lease_ms`), and a report
over many grants (count, p50, p99, max). The `leased` event carries the same figure as
`lateness_ms`; `oldest_due_age_ms` is its live gauge (how late the oldest ready message already is).

Must never: read a clock (the figure is the replicated one, not the worker's receipt time).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from queues.model import Grant


def grant_lateness_ms(grant: Grant, lease_ms: int) -> int:
    """The lease's now_ms minus the message's due time; never negative (only due messages are granted)."""
    lateness = grant.deadline_ms - lease_ms - grant.due_ms
    assert lateness >= 0, f"grant of message {grant.message_id} before its due time"
    return lateness


def percentile(sorted_values: array[int] | list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return int(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


class LatenessReport:
    """Collects per-grant lateness (8 bytes a grant: 1 M grants are 8 MB)."""

    def __init__(self) -> None:
        self._values: array[int] = array("q")

    def observe(self, grants: Iterable[Grant], lease_ms: int) -> None:
        self._values.extend(grant_lateness_ms(g, lease_ms) for g in grants)

    def __len__(self) -> int:
        return len(self._values)

    def summary(self) -> dict[str, int]:
        ordered = sorted(self._values)
        return {
            "count": len(ordered),
            "lateness_p50_ms": percentile(ordered, 0.50),
            "lateness_p99_ms": percentile(ordered, 0.99),
            "lateness_max_ms": int(ordered[-1]) if ordered else 0,
        }
