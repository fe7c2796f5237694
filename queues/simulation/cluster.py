"""raft_store's simulated cluster with the production QueueMachine as every node's state machine.

Only the state hooks of `raft_store.simulation.cluster.Cluster` change: each node applies
committed entries to its own `QueueMachine(":memory:")` exactly as raft_store/node.py does
(decode the batch, `apply_batch` with the leader's stamped clock; no-op and membership entries
are `note_applied`), snapshots are machine images, and the machine is lazily durable like SQLite
with synchronous=NORMAL: its image survives a crash only as of some earlier fsync or snapshot
(behind, never ahead), and a restart restores the newer of that image and the disk's snapshot,
then replays the log tail. Each node has its own clock, offset and drifting (and on some seeds one
node's is seconds off, stepped, or 1.5x fast, and leadership is moved to it: raft_store/simulation/
clocks.py). The leader stamps its reading of the log's clock into the entries it proposes, and
every read (a worker's "what is due", the operator's pages) is answered at the reading of the
node that serves it, as raft_store/node.py does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from queues.machine import QueueConfig, QueueMachine
from queues.simulation.checker import QueueChecker
from queues.simulation.downstream import AppBugs
from queues.simulation.net import ClientNet, Reply, Status
from queues.simulation.workload import Workload
from raft_store.core import ProposalDropped, Role
from raft_store.simulation.clocks import EPOCH_MS
from raft_store.simulation.cluster import Bugs, Cluster, SimNode
from raft_store.state_machine import GroupCommittingMachine, decode_batch, encode_batch, latest_stamp_ms
from raft_store.types import Entry, EntryKind, Snapshot

CLOCK_OFFSET_MS_MAX = 400
DIGEST_EVERY = 128
"""Every replica's whole state is compared at each multiple of this log index."""
STATE_LAG = 0.5
"""Probability that an fsync leaves the machine's durable image where it was (lazily durable)."""


STRAGGLERS_MS_MAX = 10_000
"""How long after the workload stops its stragglers may still propose: a grant's work starts
within 0.5 s, a worker pauses at most 2.4 s before its call and again before its ack, and an ack
is tried at most three times on lanes of at most four 250 ms tries (about 9 s in all)."""

RETENTION_FLOOR_MS = 1_000
"""SetRetention's floor in the simulation: seconds, like its retentions (1 day in a deployment)."""


@dataclass(frozen=True, slots=True)
class ClockBugs:
    """The node's wall clock where the log's clock belongs; each must be caught."""

    stamp_wall_clock: bool = False
    """The leader stamps its own wall clock (the machine still never goes back): what the queue did
    before the log's clock, when a node 30 s slow that led froze every due time for 30 s."""
    read_wall_clock: bool = False
    """Reads call "now" the serving node's wall clock: a node behind the log answers "nothing is
    ready" while the next Lease would grant."""
    lead_from_applied: bool = False
    """A node taking the lead reads from the time it applied, blind to the later times its log
    holds (what the node did before seed 3001408): behind a slow majority, its stamps fall below
    the log's and the log's time stands still until its reading climbs past them."""


class QueueCluster(Cluster):
    def __init__(
        self, seed: int, nodes: int = 3, *, bugs: Bugs | None = None, app_bugs: AppBugs | None = None,
        clock_bugs: ClockBugs | None = None, membership: bool = False, replay: str | None = None,
        enqueuers: int = 3,
    ) -> None:
        # The base constructor starts every node, which loads state through the hooks below.
        self.machines: dict[int, QueueMachine] = {}
        # Seconds, not 7 days: tombstones and events are purged and keys taken again within a run.
        # Drawn from their own generator so that every other draw of a seed stays what it was.
        retention = random.Random(seed ^ 0x7E7E)
        self.queue_config = QueueConfig(
            retention_ms=retention.randint(1_500, 6_000), event_retention_ms=retention.randint(2_000, 8_000),
            retention_floor_ms=RETENTION_FLOOR_MS,
        )
        self.retention_rng = retention
        """The operator's SetRetention values come from here too, for the same reason."""
        self.images: dict[int, tuple[int, bytes]] = {}
        self._empty_image = _fresh_image()
        self._waiting: dict[int, dict[int, tuple[int, Reply]]] = {}  # node -> index -> (term, reply)
        self.clock_bugs = clock_bugs or ClockBugs()
        self.proposed_at: dict[tuple[int, int], int] = {}
        """(index, term) -> the true time its leader proposed it, for the checker's clock properties."""
        super().__init__(seed, nodes, bugs=bugs, membership=membership,
                         replay=replay or f"python -m queues.simulation --seed {seed} --nodes {nodes}")
        self.offsets = {n: self.rng.randint(-CLOCK_OFFSET_MS_MAX, CLOCK_OFFSET_MS_MAX) for n in self.ids}
        for node_id, offset in self.offsets.items():
            self.time.clocks[node_id].offset_ms += offset
        self.qchecker = QueueChecker(self)
        self.net = ClientNet(self)
        self.net.start(seed)
        self.workload = Workload(self, app_bugs or AppBugs(), enqueuers=enqueuers)

    def read_clock(self, node_id: int) -> int:
        """"Now" for a read that `node_id` answers: its reading of the log's clock, never behind the
        time its replica has applied (checked)."""
        now_ms = self.time.wall(node_id) if self.clock_bugs.read_wall_clock else self.time.read(node_id)
        self.qchecker.on_read(node_id, now_ms, self.machines[node_id].log_time_ms())
        return now_ms

    def true_clock(self) -> int:
        """The clock clients and workers read (their own skew is not modelled)."""
        return EPOCH_MS + self.now

    # ---- state hooks ---------------------------------------------------------------------
    def _initial_state(self) -> bytes:
        return self._empty_image

    def _load_state(self, node: SimNode, snapshot: Snapshot) -> int:
        index, image = self.images.get(node.node_id, (0, self._empty_image))
        if index < snapshot.meta.index:
            index, image = snapshot.meta.index, snapshot.data
        self._set_machine(node.node_id, image, index)
        assert node.clock is not None
        node.clock.committed(self.machines[node.node_id].log_time_ms())
        return index

    def _state_durable(self, node: SimNode) -> None:
        if self.rng.random() >= STATE_LAG:
            self.images[node.node_id] = (node.state_index, self.machines[node.node_id].snapshot_bytes())

    def _apply_entry(self, node: SimNode, entry: Entry) -> list[bytes]:
        machine = self.machines[node.node_id]
        proposed_ms = self.proposed_at.get((entry.index, entry.term))
        proposed = None if proposed_ms is None else (entry.term, proposed_ms)
        results: list[bytes] = []
        if entry.kind is EntryKind.NORMAL:
            now_ms, commands = decode_batch(entry.data)
            results = machine.apply_batch(entry.index, now_ms, commands)
            if node.clock is not None:
                node.clock.committed(now_ms)
            self.qchecker.on_apply(node.node_id, entry.index, now_ms, commands, results, proposed)
        else:
            machine.note_applied(entry.index)
            self.qchecker.on_apply(node.node_id, entry.index, None, [], [], proposed)
        if entry.index % DIGEST_EVERY == 0:
            self.qchecker.on_digest_point(node.node_id, entry.index)
        return results

    def latest_stamp_ms(self, node: SimNode) -> int:
        core = node.core
        if core is None or self.clock_bugs.lead_from_applied:
            return 0
        return latest_stamp_ms(core.log.entries_after(core.log.applied))

    def _uncommitted(self, node: SimNode) -> bool:
        machine = self.machines[node.node_id]
        return isinstance(machine, GroupCommittingMachine) and machine.uncommitted

    def _commit(self, node: SimNode) -> None:
        machine = self.machines[node.node_id]
        if isinstance(machine, GroupCommittingMachine):
            machine.commit()

    def _install_state(self, node: SimNode, snapshot: Snapshot) -> None:
        self._set_machine(node.node_id, snapshot.data, snapshot.meta.index)
        if node.clock is not None:
            node.clock.committed(self.machines[node.node_id].log_time_ms())

    def _snapshot_state(self, node: SimNode) -> bytes:
        return self.machines[node.node_id].snapshot_bytes()

    def _set_machine(self, node_id: int, image: bytes, index: int) -> None:
        old = self.machines.pop(node_id, None)
        if old is not None:
            old.close()
        machine = QueueMachine(":memory:", self.queue_config)
        machine.restore_bytes(image, index)
        self.machines[node_id] = machine

    # ---- proposals from clients --------------------------------------------------------------
    def receive(self, node_id: int, request: tuple[int, int, bytes], reply: Reply) -> None:
        """A client request reaches a node: the leader stamps its clock and proposes one entry."""
        core = self.nodes[node_id].core
        if core is None:
            return  # a dead process: the client times out
        if core.role is not Role.LEADER:
            reply(Status.NOT_LEADER, b"")
            return
        stamp = self.time.wall(node_id) if self.clock_bugs.stamp_wall_clock else self.time.read(node_id)
        self.checker.check_clock_bound(f"n{node_id}'s stamp", stamp)
        try:
            index = core.propose(encode_batch(stamp, [request]))
        except ProposalDropped:
            reply(Status.DROPPED, b"")
            return
        self.proposed_at[(index, core.term)] = self.now
        self._waiting.setdefault(node_id, {})[index] = (core.term, reply)
        self._pump(node_id)

    def _answer(self, node: SimNode, entry: Entry, result: list[bytes]) -> None:
        waiting = self._waiting.get(node.node_id, {}).pop(entry.index, None)
        if waiting is None:
            return
        term, reply = waiting
        if term != entry.term or not result:
            reply(Status.NOT_LEADER, b"")  # the proposal was overwritten by another leader
        else:
            reply(Status.OK, result[0])

    def crash(self, node_id: int) -> None:
        running = self.nodes[node_id].core is not None
        super().crash(node_id)
        if running:
            self._waiting.pop(node_id, None)  # in-flight proposals die with the process
            self.machines.pop(node_id).close()

    # ---- the run --------------------------------------------------------------------------
    def run(self, chaos_ms: int = 8000, heal_ms: int = 6000) -> dict[str, Any]:
        """Chaos, then heal and drain until every message settled, then let replicas converge."""
        drain_ms_max = 30_000
        self.workload.start()
        self.at(100, self.operators.chaos)
        self.time.schedule_takeovers()
        self.run_until(chaos_ms)
        self.heal()
        self.workload.drain()
        while self.now < chaos_ms + drain_ms_max and not self.workload.drained():
            self.run_until(self.now + 250)
        if not self.workload.drained():
            self.qchecker.violation(f"not settled {drain_ms_max} ms after healing: {self.workload.unsettled()}")
        self.workload.stop()
        # Stragglers still propose: acks and fails of workers that paused past their leases (two
        # pauses of up to 2.4 s each) and their clients' retries. Check once the log is quiet.
        self.run_until_quiet(self.now + max(1000, heal_ms // 3), wait_max_ms=STRAGGLERS_MS_MAX)
        self.qchecker.check_end()
        self.stats["sim_ms"] = self.now
        return self.summary()

    def summary(self) -> dict[str, Any]:
        stats: dict[str, Any] = dict(self.stats)
        stats.update(self.workload.stats())
        stats.update(self.qchecker.stats())
        stats["faults"] = self.stats["faults"] + stats["pauses"] + self.net.stats.cuts
        stats["client_cuts"] = self.net.stats.cuts
        return stats


def _fresh_image() -> bytes:
    machine = QueueMachine(":memory:")
    try:
        return machine.snapshot_bytes()
    finally:
        machine.close()


__all__ = ["EPOCH_MS", "QueueCluster"]
