"""The Ready runner's ports for one simulated node incarnation: the node's own runner, simulated I/O.

Every simulated node runs raft_store/ready_runner.py, the object the production node runs, so the
seeds exercise its batching, group commit, messages held until durable, applies alongside writes,
reads between applies and snapshot installs once drained. What differs is only where work runs:
- the disk lane takes a batch's writes into the disk's volatile buffer at once, then fsyncs after a
  simulated latency, in order, so a crash can land between write and fsync (and keep any prefix
  of what was written, or tear it);
- the machine lane runs each job after a simulated delay, in order (the apply thread), or, on
  the seeds drawn `threaded=False`, small applies run inline as the node's do (a follower's only
  below the node's lower limit for followers: the others go to the lane, which the node runs at
  background priority);
- timers are events; a snapshot is taken in an event of its own;
- a confirmed read is served by a read job between applies, and the state it reads is checked.
A crash drops the incarnation: its pending events see a newer generation and do nothing.

Planted bugs bend exactly this contract (messages sent before the fsync, a vote not fsynced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from raft_store.core import Ready
from raft_store.ready_runner import (
    FOLLOWER_INLINE_APPLY_BYTES_MAX,
    INLINE_APPLY_BYTES_MAX,
    ReadJob,
    ReadyRunner,
    Results,
    RunnerConfig,
)
from raft_store.types import Entry, Message, ReadState, Snapshot

if TYPE_CHECKING:
    from raft_store.simulation.cluster import Cluster, SimNode

T = TypeVar("T")


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Lane:
    """Jobs in order, each completing `delay()` ms after the previous one (or after submission)."""

    def __init__(self, ports: SimPorts, delay: Callable[[], float], *, run_at_submit: bool) -> None:
        self._ports = ports
        self._delay = delay
        self._run_at_submit = run_at_submit
        self._last_done_at = 0.0

    def submit(self, job: Callable[[], T], done: Callable[[Callable[[], T]], None]) -> None:
        cluster = self._ports.cluster
        early = _outcome(job) if self._run_at_submit else None
        done_at = max(cluster.now + self._delay(), self._last_done_at)
        self._last_done_at = done_at

        def complete() -> None:
            if not self._ports.alive():
                return
            outcome = early if early is not None else _outcome(job)
            if self._run_at_submit:
                self._ports.synced()
            done(outcome)

        cluster.at(done_at - cluster.now, complete)


class SimPorts:
    """Storage, lanes, applier, reader and effects of one incarnation of a simulated node."""

    def __init__(self, cluster: Cluster, node: SimNode, *, threaded: bool) -> None:
        self.cluster = cluster
        self.node = node
        self.generation = node.generation
        self._must_sync = False
        self._wake_scheduled = False
        self._reads: list[ReadState] = []
        """Read states confirmed and not yet served."""
        self.disk = _Lane(self, self._fsync_ms, run_at_submit=True)
        self.machine = _Lane(self, lambda: cluster.rng.uniform(0.05, 2.0), run_at_submit=False)
        assert node.core is not None
        config = RunnerConfig(
            inline_persist_bytes_max=-1,  # the fsync latency is the disk lane's
            inline_apply_bytes_max=-1 if threaded else INLINE_APPLY_BYTES_MAX,
            follower_inline_apply_bytes_max=-1 if threaded else FOLLOWER_INLINE_APPLY_BYTES_MAX,
            idle_commit_s=0.05,
            snapshot_every_entries=cluster.faults.snapshot_every_entries,
        )
        self.runner = ReadyRunner(node.core, config, storage=self, applier=self, reader=self,
                                  disk=self.disk, machine=self.machine, effects=self)  # fmt: skip

    def alive(self) -> bool:
        return self.node.core is not None and self.node.generation == self.generation

    def _fsync_ms(self) -> float:
        return self.cluster.rng.uniform(0.2, 3.0) if self._must_sync else 0.0

    # ---- Storage ------------------------------------------------------------------------------
    def persist(self, batch: list[Ready]) -> None:
        bugs, disk = self.cluster.bugs, self.node.disk
        self._must_sync = False
        for rd in batch:
            if rd.hard_state is not None:
                disk.write_hard_state(rd.hard_state)
            disk.write_entries(rd.entries)
            if bugs.ack_before_fsync or (bugs.vote_without_fsync and not rd.entries):
                for m in rd.messages:
                    self.send(m)
                rd.messages = []
            self._must_sync |= rd.must_sync and not (bugs.vote_without_fsync and not rd.entries)

    def synced(self) -> None:
        """The disk lane's fsync completed."""
        if self._must_sync:
            self._must_sync = False
            self.node.disk.sync()
            self.cluster._state_durable(self.node)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.cluster._install_snapshot(self.node, snapshot)

    # ---- Applier ------------------------------------------------------------------------------
    def apply(self, entries: list[Entry]) -> Results:
        node, cluster = self.node, self.cluster
        out: Results = []
        for entry in entries:
            if entry.index <= node.state_index:
                out.append(None)
                continue
            assert entry.index == node.state_index + 1, f"apply gap at n{node.node_id}"
            out.append(cluster._apply_entry(node, entry))
            node.state_index = entry.index
            cluster.checker.on_apply(node.node_id, entry)
        return out

    def applied(self, entries: list[Entry], results: Results) -> None:
        for entry, result in zip(entries, results, strict=True):
            if result is not None:
                self.cluster._answer(self.node, entry, result)

    def uncommitted(self) -> bool:
        return self.cluster._uncommitted(self.node)

    def commit(self) -> None:
        self.cluster._commit(self.node)

    # ---- Reader -------------------------------------------------------------------------------
    def read_state(self, state: ReadState) -> None:
        self.cluster.checker.on_read_state(self.node.node_id, state)
        self._reads.append(state)

    def pending(self) -> bool:
        return bool(self._reads)

    def take(self, applied: int) -> ReadJob[Any] | None:
        """The reads whose index has applied, served in one job on the machine lane: what the
        state they read reflects is checked against what they were promised."""
        due = [state for state in self._reads if state.index <= applied]
        if not due:
            return None
        self._reads = [state for state in self._reads if state.index > applied]
        node, checker = self.node, self.cluster.checker

        def serve() -> int:
            for state in due:
                checker.on_read_served(node.node_id, state, node.state_index)
            return node.state_index

        return serve, lambda result: None

    # ---- Effects ------------------------------------------------------------------------------
    def send(self, m: Message) -> None:
        self.cluster._send(self.node, m)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer()

        def fire() -> None:
            if self.alive() and not timer.cancelled:
                callback()

        self.cluster.at(delay_s * 1000, fire)
        return timer

    def take_snapshot(self) -> None:
        def take() -> None:
            if self.alive():
                try:
                    self.cluster._take_snapshot(self.node)
                finally:
                    self.runner.snapshot_done()

        self.cluster.at(0, take)

    def fail(self, exc: BaseException) -> None:
        self.cluster.fail(f"n{self.node.node_id} stopped: {type(exc).__name__}: {exc}")

    def wake(self) -> None:
        """Pump in an event of its own (the node sets an event its loop waits on): never from
        inside a runner callback, which would reorder the Readies it is dispatching."""
        if self._wake_scheduled:
            return
        self._wake_scheduled = True

        def pump() -> None:
            self._wake_scheduled = False
            if self.alive():
                self.cluster._pump(self.node.node_id)

        self.cluster.at(0, pump)

    def observe_fsync(self, entries: int, started: float) -> None:
        pass

    def now(self) -> float:
        return self.cluster.now / 1000


def _outcome(job: Callable[[], T]) -> Callable[[], T]:
    try:
        value = job()
    except Exception as exc:
        error = exc

        def raising() -> T:
            raise error

        return raising
    return lambda: value
