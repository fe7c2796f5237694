"""How many attempts may run at once: per kind and per downstream, both bounded.

Why both: kinds share downstreams (a refund and a transfer both call the payment system), and a
downstream's limit protects it whatever the mix; a kind's limit keeps one kind's backlog from
taking every slot of a worker. Pure bookkeeping: the runner asks `free` before it leases and
`acquire`/`release` around each attempt.

Must never: let a count go negative or over its limit (asserted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Limits:
    per_kind: Mapping[str, int]
    """Kind -> most attempts at once in this worker."""
    per_downstream: Mapping[str, int]
    downstream_of: Mapping[str, str]
    """Kind -> the downstream its handler calls."""
    _kinds: dict[str, int] = field(default_factory=dict)
    _downstreams: dict[str, int] = field(default_factory=dict)

    def free(self) -> dict[str, int]:
        """Kind -> attempts it may start now (kinds with none are left out)."""
        found: dict[str, int] = {}
        for kind, limit in self.per_kind.items():
            downstream = self.downstream_of[kind]
            room = min(
                limit - self._kinds.get(kind, 0),
                self.per_downstream.get(downstream, limit) - self._downstreams.get(downstream, 0),
            )
            if room > 0:
                found[kind] = room
        return found

    def acquire(self, kind: str) -> None:
        downstream = self.downstream_of[kind]
        self._kinds[kind] = self._kinds.get(kind, 0) + 1
        self._downstreams[downstream] = self._downstreams.get(downstream, 0) + 1
        # A lease larger than the room asked for would be a bug in the runner, not a race: one
        # loop leases and acquires.
        assert self._kinds[kind] <= self.per_kind[kind], f"{kind} over its limit"

    def release(self, kind: str) -> None:
        downstream = self.downstream_of[kind]
        self._kinds[kind] -= 1
        self._downstreams[downstream] -= 1
        assert self._kinds[kind] >= 0 and self._downstreams[downstream] >= 0

    def in_flight(self, downstream: str) -> int:
        return self._downstreams.get(downstream, 0)

    @property
    def busy(self) -> int:
        return sum(self._kinds.values())
