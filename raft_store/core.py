"""The pure Raft state machine of one node: messages and ticks in, a Ready batch out.

Shaped after etcd-io/raft: `step(message)`, `tick()`, `propose(data)`, `ready()`, `advance()`.
It never touches a socket, a file, a clock or the global random generator: time is a count of
ticks, randomness comes from the injected `random.Random`. That is what lets the same object run
in the seeded simulator and in the real node. The runner's contract is in raft_store/ready.py.

Implements: pre-vote, check-quorum with leader lease, batched and pipelined replication with
bounded inflights, fast back-off on conflicts, commitment of current-term entries only,
snapshots, ReadIndex, leader transfer, single-server membership changes and learners.

This class holds the node's term, vote, role and log, routes each message by role, and hands
Readies over; its parts own the rest: `Elections` (raft_store/elections.py: the timer, the
campaigns, the votes granted), `Replication` (raft_store/replication.py: the leader's trackers,
appends, snapshots offered, heartbeats, commitment, membership in the trackers), `Following`
(raft_store/following.py: a follower's appends and snapshots), `ReadIndex`
(raft_store/read_index.py: linearizable read points).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from raft_store.elections import TRANSFER_CONTEXT, Elections
from raft_store.following import Following
from raft_store.log import RaftLog
from raft_store.membership import validate_change
from raft_store.progress import Progress
from raft_store.read_index import ReadIndex
from raft_store.ready import Ready, Recovered
from raft_store.replication import Replication
from raft_store.types import (
    NO_NODE,
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    Role,
    SnapshotMeta,
)

__all__ = ["TRANSFER_CONTEXT", "Config", "ProposalDropped", "RaftCore", "Ready", "Recovered", "Role"]

MT = MessageType


class ProposalDropped(Exception):
    """Not the leader, a transfer is under way, or too much is uncommitted: retry elsewhere."""


@dataclass(frozen=True, slots=True)
class Config:
    node_id: int
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    inflight_max: int = 64
    append_bytes_max: int = 1 << 20
    uncommitted_bytes_max: int = 64 << 20
    pre_vote: bool = True
    check_quorum: bool = True

    def validate(self) -> None:
        if self.node_id <= 0:
            raise ValueError("node_id must be positive")
        if self.heartbeat_ticks <= 0 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 0 < heartbeat_ticks < election_ticks")
        if self.inflight_max <= 0 or self.append_bytes_max <= 0:
            raise ValueError("inflight_max and append_bytes_max must be positive")


class RaftCore:
    def __init__(self, config: Config, recovered: Recovered, rng: random.Random) -> None:
        config.validate()
        self.config = config
        self.id = config.node_id
        hs = recovered.hard_state
        self.log = RaftLog(recovered.snapshot, recovered.entries, hs.commit, recovered.applied)
        self.term = hs.term
        self.vote = hs.vote
        self._handed_hs = HardState(hs.term, hs.vote, self.log.committed)
        self.role = Role.FOLLOWER
        self.leader = NO_NODE
        self.lead_transferee = NO_NODE
        self._early: list[Message] = []
        self._msgs: list[Message] = []
        self.replication = Replication(self)
        self.reads = ReadIndex(self)
        self.following = Following(self)
        self.elections = Elections(self, rng)
        self._tick: Callable[[], None] = self.elections.tick

    # ---- public API ----------------------------------------------------------------------
    @property
    def conf(self) -> ConfState:
        return self.log.conf()

    @property
    def progress(self) -> dict[int, Progress]:
        """The leader's tracker of each member (empty unless leading)."""
        return self.replication.progress

    def is_promotable(self) -> bool:
        return self.id in self.conf.voters

    def tick(self) -> None:
        self._tick()

    def ticks_until_due(self) -> int:
        """How many ticks from now until one does more than count: at least 1, and every tick
        before that one only advances the timers' counters (no message, no change of role, no
        Ready). So a shell may let those ticks pass unseen and deliver them together, in order,
        before its next input or when the due one comes: the core sees exactly the sequence of
        ticks and messages a shell ticking every period would give it, and an idle node wakes
        for its deadlines (a leader's heartbeats, a follower's election timeout) instead of for
        every tick. Answers for the state as it is now: any input may change it."""
        if self.role is Role.LEADER:
            return self.replication.ticks_until_due()
        return self.elections.ticks_until_due()

    def campaign(self) -> None:
        """Start an election now (tests, operator action)."""
        if self.role is not Role.LEADER and self.is_promotable():
            self.elections.hup(transfer=False)

    def propose(self, data: bytes, kind: EntryKind = EntryKind.NORMAL) -> int:
        if self.role is not Role.LEADER or self.lead_transferee != NO_NODE:
            raise ProposalDropped("not leader" if self.role is not Role.LEADER else "leader transfer in progress")
        if self.replication.uncommitted_bytes + len(data) > self.config.uncommitted_bytes_max:
            raise ProposalDropped("too much uncommitted data")
        if kind is EntryKind.CONF:
            if self.log.pending_conf_index() > self.log.committed:
                raise ProposalDropped("a membership change is still uncommitted")
            validate_change(self.conf, ConfChange.decode(data))
        index = self.log.last_index() + 1
        self.replication.append(Entry(self.term, index, kind, data))
        return index

    def propose_conf_change(self, change: ConfChange) -> int:
        return self.propose(change.encode(), EntryKind.CONF)

    def transfer_leadership(self, target: int) -> None:
        if self.role is not Role.LEADER or target == self.id or target not in self.conf.voters:
            return
        if self.lead_transferee == target:
            return
        self.lead_transferee = target
        self.elections.elapsed = 0
        self.replication.transfer_to(target)

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; it comes back as a ReadState in a later Ready."""
        if self.role is Role.LEADER:
            self.reads.leader_read(context, self.id)
        elif self.leader != NO_NODE:
            self.send(Message(MT.READ_INDEX, to=self.leader, frm=self.id, term=self.term, context=context))

    def compact(self, index: int) -> SnapshotMeta:
        """The state machine snapshotted at `index`: forget the log up to there."""
        return self.log.compact(index)

    def snapshot_meta(self) -> SnapshotMeta:
        return SnapshotMeta(self.log.snapshot_index, self.log.snapshot_term, self.log.conf_at(self.log.snapshot_index))

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def has_ready(self) -> bool:
        handed, log = self._handed_hs, self.log
        return (
            # The hard state compared field by field: no HardState built per call (the node asks
            # after every input and every Ready).
            self.term != handed.term or self.vote != handed.vote or log.committed != handed.commit
            or log.has_unstable()
            or self.following.has_snapshot()
            or bool(self._early or self._msgs or self.reads.has_states())
            or (self.replication.broadcast_pending and self.role is Role.LEADER)
            or min(log.committed, log.persisted) > log.applying
        )

    def ready(self) -> Ready:
        """Hand over everything new. Several Readies may be outstanding at once (the runner
        persists them in order in another thread); `on_persisted` and `on_applied` report back."""
        self.replication.flush()
        hs = self.hard_state()
        snapshot = self.following.take_snapshot()
        entries = self.log.unstable_entries()
        self.log.hand_to_storage()
        rd = Ready(
            hard_state=hs if hs != self._handed_hs else None,
            entries=entries,
            snapshot=snapshot,
            early_messages=self._early,
            messages=self._msgs,
            committed=self.log.next_committed(),
            read_states=self.reads.take_states(),
        )
        rd.must_sync = bool(entries or snapshot) or (hs.term, hs.vote) != (self._handed_hs.term, self._handed_hs.vote)
        self._handed_hs = hs
        self._early, self._msgs = [], []
        return rd

    def on_persisted(self, rd: Ready) -> None:
        """Everything `rd` asked to persist (and every earlier Ready's) is durable."""
        if not rd.entries:
            return
        last = rd.entries[-1]
        if self.log.term(last.index) == last.term:  # not overwritten while the write was under way
            self.log.stable_to(last.index)
        if self.role is Role.LEADER:
            self.replication.persisted()

    def on_applied(self, index: int, committed: list[Entry]) -> None:
        """The state machine applied `committed` (handed in a Ready), up to `index`."""
        self.log.applied_to(index)
        self.replication.applied(committed)

    def advance(self, rd: Ready) -> None:
        """Sequential runners: `rd` is persisted and its committed entries applied."""
        self.on_persisted(rd)
        if rd.committed:
            self.on_applied(rd.committed[-1].index, rd.committed)

    def report_snapshot_failed(self, node: int) -> None:
        """The runner could not deliver a snapshot: probe again later."""
        self.replication.snapshot_failed(node)

    def report_unreachable(self, node: int) -> None:
        self.replication.unreachable(node)

    # ---- stepping ------------------------------------------------------------------------
    def step(self, m: Message) -> None:
        if m.term > self.term:
            voting = m.type in (MT.VOTE, MT.PRE_VOTE)
            if voting and self.elections.in_lease() and m.context != TRANSFER_CONTEXT:
                return  # a leader is alive: a partitioned node must not depose it
            if m.type is MT.PRE_VOTE or (m.type is MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change terms
            elif m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NO_NODE)
        elif m.term < self.term:
            if (self.config.check_quorum or self.config.pre_vote) and m.type in (MT.HEARTBEAT, MT.APP):
                # Tell a stale leader about the newer term so it steps down.
                self.send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term))
            elif m.type is MT.PRE_VOTE:
                self.send(Message(MT.PRE_VOTE_RESP, to=m.frm, frm=self.id, term=self.term, reject=True))
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self.elections.handle_vote_request(m)
        elif self.role is Role.LEADER:
            self.replication.step(m)
        elif self.role is Role.FOLLOWER:
            self.following.step(m)
        else:
            self.elections.step_candidate(m)

    # ---- roles (the parts call these) ----------------------------------------------------
    def become_follower(self, term: int, leader: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NO_NODE
        self._reset_common()
        self.role = Role.FOLLOWER
        self.leader = leader
        self._tick = self.elections.tick

    def become_pre_candidate(self) -> None:
        assert self.role is not Role.LEADER
        self.elections.forget_votes()
        self._tick = self.elections.tick
        self.leader = NO_NODE
        self.role = Role.PRE_CANDIDATE

    def become_candidate(self) -> None:
        assert self.role is not Role.LEADER
        self.term += 1
        self.vote = self.id
        self._reset_common()
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self._reset_common()
        self.role = Role.LEADER
        self.leader = self.id
        self._tick = self.replication.tick
        self.replication.start_leading()

    def _reset_common(self) -> None:
        self.leader = NO_NODE
        self.elections.elapsed = 0
        self.elections.reset_timeout()
        self.elections.forget_votes()
        self.replication.reset()
        self.lead_transferee = NO_NODE
        self.reads.reset()
        self._tick = self.elections.tick

    # ---- what goes out --------------------------------------------------------------------
    def send(self, m: Message) -> None:
        """A message that may leave only once this Ready is durable (votes, answers)."""
        self._msgs.append(m)

    def send_early(self, m: Message) -> None:
        """A leader's message that may leave before its own fsync (appends, heartbeats, snapshots)."""
        self._early.append(m)

    def has_quorum(self, nodes: set[int]) -> bool:
        voters = self.conf.voters
        return len(nodes & voters) * 2 > len(voters)
