"""When a simulated run may be checked for convergence: after the leader's log stopped growing.

Stopping the workload does not stop its stragglers (a worker paused past its lease still acks, a
client still retries), so a check at a fixed time can catch a command committed on the leader a
heartbeat before its followers learn of it: the protocol's normal state, not a stall (seed 3001010
of the queue simulator, docs/queue-simulation.md). Kept apart from the cluster, which owns the
simulated nodes; this owns only the rule for when to look.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from raft_store.core import RaftCore

TICK_MS = 10
ELECTION_TICKS = 10


class _Node(Protocol):
    @property
    def core(self) -> RaftCore | None: ...


class Quietable(Protocol):
    @property
    def now(self) -> int: ...
    @property
    def nodes(self) -> Mapping[int, _Node]: ...

    def leader(self) -> int | None: ...

    def run_until(self, end_ms: int) -> None: ...

    def fail(self, reason: str) -> None: ...

    def quiet_ms(self) -> int: ...


def quiet_ms(clock_drift_max: float) -> int:
    """How long after the leader's last append every healthy member has applied it (healed
    network): the append and its answers take a few ms (delivery at most 2 ms, an fsync at most
    3 ms), and a follower that holds the entry learns that it committed from the next append or
    heartbeat (replication.py, `_commit_advanced`), one every HEARTBEAT_TICKS ticks, about 40 ms
    in all. Bounded here by an election timeout at the slowest tick rate (more than twice that):
    a follower that has heard nothing from its leader for that long campaigns, so the protocol
    itself promises a message carrying the commit index within it."""
    return int(ELECTION_TICKS * TICK_MS * (1 + clock_drift_max)) + 1


def run_until_quiet(cluster: Quietable, end_ms: int, wait_max_ms: int) -> None:
    """Run to `end_ms`, and on until the leader's log has not grown for `quiet_ms()`, so that a
    convergence check that follows asks only what the protocol promises: a command proposed
    just before the check commits on the leader and reaches the followers a heartbeat later.
    Runs exactly as `run_until(end_ms)` when the log was already quiet; fails when it never
    goes quiet within `wait_max_ms` after `end_ms`. A follower that stalls stays behind
    however long this waits, and the check that follows still fails it."""
    quiet = cluster.quiet_ms()
    cluster.run_until(end_ms - quiet)
    tail, since = _log_tail(cluster), cluster.now
    while cluster.now < end_ms or cluster.now - since < quiet:
        if cluster.now >= end_ms + wait_max_ms:
            cluster.fail(f"the log never went quiet: the leader's log still grew {wait_max_ms} ms after"
                         f" the run should have ended (last {tail})")  # fmt: skip
        cluster.run_until(cluster.now + 1)
        now_tail = _log_tail(cluster)
        if now_tail != tail:
            tail, since = now_tail, cluster.now


def _log_tail(cluster: Quietable) -> tuple[int, int, int] | None:
    """(leader, term, last index) of the current leader's log, or None without a leader."""
    leader = cluster.leader()
    if leader is None:
        return None
    core = cluster.nodes[leader].core
    assert core is not None
    return leader, core.term, core.log.last_index()
