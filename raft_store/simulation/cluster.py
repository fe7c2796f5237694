"""A seeded cluster: production RaftCore objects, a hostile network, crashing disks, a checker.

One `random.Random(seed)` decides every delay, drop, partition, crash and proposal, so a failing
run is replayed exactly by `python -m raft_store.simulation --seed N ...`.

Every node runs the production Ready runner (raft_store/ready_runner.py) with simulated I/O
(ports.py): writes reach the disk's volatile buffer at once and are fsynced after a simulated
latency, so a crash can land between them; applies run inline or on a simulated apply thread.
Planted bugs bend exactly that contract to prove the checker notices.
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raft_store.core import Config, RaftCore, Recovered, Role
from raft_store.log_clock import LogClock
from raft_store.simulation import quiet
from raft_store.simulation.checker import Checker
from raft_store.simulation.clocks import ClockFaults, SimTime
from raft_store.simulation.disk import SimCorruption, SimDisk
from raft_store.simulation.operators import Operators
from raft_store.simulation.ports import SimPorts
from raft_store.simulation.quiet import ELECTION_TICKS, TICK_MS
from raft_store.types import (
    ConfState,
    Entry,
    EntryKind,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

HEARTBEAT_TICKS = 2
STATS = ("faults", "crashes", "partitions", "drops", "corruptions", "acked", "proposed", "snapshots", "conf_changes", "reads")


@dataclass(frozen=True, slots=True)
class Faults:
    """Probabilities and rates of each fault; all zero means a perfect world."""

    drop: float = 0.05
    duplicate: float = 0.03
    delay_ms_max: int = 20
    partition_every_ms: int = 1500
    partition_probability: float = 0.5
    one_way_probability: float = 0.3
    crash_every_ms: int = 700
    crash_probability: float = 0.5
    corrupt_probability: float = 0.1
    restart_after_ms_max: int = 1500
    membership_every_ms: int = 2000
    clock_drift_max: float = 0.1
    snapshot_every_entries: int = 40
    read_every_ms: int = 400


@dataclass(frozen=True, slots=True)
class Bugs:
    """Deliberately broken drivers; each must make the checker fail on some seeds."""

    ack_before_fsync: bool = False
    vote_without_fsync: bool = False
    truncate_on_corruption: bool = False


class SimulationFailure(AssertionError):
    def __init__(self, seed: int, replay: str, reason: str, trace: list[str]) -> None:
        tail = "\n".join(trace[-40:])
        super().__init__(f"seed {seed}: {reason}\nreplay: {replay}\nlast events:\n{tail}")
        self.seed = seed
        self.reason = reason


@dataclass(slots=True)
class SimNode:
    node_id: int
    disk: SimDisk
    core: RaftCore | None = None
    applied: list[tuple[int, int, bytes]] = field(default_factory=list)  # (index, term, data)
    state_index: int = 0  # index the state machine reflects
    durable_state: tuple[int, tuple[tuple[int, int, bytes], ...]] = (0, ())
    ports: SimPorts | None = None
    """This incarnation's Ready runner and its simulated I/O."""
    corrupted: bool = False
    corruption_planted: bool = False
    drift: float = 1.0
    generation: int = 0  # bumps on every crash, so stale events of a dead incarnation are ignored
    clock: LogClock | None = None
    """The node's reading of the log's clock (production code), fed as raft_store/node.py feeds it."""
    clock_role: tuple[bool, int, frozenset[int]] | None = None


class Cluster:
    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        faults: Faults | None = None,
        bugs: Bugs | None = None,
        *,
        membership: bool = False,
        replay: str | None = None,
        clock_faults: ClockFaults | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.bugs = bugs or Bugs()
        self.membership = membership
        self.replay = replay or f"python -m raft_store.simulation --seed {seed} --nodes {nodes}"
        self.now = 0
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.ids = list(range(1, nodes + 1))
        initial = ConfState(voters=frozenset(self.ids))
        self.nodes: dict[int, SimNode] = {}
        for node_id in self.ids:
            disk = SimDisk(truncate_on_corruption=self.bugs.truncate_on_corruption)
            disk.snapshot = Snapshot(SnapshotMeta(0, 0, initial), self._initial_state())
            self.nodes[node_id] = SimNode(
                node_id, disk, drift=1 + self.rng.uniform(-self.faults.clock_drift_max, self.faults.clock_drift_max)
            )
        self.time = SimTime(self, clock_faults or ClockFaults())  # the nodes' clocks and the log's
        self.blocked: set[tuple[int, int]] = set()
        self.checker = Checker(self)
        self.trace: list[str] = []
        self.healed = False
        self.threaded = self.rng.random() < 0.5
        """Every apply on the simulated apply thread; else small ones inline, as the node does."""
        self.stats = dict.fromkeys(STATS, 0)
        self.operators = Operators(self)
        for node_id in self.ids:
            self._start(node_id)

    # ---- event loop ------------------------------------------------------------------
    def at(self, delay_ms: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + max(0, int(delay_ms)), self._seq, action))

    def run_until(self, end_ms: int) -> None:
        while self._events and self._events[0][0] <= end_ms:
            when, _, action = heapq.heappop(self._events)
            self.now = when
            try:
                action()
                self.checker.after_event()
            except SimulationFailure:
                raise
            except (AssertionError, Exception) as exc:  # a crash of the core is a finding too
                self.fail(f"{type(exc).__name__}: {exc}")
        self.now = max(self.now, end_ms)

    def quiet_ms(self) -> int:
        return quiet.quiet_ms(self.faults.clock_drift_max)

    def run_until_quiet(self, end_ms: int, wait_max_ms: int) -> None:
        quiet.run_until_quiet(self, end_ms, wait_max_ms)

    def fail(self, reason: str) -> None:
        raise SimulationFailure(self.seed, self.replay, reason, self.trace)

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now:>7}ms {text}")
        if len(self.trace) > 400:
            del self.trace[:200]

    # ---- nodes --------------------------------------------------------------------------
    def _start(self, node_id: int) -> None:
        node = self.nodes[node_id]
        self.time.started(node)
        try:
            rec = node.disk.recover()
        except SimCorruption as exc:
            node.corrupted = True
            self.stats["corruptions"] += 1
            self.log(f"n{node_id} refuses to start: {exc}")
            return
        snapshot = rec.snapshot
        assert snapshot is not None
        state_index = self._load_state(node, snapshot)
        node.state_index = state_index
        self.checker.on_restart(node_id, rec.hard_state, rec.entries, snapshot.meta)
        recovered = Recovered(
            hard_state=rec.hard_state,
            snapshot=snapshot.meta,
            entries=tuple(rec.entries),
            applied=min(state_index, rec.entries[-1].index if rec.entries else snapshot.meta.index),
        )
        if recovered.applied < state_index:
            # State machine is ahead of a log that lost its tail: impossible with a correct WAL.
            self.fail(f"n{node_id} state machine at {state_index} ahead of its log")
        node.core = RaftCore(
            Config(node_id=node_id, election_ticks=ELECTION_TICKS, heartbeat_ticks=HEARTBEAT_TICKS, inflight_max=4,
                   append_bytes_max=600),
            recovered,
            random.Random(self.rng.getrandbits(64)),
        )
        node.generation += 1
        node.ports = SimPorts(self, node, threaded=self.threaded)
        self._schedule_tick(node_id, node.generation)
        self.log(
            f"n{node_id} started term={rec.hard_state.term} vote={rec.hard_state.vote} "
            f"last={node.core.log.last_index()} torn={rec.torn_tail}"
        )

    def crash(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            return
        may_corrupt = (
            self.rng.random() < self.faults.corrupt_probability
            and sum(1 for n in self.nodes.values() if n.corruption_planted) < self._corruption_budget()
        )
        node.corruption_planted |= may_corrupt
        self.checker.on_crash(node_id)
        what = node.disk.crash(self.rng, may_corrupt=may_corrupt)
        node.core = None
        node.ports = None
        node.clock = None
        node.generation += 1
        self.stats["crashes"] += 1
        self.stats["faults"] += 1
        self.operators.crashed(node_id)
        self.log(f"n{node_id} CRASH ({what})")

    def _corruption_budget(self) -> int:
        """Nodes whose disks may be corrupted (they never come back) while a majority of the
        smallest configuration the run can reach stays healthy; with membership churn one voter
        may be removed, so the budget is computed for one node fewer."""
        smallest = len(self.ids) - 1 if self.membership else len(self.ids)
        return (smallest - 1) // 2

    def restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is None and not node.corrupted:
            self._start(node_id)

    def _schedule_tick(self, node_id: int, generation: int) -> None:
        node = self.nodes[node_id]
        self.at(TICK_MS * node.drift, lambda: self._tick(node_id, generation))

    def _tick(self, node_id: int, generation: int) -> None:
        node = self.nodes[node_id]
        if node.core is None or node.generation != generation:
            return
        core = node.core
        quiet = core.ticks_until_due() > 1
        before = _tick_view(core) if quiet else None
        core.tick()
        if quiet and _tick_view(core) != before:
            # The node's shell lets such ticks pass unseen (node.py, `_deliver_ticks`): one
            # that did more than count would have been delivered late.
            self.fail(f"n{node_id} a tick the core called quiet changed {before} to {_tick_view(core)}")
        self._pump(node_id)
        self._schedule_tick(node_id, generation)

    # ---- the Ready cycle ------------------------------------------------------------------
    def _pump(self, node_id: int) -> None:
        """What the node's loop does after stepping its inputs: hand the core's Readies to its
        runner, and serve the reads that are due."""
        ports = self.nodes[node_id].ports
        if ports is not None:
            ports.runner.pump()
            ports.runner.serve_reads()

    def _answer(self, node: SimNode, entry: Entry, result: list[bytes]) -> None:
        """The leader that took a proposal answers its client once it applied the entry."""
        if entry.kind is EntryKind.NORMAL:
            self.operators.applied(node.node_id, entry)

    # ---- the replicated state: hooks a subclass replaces to run a real state machine ----------
    # The base replicates an opaque list of applied entries, which is all the Raft checker needs.
    def _initial_state(self) -> bytes:
        """The state image of the snapshot every disk starts with (index 0)."""
        return _encode_state(())

    def _load_state(self, node: SimNode, snapshot: Snapshot) -> int:
        """Rebuild a restarting node's state; return the index it reflects.

        The state machine persists lazily (SQLite synchronous=NORMAL): it may be behind the
        snapshot after a power cut, in which case the runner restores it from the snapshot."""
        state_index, state = node.durable_state
        if state_index < snapshot.meta.index:
            state_index, state = snapshot.meta.index, _decode_state(snapshot.data)
        node.applied = list(state)
        return state_index

    def _state_durable(self, node: SimNode) -> None:
        """The state machine's own storage caught up with what it applied (fsync or snapshot)."""
        node.durable_state = (node.state_index, tuple(node.applied))

    def _apply_entry(self, node: SimNode, entry: Entry) -> list[bytes]:
        """Apply one entry to the node's state; the results its proposer is answered with."""
        node.applied.append((entry.index, entry.term, entry.data))
        return []

    def latest_stamp_ms(self, node: SimNode) -> int:
        """The greatest time stamped in the entries of the node's log it has not applied: the base's
        entries carry no time."""
        return 0

    def _uncommitted(self, node: SimNode) -> bool:
        """The node's machine holds applied state its store has not committed (group commit)."""
        return False

    def _commit(self, node: SimNode) -> None:
        """Commit what `_uncommitted` reported (the runner's idle commit)."""

    def _install_state(self, node: SimNode, snapshot: Snapshot) -> None:
        node.applied = list(_decode_state(snapshot.data))

    def _snapshot_state(self, node: SimNode) -> bytes:
        return _encode_state(tuple(node.applied))

    def _install_snapshot(self, node: SimNode, snapshot: Snapshot) -> None:
        node.disk.save_snapshot(snapshot, installed=True)
        self._install_state(node, snapshot)
        node.state_index = snapshot.meta.index
        self.checker.on_snapshot_installed(node.node_id, snapshot)

    def _take_snapshot(self, node: SimNode) -> None:
        """Compact the log at what the machine has applied (the runner decided it is time)."""
        core = node.core
        assert core is not None
        if node.state_index != core.log.applied or core.log.applied <= core.log.snapshot_index:
            return
        meta = core.compact(core.log.applied)
        node.disk.save_snapshot(Snapshot(meta, self._snapshot_state(node)), installed=False)
        self._state_durable(node)
        self.stats["snapshots"] += 1

    # ---- network ------------------------------------------------------------------------
    def _send(self, node: SimNode, m: Message) -> None:
        self.checker.on_send(m)
        if m.type is MessageType.SNAP:
            snap = node.disk.snapshot
            # The core may have compacted again since it queued this message: the runner always
            # ships the newest snapshot it holds, never an older one than the core asked for.
            assert snap is not None and m.snapshot is not None and snap.meta.index >= m.snapshot.meta.index
            m = _with_snapshot(m, snap)
        m = self.time.stamped(node, m)
        if (m.frm, m.to) in self.blocked:
            return
        if not self.healed and self.rng.random() < self.faults.drop:
            self.stats["drops"] += 1
            return
        copies = 2 if not self.healed and self.rng.random() < self.faults.duplicate else 1
        for _ in range(copies):
            delay = self.rng.uniform(0.5, self.faults.delay_ms_max if not self.healed else 2)
            self.at(delay, functools.partial(self._deliver, m))

    def _deliver(self, m: Message) -> None:
        node = self.nodes.get(m.to)
        if node is None or node.core is None or (m.frm, m.to) in self.blocked:
            return
        self.time.heard(node, m)
        node.core.step(m)
        self._pump(m.to)

    # ---- clients and operators (operators.py) ----------------------------------------------
    def leader(self) -> int | None:
        best: tuple[int, int] | None = None
        for node_id, node in self.nodes.items():
            core = node.core
            if core is not None and core.role is Role.LEADER and (best is None or core.term > best[0]):
                best = (core.term, node_id)
        return best[1] if best else None

    # ---- the whole run ---------------------------------------------------------------------
    def run(self, chaos_ms: int = 8000, heal_ms: int = 6000) -> dict[str, Any]:
        operators = self.operators
        self.at(0, operators.client_loop)
        self.at(100, operators.chaos)
        self.time.schedule_takeovers()
        self.run_until(chaos_ms)
        self.heal()
        self.run_until(chaos_ms + heal_ms // 2)
        operators.clients_stopped = True
        operators.final_proposal()
        self.run_until(chaos_ms + heal_ms)
        self.checker.check_converged(operators.final_value)
        return dict(self.stats)

    def heal(self) -> None:
        self.healed = True
        self.blocked = set()
        for node_id in self.ids:
            self.restart(node_id)
        self.log("HEAL")


def _with_snapshot(m: Message, snapshot: Snapshot) -> Message:
    return Message(m.type, to=m.to, frm=m.frm, term=m.term, snapshot=snapshot)


def _tick_view(core: RaftCore) -> tuple[object, ...]:
    """What a tick may change besides its counters: a quiet tick (`RaftCore.ticks_until_due`
    above 1) must leave all of it as it was, and leave a core with nothing to hand over so."""
    progress = tuple((node, pr.state) for node, pr in sorted(core.progress.items()))
    return (core.role, core.term, core.vote, core.leader, core.lead_transferee, progress, core.has_ready())


def _encode_state(applied: tuple[tuple[int, int, bytes], ...]) -> bytes:
    out = bytearray()
    for index, term, data in applied:
        out += index.to_bytes(8, "big") + term.to_bytes(8, "big") + len(data).to_bytes(4, "big") + data
    return bytes(out)


def _decode_state(blob: bytes) -> tuple[tuple[int, int, bytes], ...]:
    out = []
    offset = 0
    while offset < len(blob):
        index = int.from_bytes(blob[offset : offset + 8], "big")
        term = int.from_bytes(blob[offset + 8 : offset + 16], "big")
        length = int.from_bytes(blob[offset + 16 : offset + 20], "big")
        out.append((index, term, blob[offset + 20 : offset + 20 + length]))
        offset += 20 + length
    return tuple(out)


__all__ = ["Bugs", "Cluster", "Faults", "SimulationFailure"]
