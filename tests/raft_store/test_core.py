"""Scenario tests of the pure Raft core, one rule at a time, on a hand-driven network.

The simulation covers random interleavings; these pin the specific behaviours the design relies
on, so a regression names the rule it broke.
"""

from __future__ import annotations

import random

import pytest

from raft_store.core import Config, ProposalDropped, RaftCore, Recovered, Role
from raft_store.membership import MembershipError, validate_change
from raft_store.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    SnapshotMeta,
)


class Net:
    """Delivers messages in rounds; `cut` holds (from, to) pairs that are dropped."""

    def __init__(self, voters: list[int], learners: list[int] = (), **config: object) -> None:  # type: ignore[assignment]
        conf = ConfState(voters=frozenset(voters), learners=frozenset(learners))
        self.nodes = {
            n: RaftCore(Config(node_id=n, **config), Recovered(snapshot=SnapshotMeta(0, 0, conf)), random.Random(n))  # type: ignore[arg-type]
            for n in [*voters, *learners]
        }
        self.cut: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        self.applied: dict[int, list[Entry]] = {n: [] for n in self.nodes}

    def isolate(self, node: int) -> None:
        for other in self.nodes:
            if other != node:
                self.cut |= {(node, other), (other, node)}

    def heal(self) -> None:
        self.cut.clear()

    def settle(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            moved = False
            outbox: list[Message] = []
            for node_id, core in self.nodes.items():
                if node_id in self.down:
                    continue
                while core.has_ready():
                    rd = core.ready()
                    outbox += rd.early_messages + rd.messages
                    self.applied[node_id] += rd.committed
                    core.advance(rd)
                    moved = True
            for m in outbox:
                if (m.frm, m.to) not in self.cut and m.to not in self.down:
                    self.nodes[m.to].step(m)
            if not moved and not outbox:
                return

    def tick(self, node: int, times: int) -> None:
        for _ in range(times):
            self.nodes[node].tick()
            self.settle()

    def elect(self, node: int) -> None:
        self.nodes[node].campaign()
        self.settle()
        assert self.nodes[node].role is Role.LEADER

    def leader(self) -> RaftCore:
        leaders = [c for n, c in self.nodes.items() if c.role is Role.LEADER and n not in self.down]
        assert len(leaders) == 1, [c.id for c in leaders]
        return leaders[0]


def test_election_and_replication_commit_on_a_majority() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    index = net.nodes[1].propose(b"x")
    net.settle()
    assert net.nodes[1].log.committed >= index
    # Followers learn the commit index with the next heartbeat (no empty append per commit).
    net.tick(1, net.nodes[1].config.heartbeat_ticks)
    for node in (1, 2, 3):
        assert net.nodes[node].log.committed >= index
        assert [e.data for e in net.applied[node] if e.kind is EntryKind.NORMAL] == [b"x"]


def test_minority_partition_cannot_commit() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(1)
    index = net.nodes[1].propose(b"lost")
    net.settle()
    assert net.nodes[1].log.committed < index


def test_pre_vote_keeps_a_partitioned_node_from_inflating_terms() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    term = net.nodes[1].term
    net.isolate(3)
    net.tick(3, 50)  # many election timeouts alone: pre-votes fail, term unchanged
    assert net.nodes[3].term == term
    net.heal()
    net.tick(1, 2)
    assert net.leader().id == 1 and net.nodes[1].term == term


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(1)
    net.tick(1, 25)
    assert net.nodes[1].role is Role.FOLLOWER


def test_leader_lease_ignores_votes_while_the_leader_is_alive() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    term = net.nodes[1].term
    vote = Message(MessageType.VOTE, to=2, frm=3, term=term + 5, index=100, log_term=term)
    net.nodes[2].step(vote)
    assert net.nodes[2].term == term  # heard from the leader recently: disruption refused


def test_leader_transfer() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.nodes[1].propose(b"a")
    net.settle()
    net.nodes[1].transfer_leadership(3)
    net.settle()
    assert net.leader().id == 3
    with pytest.raises(ProposalDropped):
        net.nodes[1].propose(b"not leader any more")


def test_learner_receives_the_log_but_does_not_count() -> None:
    net = Net([1, 2], learners=[3])
    net.elect(1)
    net.down.add(2)
    index = net.nodes[1].propose(b"needs node 2")
    net.settle()
    assert net.nodes[1].log.committed < index  # the learner's copy does not make a majority
    net.down.clear()
    net.tick(1, 3)
    assert net.nodes[3].log.committed >= index
    assert net.nodes[3].role is Role.FOLLOWER
    net.tick(3, 60)
    assert net.nodes[3].role is Role.FOLLOWER  # a learner never campaigns


def test_one_membership_change_at_a_time() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(1)  # keep the first change uncommitted
    net.nodes[1].propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 3))
    with pytest.raises(ProposalDropped):
        net.nodes[1].propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 2))
    with pytest.raises(MembershipError):
        validate_change(ConfState(voters=frozenset({1})), ConfChange(ConfChangeType.REMOVE_NODE, 1))


def test_removed_node_stops_counting_and_added_node_catches_up() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.nodes[1].propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 3))
    net.settle()
    assert net.nodes[1].conf.voters == {1, 2}
    net.down.add(3)
    index = net.nodes[1].propose(b"two voters")
    net.settle()
    assert net.nodes[1].log.committed >= index
    net.down.clear()
    net.nodes[1].propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 3))
    net.settle()
    net.tick(1, 3)
    assert net.nodes[3].log.committed == net.nodes[1].log.committed


def test_read_index_waits_for_a_quorum_heartbeat() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.nodes[1].propose(b"w")
    net.settle()
    net.isolate(1)
    net.nodes[1].read_index(b"r1")
    net.settle()
    rd_states = [rd for rd in [net.nodes[1].ready()] for rd in rd.read_states]
    assert rd_states == []  # no quorum confirms leadership: no read point
    net.heal()
    net.tick(1, 2)
    net.nodes[1].read_index(b"r2")
    states = []
    for _ in range(10):
        for core in net.nodes.values():
            if core.has_ready():
                rd = core.ready()
                states += [s for s in rd.read_states if core.id == 1]
                for m in rd.early_messages + rd.messages:
                    net.nodes[m.to].step(m)
                core.advance(rd)
    assert any(s.context == b"r2" and s.index == net.nodes[1].log.committed for s in states)


def test_fast_backoff_skips_a_whole_divergent_term() -> None:
    """A follower holding many entries of an old term is repaired in a few round trips."""
    conf = ConfState(voters=frozenset({1, 2, 3}))
    stale = tuple(Entry(1, i, EntryKind.NORMAL, b"old") for i in range(1, 201))
    fresh = tuple(Entry(1, i, EntryKind.NORMAL, b"old") for i in range(1, 11)) + tuple(
        Entry(2, i, EntryKind.NORMAL, b"new") for i in range(11, 31)
    )
    net = Net([1, 2, 3])
    net.nodes[1] = RaftCore(Config(node_id=1), Recovered(HardState(2, 1, 10), SnapshotMeta(0, 0, conf), fresh), random.Random(1))
    net.nodes[2] = RaftCore(Config(node_id=2), Recovered(HardState(2, 1, 10), SnapshotMeta(0, 0, conf), fresh), random.Random(2))
    net.nodes[3] = RaftCore(Config(node_id=3), Recovered(HardState(1, 0, 10), SnapshotMeta(0, 0, conf), stale), random.Random(3))
    net.applied = {n: [] for n in net.nodes}
    net.elect(1)
    rejections = 0
    for _ in range(30):
        outbox = []
        for core in net.nodes.values():
            while core.has_ready():
                rd = core.ready()
                outbox += rd.early_messages + rd.messages
                core.advance(rd)
        rejections += sum(1 for m in outbox if m.type is MessageType.APP_RESP and m.reject)
        for m in outbox:
            net.nodes[m.to].step(m)
    assert net.nodes[3].log.last_index() == net.nodes[1].log.last_index()
    assert net.nodes[3].log.term(30) == 2
    assert rejections <= 3


def test_old_term_entries_commit_only_through_a_current_term_entry() -> None:
    """Raft Figure 8: counting replicas of an old-term entry must not commit it."""
    conf = ConfState(voters=frozenset({1, 2, 3}))
    old = (Entry(1, 1, EntryKind.NORMAL, b"t1"),)
    core = RaftCore(Config(node_id=1), Recovered(HardState(1, 0, 0), SnapshotMeta(0, 0, conf), old), random.Random(1))
    core.campaign()
    for voter in (2, 3):
        core.step(Message(MessageType.PRE_VOTE_RESP, to=1, frm=voter, term=2))
    for voter in (2, 3):
        core.step(Message(MessageType.VOTE_RESP, to=1, frm=voter, term=core.term))
    assert core.role is Role.LEADER
    rd = core.ready()
    core.on_persisted(rd)
    core.step(Message(MessageType.APP_RESP, to=1, frm=2, term=core.term, index=1))
    assert core.log.committed == 0  # entry 1 is of term 1: a majority holding it is not enough
    core.step(Message(MessageType.APP_RESP, to=1, frm=2, term=core.term, index=2))
    assert core.log.committed == 2  # the leader's own no-op carries it
