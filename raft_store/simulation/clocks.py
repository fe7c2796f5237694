"""The simulated nodes' clocks and their faults, and the bound the log's clock must keep.

Each node has a wall clock (offset from true time, running at its own rate, stepped forward or
back at chosen moments, as NTP steps or a resumed VM do) and a monotonic clock (the same rate,
never stepped). Some seeds give one node (a minority) a large fault: an offset of seconds, a step,
or a rate of 1.5x, and move leadership to it. Drawn from a generator of their own, so the run's
other draws stay what they were.

The bound (docs/queue.md, "One clock"): the log's clock reads no further ahead of true time than
the majority's time (`majority_ahead_ms`: the k-th highest of the nodes' clock errors, k a
majority, each clock at the highest value a sample still in use can hold), except that it never
goes back: once ahead it moves on only as the majority's time does. One node's clock, however
wrong, is never the majority's.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from raft_store.core import Role
from raft_store.log_clock import LogClock
from raft_store.types import Message

if TYPE_CHECKING:
    from raft_store.simulation.cluster import Cluster, SimNode

EPOCH_MS: Final = 1_700_000_000_000
"""Simulated time 0 on a perfect clock."""
SAMPLE_TTL_MS: Final = 500
"""The nodes' LogClock sample lifetime: five election timeouts here, as 2 s is in a deployment."""
SLACK_MS: Final = 100
"""Message delay and the rounding of integer clocks, on top of the computed bound."""
BAND_MS: Final = 40
"""The nodes' LogClock band: two heartbeats of 2 ticks of 10 ms, as 120 ms is in a deployment."""


@dataclass(slots=True)
class SimClock:
    offset_ms: int
    rate: float
    steps: list[tuple[int, int]] = field(default_factory=list)
    """(true ms, change ms), in time order: the wall clock jumps by `change` at that moment."""

    def wall(self, now_ms: int) -> int:
        stepped = sum(change for at, change in self.steps if at <= now_ms)
        return EPOCH_MS + self.offset_ms + int(now_ms * self.rate) + stepped

    def monotonic(self, now_ms: int) -> int:
        return int(now_ms * self.rate)

    def highest_sample(self, now_ms: int, window_ms: int) -> int:
        """The highest value a sample of this clock taken up to `window_ms` ago can hold (samples are
        used as they came: the clock now, or just before a step back inside the window)."""
        start = now_ms - window_ms
        return max([self.wall(now_ms)] + [self.wall(at - 1) for at, _ in self.steps if start < at <= now_ms])


@dataclass(frozen=True, slots=True)
class ClockFaults:
    """Per seed, at most a minority of nodes gets one of these."""

    skew_probability: float = 0.3
    skew_ms_max: int = 30_000
    step_probability: float = 0.3
    step_ms_max: int = 30_000
    fast_probability: float = 0.15
    fast_rate: float = 1.5
    takeovers_max: int = 3
    """Leader transfers to the node with the bad clock during the chaos phase."""


@dataclass(slots=True)
class ClockPlan:
    bad: list[int]
    """Nodes given a large fault (a minority)."""
    takeovers: list[int]
    """True times at which leadership is moved to a bad node."""
    described: list[str]


def plan_clock_faults(
    rng: random.Random, clocks: dict[int, SimClock], faults: ClockFaults, horizon_ms: int
) -> ClockPlan:
    ids = sorted(clocks)
    minority = (len(ids) - 1) // 2
    bad: list[int] = []
    described: list[str] = []
    for kind in ("skew", "step", "fast"):
        probability = {"skew": faults.skew_probability, "step": faults.step_probability,
                       "fast": faults.fast_probability}[kind]  # fmt: skip
        if rng.random() >= probability:
            continue
        candidates = [n for n in ids if n not in bad] if len(bad) < minority else bad
        node = rng.choice(candidates)
        if node not in bad:
            bad.append(node)
        clock = clocks[node]
        if kind == "skew":
            clock.offset_ms += rng.choice((-1, 1)) * rng.randint(faults.skew_ms_max // 6, faults.skew_ms_max)
            described.append(f"n{node} offset {clock.offset_ms} ms")
        elif kind == "step":
            at = rng.randint(horizon_ms // 8, horizon_ms)
            change = rng.choice((-1, 1)) * rng.randint(faults.step_ms_max // 15, faults.step_ms_max)
            clock.steps.append((at, change))
            clock.steps.sort()
            described.append(f"n{node} steps {change:+} ms at {at} ms")
        else:
            clock.rate = faults.fast_rate
            described.append(f"n{node} runs at {faults.fast_rate}x")
    takeovers = sorted(rng.randint(200, horizon_ms) for _ in range(rng.randint(1, faults.takeovers_max))) if bad else []
    return ClockPlan(bad, takeovers, described)


def majority_ahead_ms(clocks: dict[int, SimClock], now_ms: int) -> int:
    """How far ahead of true time the highest time a majority of the clocks may be read at is."""
    window = SAMPLE_TTL_MS + SLACK_MS
    estimates = sorted((c.highest_sample(now_ms, window) for c in clocks.values()), reverse=True)
    majority = len(estimates) // 2 + 1
    return estimates[majority - 1] - (EPOCH_MS + now_ms)


class SimTime:
    """A cluster's clocks: each node's wall and monotonic clock, its `LogClock` fed as
    raft_store/node.py feeds it (stamps on the way out, samples on the way in), and the planned
    takeovers by a node whose clock is wrong."""

    def __init__(self, cluster: Cluster, faults: ClockFaults) -> None:
        self.cluster = cluster
        self.clocks = {n: SimClock(offset_ms=0, rate=node.drift) for n, node in cluster.nodes.items()}
        self.plan = plan_clock_faults(random.Random(cluster.seed ^ 0xC10C), self.clocks, faults, horizon_ms=8000)

    def wall(self, node_id: int) -> int:
        return self.clocks[node_id].wall(self.cluster.now)

    def monotonic(self, node_id: int) -> int:
        return self.clocks[node_id].monotonic(self.cluster.now)

    def started(self, node: SimNode) -> None:
        node.clock, node.clock_role = LogClock(node.node_id, sample_ttl_ms=SAMPLE_TTL_MS, band_ms=BAND_MS), None

    def read(self, node_id: int) -> int:
        """The node's reading of the log's clock, checked against the bound."""
        node = self.cluster.nodes[node_id]
        clock, core = node.clock, node.core
        assert clock is not None and core is not None
        role = (core.role is Role.LEADER, core.leader, core.conf.voters)
        if role != node.clock_role:
            node.clock_role = role
            clock.set_role(leading=role[0], leader=role[1], voters=role[2])
            if role[0]:  # as raft_store/node_clock.py does: never below the times its log holds
                clock.logged(self.cluster.latest_stamp_ms(node))
        reading = clock.read(wall_ms=self.wall(node_id), mono_ms=self.monotonic(node_id))
        self.cluster.checker.on_clock_reading(node_id, node.generation, reading, grounded=clock.grounded)
        return reading

    def stamped(self, node: SimNode, m: Message) -> Message:
        if node.core is None or node.clock is None:
            return m
        reading = self.read(node.node_id)  # read (and checked) on every send; followed only from a leader
        followed = node.clock.leading and node.clock.grounded
        return dataclasses.replace(m, wall_ms=self.wall(node.node_id), clock_ms=reading if followed else 0)

    def heard(self, node: SimNode, m: Message) -> None:
        assert node.clock is not None
        node.clock.heard_message(m, mono_ms=self.monotonic(node.node_id))

    def schedule_takeovers(self) -> None:
        for at in self.plan.takeovers:
            self.cluster.at(at, self._take_over)
        for line in self.plan.described:
            self.cluster.log(f"clock: {line}")

    def _take_over(self) -> None:
        """Move leadership to a node whose clock is wrong (the case the log's clock is for)."""
        cluster = self.cluster
        leader = cluster.leader()
        if leader is None or cluster.healed:
            return
        core = cluster.nodes[leader].core
        assert core is not None
        targets = [n for n in self.plan.bad if n != leader and n in core.conf.voters]
        if targets:
            cluster.log(f"leadership to n{targets[0]}, whose clock is off")
            core.transfer_leadership(targets[0])
            cluster._pump(leader)


__all__ = ["BAND_MS", "EPOCH_MS", "SAMPLE_TTL_MS", "SLACK_MS", "ClockFaults", "ClockPlan", "SimClock", "SimTime",
           "majority_ahead_ms", "plan_clock_faults"]  # fmt: skip
