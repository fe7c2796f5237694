"""What clients and operators do to a simulated cluster: the Raft checker's workload and the faults.

Clients propose unique values to the leader (and are answered once the leader applied them),
ask for linearizable reads, and after healing make one final proposal that must commit (the
liveness half of the check). The fault schedule crashes and restarts nodes, partitions the
network (symmetric or one way), changes the membership and moves leadership. Every draw comes
from the cluster's one generator, so a seed replays exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft_store.core import ProposalDropped, RaftCore
from raft_store.membership import MembershipError
from raft_store.types import ConfChange, ConfChangeType, Entry

if TYPE_CHECKING:
    from raft_store.simulation.cluster import Cluster


class Operators:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.clients_stopped = False
        self.final_value = -1
        self._next_value = 0
        self._inflight: dict[int, tuple[int, int, int]] = {}  # value -> (leader, index, term)

    def crashed(self, node_id: int) -> None:
        """Proposals in flight at a crashed leader: the client sees a timeout, outcome unknown."""
        for value, (leader, _, _) in list(self._inflight.items()):
            if leader == node_id:
                del self._inflight[value]

    def applied(self, node_id: int, entry: Entry) -> None:
        """The leader that took a proposal answers its client once it applied the entry."""
        value = int.from_bytes(entry.data[:8], "big")
        pending = self._inflight.get(value)
        if pending and pending[0] == node_id:
            del self._inflight[value]
            if (pending[1], pending[2]) == (entry.index, entry.term):
                self.cluster.stats["acked"] += 1
                self.cluster.checker.on_ack(value, entry)

    def leader_core(self) -> tuple[int, RaftCore] | None:
        leader = self.cluster.leader()
        if leader is None:
            return None
        core = self.cluster.nodes[leader].core
        assert core is not None
        return leader, core

    def propose(self) -> None:
        found = self.leader_core()
        if found is None:
            return
        leader, core = found
        self._next_value += 1
        value = self._next_value
        data = value.to_bytes(8, "big") + self.cluster.rng.randbytes(self.cluster.rng.randrange(0, 64))
        try:
            index = core.propose(data)
        except ProposalDropped:
            return
        self.cluster.stats["proposed"] += 1
        self._inflight[value] = (leader, index, core.term)
        self.cluster._pump(leader)

    def change_membership(self) -> None:
        found = self.leader_core()
        if found is None:
            return
        leader, core = found
        conf = core.conf
        missing = [n for n in self.cluster.ids if n not in conf.voters]
        if missing:
            change = ConfChange(ConfChangeType.ADD_VOTER, self.cluster.rng.choice(missing))
        else:
            candidates = [n for n in sorted(conf.voters) if n != leader]
            change = ConfChange(ConfChangeType.REMOVE_NODE, self.cluster.rng.choice(candidates))
        try:
            core.propose_conf_change(change)
        except (ProposalDropped, MembershipError):
            return
        self.cluster.stats["conf_changes"] += 1
        self.cluster.log(f"n{leader} proposes {change.change.name} n{change.node}")
        self.cluster._pump(leader)

    def read(self) -> None:
        found = self.leader_core()
        if found is None:
            return
        leader, core = found
        self.cluster.stats["reads"] += 1
        context = self.cluster._seq.to_bytes(8, "big")
        self.cluster.checker.on_read_requested(context, leader)
        core.read_index(context)
        self.cluster._pump(leader)

    def transfer(self) -> None:
        found = self.leader_core()
        if found is None:
            return
        leader, core = found
        targets = [n for n in sorted(core.conf.voters) if n != leader]
        if targets:
            core.transfer_leadership(self.cluster.rng.choice(targets))
            self.cluster._pump(leader)

    def chaos(self) -> None:
        if self.cluster.healed:
            return
        f = self.cluster.faults
        r = self.cluster.rng.random()
        if r < 0.25 and f.crash_probability:
            alive = [n for n, node in self.cluster.nodes.items() if node.core is not None]
            if alive and self.cluster.rng.random() < f.crash_probability:
                victim = self.cluster.rng.choice(alive)
                self.cluster.crash(victim)
                self.cluster.at(self.cluster.rng.uniform(50, f.restart_after_ms_max), lambda: self.cluster.restart(victim))
        elif r < 0.45 and f.partition_probability:
            self.cluster.blocked = set()
            if self.cluster.rng.random() < f.partition_probability:
                self.partition()
        elif r < 0.55 and self.cluster.membership:
            self.change_membership()
        elif r < 0.6:
            self.transfer()
        self.cluster.at(self.cluster.rng.uniform(50, 400), self.chaos)

    def partition(self) -> None:
        ids = self.cluster.ids[:]
        self.cluster.rng.shuffle(ids)
        cut = self.cluster.rng.randrange(1, len(ids))
        side_a, side_b = ids[:cut], ids[cut:]
        one_way = self.cluster.rng.random() < self.cluster.faults.one_way_probability
        for a in side_a:
            for b in side_b:
                self.cluster.blocked.add((a, b))
                if not one_way:
                    self.cluster.blocked.add((b, a))
        self.cluster.stats["partitions"] += 1
        self.cluster.stats["faults"] += 1
        self.cluster.log(f"partition {sorted(side_a)} | {sorted(side_b)}{' one-way' if one_way else ''}")

    def client_loop(self) -> None:
        if self.clients_stopped:
            return
        if self.cluster.rng.random() < 0.8:
            self.propose()
        if self.cluster.rng.random() < 0.05:
            self.read()
        self.cluster.at(self.cluster.rng.uniform(5, 40), self.client_loop)

    def final_proposal(self) -> None:
        """After healing, a fresh proposal must commit: the liveness half of the check."""
        if self.final_value in self.cluster.checker.acked:
            return
        if self.final_value not in self._inflight:
            before = self._next_value
            self.propose()
            if self._next_value != before and self._next_value in self._inflight:
                self.final_value = self._next_value
        self.cluster.at(50, self.final_proposal)
