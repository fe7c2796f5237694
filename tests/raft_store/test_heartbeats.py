"""A leader heartbeats a follower only when it sent it nothing else for a heartbeat interval.

Under load every set's leader sends appends every few milliseconds, and an append does all a
heartbeat does (resets the follower's election timer, carries the commit index and the leader's
clock reading; its answer carries the follower's clock and counts for check-quorum). The
heartbeats and their answers were a fifth of a loaded set's messages and, with many sets on a
machine, part of the standing cost each set adds (docs/raft.md, "Heartbeats a leader skips").
These pin both sides: the skip happens, and no follower is ever starved of its leader.
"""

from __future__ import annotations

from collections.abc import Callable

from raft_store.core import RaftCore, Ready, Role
from raft_store.types import Message, MessageType, ReadState
from tests.raft_store.test_core import Net

INTERVAL = 2  # heartbeat ticks, as deployed (30 ms ticks, a heartbeat every 60 ms)
MT = MessageType


class Recorder:
    """Which tick each follower last heard from the leader, and the leader's heartbeats."""

    def __init__(self, net: Net, leader: int) -> None:
        self.net, self.leader = net, leader
        self.now = 0
        self.last_heard = {n: 0 for n in net.nodes if n != leader}
        self.heartbeats: list[tuple[int, int]] = []  # (tick, follower)
        self.appends: list[tuple[int, int]] = []
        self.read_states: list[ReadState] = []
        self.drop: Callable[[Message], bool] = lambda m: False
        for node, core in net.nodes.items():
            self._wrap(node, core)

    def _wrap(self, node: int, core: RaftCore) -> None:
        step, ready = core.step, core.ready

        def recording_step(m: Message) -> None:
            if self.drop(m):
                return
            if m.frm == self.leader and m.type in (MT.APP, MT.HEARTBEAT):
                self.last_heard[node] = self.now
                (self.heartbeats if m.type is MT.HEARTBEAT else self.appends).append((self.now, node))
            step(m)

        def recording_ready() -> Ready:
            rd = ready()
            if node == self.leader:
                self.read_states += rd.read_states
            return rd

        core.step = recording_step  # type: ignore[method-assign]
        core.ready = recording_ready  # type: ignore[method-assign]

    def run(self, ticks: int, *, propose_every: int = 0) -> None:
        """`ticks` ticks of every node, proposing on the leader every `propose_every` ticks (0:
        never); after each, no follower may have gone more than an interval without a message."""
        for _ in range(ticks):
            self.now += 1
            if propose_every and self.now % propose_every == 0:
                self.net.nodes[self.leader].propose(b"x")
                self.net.settle()
            for node in self.net.nodes:
                self.net.tick(node, 1)
            for follower, heard in self.last_heard.items():
                assert self.now - heard <= INTERVAL, f"follower {follower} last heard at tick {heard}, now {self.now}"
            assert self.net.nodes[self.leader].role is Role.LEADER

    def heartbeats_to(self, follower: int, since: int) -> int:
        return sum(1 for tick, node in self.heartbeats if node == follower and tick > since)


def _loaded_net(inflight_max: int = 64) -> tuple[Net, Recorder]:
    net = Net([1, 2, 3], heartbeat_ticks=INTERVAL, election_ticks=10, inflight_max=inflight_max)
    net.elect(1)
    return net, Recorder(net, leader=1)


def test_a_follower_fed_appends_gets_no_heartbeat_and_keeps_its_leader() -> None:
    net, rec = _loaded_net()
    term = net.nodes[1].term
    rec.run(60, propose_every=1)  # six election timeouts, an append every tick
    assert rec.heartbeats == [], "a follower sent an append every tick was heartbeated as well"
    # Check-quorum counted the appends' answers; no follower's election timer ran out.
    assert net.leader().id == 1 and all(core.term == term for core in net.nodes.values())
    leader = net.nodes[1]
    for node in (2, 3):
        assert net.nodes[node].log.last_index() == leader.log.last_index()
        assert net.nodes[node].log.committed >= leader.log.committed - 1, "appends carry the commit index"


def test_no_follower_goes_an_interval_without_its_leader_in_any_phase() -> None:
    net, rec = _loaded_net(inflight_max=4)
    leader = net.nodes[1]
    rec.run(10)  # idle: heartbeats, as before
    assert rec.heartbeats_to(2, 0) == rec.heartbeats_to(3, 0) == 10 // INTERVAL
    rec.run(10, propose_every=3)  # a light load: appends every third tick, heartbeats between
    start = rec.now
    rec.run(20, propose_every=1)
    assert rec.heartbeats_to(2, start) == rec.heartbeats_to(3, start) == 0
    # Follower 3's answers are lost: its appends stop at the inflight limit and it gets heartbeats
    # again; follower 2, still fed appends, gets none for it.
    net.cut.add((3, 1))
    start = rec.now
    rec.run(20, propose_every=1)
    assert rec.heartbeats_to(3, start) >= 20 // INTERVAL - 2 and rec.heartbeats_to(2, start) == 0
    net.heal()
    rec.run(10, propose_every=1)
    assert net.nodes[3].log.last_index() == leader.log.last_index(), "the heartbeats' answers resumed its appends"
    # The load stops: within an interval every follower has the leader's commit index, and the
    # heartbeats fall into step (one heartbeat tick per interval, not one per follower).
    stop = rec.now
    rec.run(INTERVAL)
    assert all(net.nodes[n].log.committed == leader.log.committed for n in (2, 3))
    rec.run(20)
    ticks_with_heartbeats = {tick for tick, _ in rec.heartbeats if tick > stop + 2 * INTERVAL}
    assert len(ticks_with_heartbeats) <= (rec.now - stop - 2 * INTERVAL) // INTERVAL


def test_a_read_under_load_is_not_left_to_the_appends() -> None:
    """An append's answer carries no read context: while a read waits, its context goes out again
    every interval even to followers fed appends (here its first heartbeats were lost)."""
    net, rec = _loaded_net()
    rec.run(4, propose_every=1)
    rec.drop = lambda m: m.type is MT.HEARTBEAT and m.context == b"read-1"
    net.nodes[1].read_index(b"read-1")
    net.settle()
    rec.drop = lambda m: False
    assert rec.read_states == []
    asked = rec.now
    rec.run(INTERVAL, propose_every=1)
    assert [s.context for s in rec.read_states] == [b"read-1"]
    assert rec.heartbeats_to(2, asked) >= 1 and rec.heartbeats_to(3, asked) >= 1
    start = rec.now
    rec.run(10, propose_every=1)  # the read answered, the appends alone again
    assert rec.heartbeats_to(2, start) == rec.heartbeats_to(3, start) == 0


def test_an_idle_leader_still_heartbeats_every_interval() -> None:
    net, rec = _loaded_net()
    rec.run(6 * 10)  # six election timeouts without a proposal: nobody campaigns
    assert net.leader().id == 1
    for node in (2, 3):
        assert rec.heartbeats_to(node, 0) == 60 // INTERVAL
    assert rec.appends == []
