"""One simulated clock and event queue shared by several queue clusters (the multi-set simulation).

Each set, and the control set, is a `QueueCluster` (raft_store's simulated cluster running the
production RaftCore, Ready runner and QueueMachine, with its own faults, clients and checker). A
`WorldCluster` hands its events to the `World` instead of keeping its own heap, so every cluster
sees one `now`, and events of different clusters interleave in time order, as processes of one
deployment do. Everything draws from generators derived from one seed, so a run replays exactly.

Must never: let a cluster's event run out of time order with another's, or hide which cluster a
failure came from.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from queues.simulation.cluster import QueueCluster
from raft_store.simulation.cluster import SimulationFailure


class World:
    def __init__(self, seed: int, replay: str) -> None:
        self.seed = seed
        self.replay = replay
        self.now = 0
        self._events: list[tuple[int, int, WorldCluster, Callable[[], None]]] = []
        self._seq = 0

    def schedule(self, owner: WorldCluster, delay_ms: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + max(0, int(delay_ms)), self._seq, owner, action))

    def run_until(self, end_ms: int) -> None:
        while self._events and self._events[0][0] <= end_ms:
            when, _, owner, action = heapq.heappop(self._events)
            self.now = when
            try:
                action()
                owner.checker.after_event()
            except SimulationFailure:
                raise
            except (AssertionError, Exception) as exc:  # a crash of the core is a finding too
                owner.fail(f"{type(exc).__name__}: {exc}")
        self.now = max(self.now, end_ms)

    def run_until_quiet(self, clusters: list[WorldCluster], end_ms: int, wait_max_ms: int) -> None:
        """`Cluster.run_until_quiet` for every cluster at once: on until no leader's log has grown
        for an election timeout (a command answered just before the check reaches the followers
        with the next heartbeat)."""
        quiet = clusters[0].quiet_ms()
        self.run_until(end_ms - quiet)
        tails, since = [c.log_tail() for c in clusters], self.now
        while self.now < end_ms or self.now - since < quiet:
            if self.now >= end_ms + wait_max_ms:
                clusters[0].fail(f"the logs never went quiet {wait_max_ms} ms after the run should have ended")
            self.run_until(self.now + 1)
            now_tails = [c.log_tail() for c in clusters]
            if now_tails != tails:
                tails, since = now_tails, self.now


class WorldCluster(QueueCluster):
    """A queue cluster whose clock and events are the world's; `label` names it in failures."""

    def __init__(self, world: World, label: str, seed: int, **kwargs: Any) -> None:
        self.world = world  # before the base constructor: it starts nodes, which schedule ticks
        self.label = label
        super().__init__(seed, replay=world.replay, **kwargs)

    @property
    def now(self) -> int:
        return self.world.now

    @now.setter
    def now(self, value: int) -> None:
        """The base constructor and `run_until` assign it; the world's clock is the one that moves."""

    def at(self, delay_ms: float, action: Callable[[], None]) -> None:
        self.world.schedule(self, delay_ms, action)

    def run_until(self, end_ms: int) -> None:
        self.world.run_until(end_ms)

    def log_tail(self) -> tuple[int, int, int] | None:
        """(leader, term, last index) of the leader's log, as raft_store/simulation/quiet.py watches it."""
        leader = self.leader()
        core = None if leader is None else self.nodes[leader].core
        return None if leader is None or core is None else (leader, core.term, core.log.last_index())

    def fail(self, reason: str) -> None:
        raise SimulationFailure(self.world.seed, self.world.replay, f"{self.label}: {reason}", self.trace)

    def fresh_node(self) -> int | None:
        """A node whose state a linearizable read would see, or None (no such read can be served
        now: the caller's read fails, as a ReadIndex without a majority does). The newest leader,
        its term at least every live node's, that has committed an entry of its term (the
        ReadIndex rule) and applied all it committed."""
        leader = self.leader()
        if leader is None or leader not in self.machines:
            return None
        core = self.nodes[leader].core
        assert core is not None
        if any(n.core is not None and n.core.term > core.term for n in self.nodes.values()):
            return None
        committed = core.log.committed
        if core.log.term(committed) != core.term or self.nodes[leader].state_index < committed:
            return None
        return leader
