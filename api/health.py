"""Liveness and readiness, as a load balancer and an orchestrator mean them.

Alive: the process answers. Ready: a leader of the store that holds the tokens (`queue`: the one
store, or the control set with several sets) is known and its applied index is within `lag_max`
of its commit index, and the token cache has heard from it (without tokens no request can be let
in). The store is asked at most once per `cache_s`, however often probes come.

With several sets (docs/sets.md, "/readyz"): ready also needs a set table read from the control set
(without one no key can be routed), and each set's state is reported (`sets`, `sets_down`), but a
set without a leader does not make the API unready, the home set included: only that set's keys
stop (503 with Retry-After per item), and a load balancer that took every API replica out for it
would stop the other sets' intake too.

Must never: change anything, or fail on an exception (a probe that raises reads as down).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.auth import TokenCache
from queues import QueueClient, SetsClient


@dataclass(slots=True)
class Readiness:
    queue: QueueClient
    tokens: TokenCache
    lag_max: int
    cache_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sets: SetsClient | None = None
    _last: tuple[float, bool, dict[str, Any]] | None = field(default=None, init=False)

    async def check(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.cache_s:
            return self._last[1], self._last[2]
        ready, detail = await self._probe()
        self._last = (now, ready, detail)
        return ready, detail

    async def _probe(self) -> tuple[bool, dict[str, Any]]:
        statuses = await self.queue.node_statuses()
        leaders = [s for s in statuses if s.get("role") == "leader"]
        detail: dict[str, Any] = {
            "nodes": [{k: s.get(k) for k in ("node", "address", "role", "term", "commit", "applied", "error")
                       if k in s} for s in statuses],
            "tokens_loaded": self.tokens.last_success_s is not None,
        }  # fmt: skip
        if not leaders:
            return False, {**detail, "reason": "no store leader is reachable"}
        leader = max(leaders, key=lambda s: int(s.get("term", 0)))
        lag = int(leader.get("commit", 0)) - int(leader.get("applied", 0))
        detail["leader"], detail["apply_lag"] = leader.get("node"), lag
        if lag > self.lag_max:
            return False, {**detail, "reason": f"the leader is {lag} entries behind its commit index"}
        if self.tokens.last_success_s is None:
            return False, {**detail, "reason": "tokens not loaded from the store yet"}
        if self.sets is not None:
            return await self._sets(detail)
        return True, detail

    async def _sets(self, detail: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Several sets: the table read, and each set's leader and lag (reported, not required)."""
        assert self.sets is not None
        if not self.sets.table.active():
            return False, {**detail, "reason": "no set table read from the control set yet"}
        per_set: dict[str, Any] = {}
        down: list[int] = []
        for status in await self.sets.statuses():
            leaders = [n for n in status.nodes if n.get("role") == "leader"]
            if not leaders:
                down.append(status.set_id)
                per_set[str(status.set_id)] = {"leader": None}
                continue
            leader = max(leaders, key=lambda n: int(n.get("term", 0)))  # type: ignore[call-overload]
            lag = int(leader.get("commit", 0)) - int(leader.get("applied", 0))  # type: ignore[call-overload]
            per_set[str(status.set_id)] = {"leader": leader.get("node"), "apply_lag": lag}
        return True, {**detail, "sets": per_set, "sets_down": down}
