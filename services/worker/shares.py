"""The worker's room (limits.py) shared by the sets it leases from: equal shares among the sets
that want a kind, each capped, so a backlog on one set cannot starve another.

Why equal shares and not "in proportion to what each has due": the store's read says whether a
kind has work ready in a set and how old its oldest is, not how much, and a count would only move
the split, not the guarantee that matters: a set with any work gets slots within one attempt's
time. So a kind's slots (and a downstream's) are split evenly among the sets that want them, a
set's share being ``ceil(limit / sets wanting)``; a set alone wanting a kind may take all of it.
When a second set starts to want it, the first keeps what it runs (nothing is cut off) but takes
no new slot while it is over its share, so every slot freed goes to the newcomer until it holds
its share: set B's few requests wait for the first of set A's attempts to end, not for A's
backlog. Work-conserving: a share unused by a set that wants nothing goes to those that do.

A set "wants" a kind while its lane says so: its last read found the kind ready, or its last
lease of it got all it asked for (a backlog). A set that is down, or found nothing, wants nothing
and holds no share.

Slots are taken before a Lease is sent (`take`) and those not granted are given back (`give`):
the lanes lease concurrently, so the room one lane saw must not be leased by another as well.

Must never: let the worker run more than its limits allow (Limits asserts it), or leave a lane
waiting for a slot that was freed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

from services.worker.limits import Limits


class Shares:
    def __init__(self, limits: Limits, set_ids: Iterable[int]) -> None:
        self.limits = limits
        self._sets = tuple(sorted(set_ids))
        self._held: dict[int, dict[str, int]] = {s: {} for s in self._sets}
        """Set -> kind -> slots it runs or has asked the store for."""
        self._wants: dict[int, frozenset[str]] = dict.fromkeys(self._sets, frozenset())
        self._freed: dict[int, asyncio.Event] = {s: asyncio.Event() for s in self._sets}

    def add(self, set_id: int) -> None:
        """A set added to the table while the worker runs: it shares the room from now on."""
        if set_id in self._held:
            return
        self._sets = tuple(sorted((*self._sets, set_id)))
        self._held[set_id] = {}
        self._wants[set_id] = frozenset()
        self._freed[set_id] = asyncio.Event()

    # ---- demand ------------------------------------------------------------------------------
    def want(self, set_id: int, kinds: Iterable[str]) -> None:
        self._wants[set_id] = frozenset(kinds)

    def wants(self, set_id: int) -> frozenset[str]:
        return self._wants[set_id]

    def others_hold(self, set_id: int) -> bool:
        """Other sets run something here: this set's demand may claim a share of it."""
        return any(sum(held.values()) for other, held in self._held.items() if other != set_id)

    # ---- room --------------------------------------------------------------------------------
    def free(self, set_id: int) -> dict[str, int]:
        """Kind -> attempts this set may start now: the worker's room within the set's share."""
        limits = self.limits
        found: dict[str, int] = {}
        for kind, room in limits.free().items():
            downstream = limits.downstream_of[kind]
            room = min(room, self._share_left(set_id, {kind}, limits.per_kind[kind]))
            siblings = {k for k, d in limits.downstream_of.items() if d == downstream}
            room = min(room, self._share_left(set_id, siblings, limits.per_downstream.get(downstream, limits.per_kind[kind])))
            if room > 0:
                found[kind] = room
        return found

    def _share_left(self, set_id: int, kinds: set[str], limit: int) -> int:
        wanting = 1 + sum(1 for other in self._sets if other != set_id and self._wants[other] & kinds)
        if wanting == 1:
            return limit
        held = sum(self._held[set_id].get(kind, 0) for kind in kinds)
        return math.ceil(limit / wanting) - held

    def take(self, set_id: int, kind: str, count: int) -> None:
        for _ in range(count):
            self.limits.acquire(kind)
        held = self._held[set_id]
        held[kind] = held.get(kind, 0) + count

    def give(self, set_id: int, kind: str, count: int = 1) -> None:
        """Slots back: an attempt ended, or a lease was granted fewer than were taken for it."""
        if count <= 0:
            return
        for _ in range(count):
            self.limits.release(kind)
        self._held[set_id][kind] -= count
        assert self._held[set_id][kind] >= 0
        for event in self._freed.values():
            event.set()

    def held(self, set_id: int) -> int:
        return sum(self._held[set_id].values())

    # ---- waiting -----------------------------------------------------------------------------
    def freed(self, set_id: int) -> asyncio.Event:
        """Set whenever a slot is given back (each lane clears its own before it waits)."""
        return self._freed[set_id]

    async def wait_freed(self, set_id: int, stop: asyncio.Event, timeout_s: float | None) -> None:
        event = self._freed[set_id]
        event.clear()
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(event.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
