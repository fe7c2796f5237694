"""The pure Raft state machine of one node: messages and ticks in, a Ready batch out.

Shaped after etcd-io/raft: `step(message)`, `tick()`, `propose(data)`, `ready()`, `advance()`.
It never touches a socket, a file, a clock or the global random generator: time is a count of
ticks, randomness comes from the injected `random.Random`. That is what lets the same object run
in the seeded simulator and in the real node.

The runner's contract, per Ready:
1. send `early_messages` (the leader's appends: safe before its own fsync, because the leader
   counts its own copy only once `on_persisted` says it is durable);
2. persist `snapshot`, `entries` and `hard_state`, then fsync (in order with earlier Readies);
3. send `messages` (votes, append replies) only once this Ready and all earlier ones are durable;
4. apply `committed` in order, then call `on_applied`;
5. call `on_persisted(ready)` when step 2 is done. `advance(ready)` does 4+5 for runners that
   do everything in sequence.

Several Readies may be outstanding: the runner need not wait for an fsync before stepping new
messages, which is how the leader overlaps its own fsync with replication and application.

Implements: pre-vote, check-quorum with leader lease, batched and pipelined replication with
bounded inflights, fast back-off on conflicts, commitment of current-term entries only,
snapshots, ReadIndex, leader transfer, single-server membership changes and learners.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from raft_store.log import RaftLog
from raft_store.membership import validate_change
from raft_store.progress import Progress, ProgressState
from raft_store.types import (
    NO_NODE,
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    ReadState,
    Snapshot,
    SnapshotMeta,
)

MT = MessageType
TRANSFER_CONTEXT = b"transfer"


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


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


@dataclass(frozen=True, slots=True)
class Recovered:
    """What durable storage gave back at start-up."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta = field(default_factory=SnapshotMeta)
    entries: tuple[Entry, ...] = ()
    applied: int = 0


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None
    entries: list[Entry]
    snapshot: Snapshot | None
    early_messages: list[Message]
    messages: list[Message]
    committed: list[Entry]
    read_states: list[ReadState]

    def is_empty(self) -> bool:
        return not (
            self.hard_state
            or self.entries
            or self.snapshot
            or self.early_messages
            or self.messages
            or self.committed
            or self.read_states
        )

    must_sync: bool = False
    """True when entries, a snapshot, or a new term or vote must be fsynced before `messages` go
    out. A hard state whose only change is the commit index may be written lazily."""


@dataclass(slots=True)
class _ReadRequest:
    index: int
    context: bytes
    requester: int
    acks: set[int]


class RaftCore:
    def __init__(self, config: Config, recovered: Recovered, rng: random.Random) -> None:
        config.validate()
        self.config = config
        self.id = config.node_id
        self._rng = rng
        hs = recovered.hard_state
        self.log = RaftLog(recovered.snapshot, recovered.entries, hs.commit, recovered.applied)
        self.term = hs.term
        self.vote = hs.vote
        self._handed_hs = HardState(hs.term, hs.vote, self.log.committed)
        self.role = Role.FOLLOWER
        self.leader = NO_NODE
        self.progress: dict[int, Progress] = {}
        self._votes: dict[int, bool] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = config.election_ticks
        self.lead_transferee = NO_NODE
        self._reads: list[_ReadRequest] = []
        self._pending_reads: list[tuple[bytes, int]] = []  # before the leader commits in its term
        self._read_states: list[ReadState] = []
        self._early: list[Message] = []
        self._msgs: list[Message] = []
        self._pending_snapshot: Snapshot | None = None
        self._uncommitted_bytes = 0
        self._broadcast_pending = False
        self._tick: Callable[[], None] = self._tick_election
        self._reset_randomized_timeout()

    # ---- public API ----------------------------------------------------------------------
    @property
    def conf(self) -> ConfState:
        return self.log.conf()

    def is_promotable(self) -> bool:
        return self.id in self.conf.voters

    def tick(self) -> None:
        self._tick()

    def campaign(self) -> None:
        """Start an election now (tests, operator action)."""
        if self.role is not Role.LEADER and self.is_promotable():
            self._hup(transfer=False)

    def propose(self, data: bytes, kind: EntryKind = EntryKind.NORMAL) -> int:
        if self.role is not Role.LEADER or self.lead_transferee != NO_NODE:
            raise ProposalDropped("not leader" if self.role is not Role.LEADER else "leader transfer in progress")
        if self._uncommitted_bytes + len(data) > self.config.uncommitted_bytes_max:
            raise ProposalDropped("too much uncommitted data")
        if kind is EntryKind.CONF:
            if self.log.pending_conf_index() > self.log.committed:
                raise ProposalDropped("a membership change is still uncommitted")
            validate_change(self.conf, ConfChange.decode(data))
        index = self.log.last_index() + 1
        self._append(Entry(self.term, index, kind, data))
        return index

    def propose_conf_change(self, change: ConfChange) -> int:
        return self.propose(change.encode(), EntryKind.CONF)

    def transfer_leadership(self, target: int) -> None:
        if self.role is not Role.LEADER or target == self.id or target not in self.conf.voters:
            return
        if self.lead_transferee == target:
            return
        self.lead_transferee = target
        self._election_elapsed = 0
        pr = self.progress[target]
        if pr.match == self.log.last_index():
            self._send(Message(MT.TIMEOUT_NOW, to=target, frm=self.id, term=self.term))
        else:
            self._send_append(target)

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; it comes back as a ReadState in a later Ready."""
        if self.role is Role.LEADER:
            self._leader_read(context, self.id)
        elif self.leader != NO_NODE:
            self._send(Message(MT.READ_INDEX, to=self.leader, frm=self.id, term=self.term, context=context))

    def compact(self, index: int) -> SnapshotMeta:
        """The state machine snapshotted at `index`: forget the log up to there."""
        return self.log.compact(index)

    def snapshot_meta(self) -> SnapshotMeta:
        return SnapshotMeta(self.log.snapshot_index, self.log.snapshot_term, self.log.conf_at(self.log.snapshot_index))

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def has_ready(self) -> bool:
        return (
            self.hard_state() != self._handed_hs
            or bool(self.log.unstable_entries())
            or self._pending_snapshot is not None
            or bool(self._early or self._msgs or self._read_states)
            or (self._broadcast_pending and self.role is Role.LEADER)
            or min(self.log.committed, self.log.persisted) > self.log.applying
        )

    def ready(self) -> Ready:
        """Hand over everything new. Several Readies may be outstanding at once (the runner
        persists them in order in another thread); `on_persisted` and `on_applied` report back."""
        if self._broadcast_pending and self.role is Role.LEADER:
            self._broadcast_append()
        self._broadcast_pending = False
        hs = self.hard_state()
        snapshot = self._pending_snapshot
        entries = self.log.unstable_entries()
        self.log.hand_to_storage()
        rd = Ready(
            hard_state=hs if hs != self._handed_hs else None,
            entries=entries,
            snapshot=snapshot,
            early_messages=self._early,
            messages=self._msgs,
            committed=self.log.next_committed(),
            read_states=self._read_states,
        )
        rd.must_sync = bool(entries or snapshot) or (hs.term, hs.vote) != (self._handed_hs.term, self._handed_hs.vote)
        self._handed_hs = hs
        self._early, self._msgs, self._read_states = [], [], []
        self._pending_snapshot = None
        return rd

    def on_persisted(self, rd: Ready) -> None:
        """Everything `rd` asked to persist (and every earlier Ready's) is durable."""
        if not rd.entries:
            return
        last = rd.entries[-1]
        if self.log.term(last.index) == last.term:  # not overwritten while the write was under way
            self.log.stable_to(last.index)
        if self.role is Role.LEADER:
            pr = self.progress.get(self.id)
            if pr is not None:
                pr.maybe_update(self.log.persisted)
            if self._maybe_commit():
                self._commit_advanced()

    def on_applied(self, index: int, committed: list[Entry]) -> None:
        """The state machine applied `committed` (handed in a Ready), up to `index`."""
        self.log.applied_to(index)
        self._after_apply(committed)

    def advance(self, rd: Ready) -> None:
        """Sequential runners: `rd` is persisted and its committed entries applied."""
        self.on_persisted(rd)
        if rd.committed:
            self.on_applied(rd.committed[-1].index, rd.committed)

    # ---- stepping ------------------------------------------------------------------------
    def step(self, m: Message) -> None:
        if m.term > self.term:
            if m.type in (MT.VOTE, MT.PRE_VOTE):
                in_lease = (
                    self.config.check_quorum
                    and self.leader != NO_NODE
                    and self._election_elapsed < self.config.election_ticks
                )
                if in_lease and m.context != TRANSFER_CONTEXT:
                    return  # a leader is alive: a partitioned node must not depose it
            if m.type is MT.PRE_VOTE or (m.type is MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change terms
            elif m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, NO_NODE)
        elif m.term < self.term:
            if (self.config.check_quorum or self.config.pre_vote) and m.type in (MT.HEARTBEAT, MT.APP):
                # Tell a stale leader about the newer term so it steps down.
                self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term))
            elif m.type is MT.PRE_VOTE:
                self._send(Message(MT.PRE_VOTE_RESP, to=m.frm, frm=self.id, term=self.term, reject=True))
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self.vote == m.frm
            or (self.vote == NO_NODE and self.leader == NO_NODE)
            or (m.type is MT.PRE_VOTE and m.term > self.term)
        )
        resp_type = MT.VOTE_RESP if m.type is MT.VOTE else MT.PRE_VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # A granted pre-vote answers with the term the candidate will campaign in.
            self._send(Message(resp_type, to=m.frm, frm=self.id, term=m.term))
            if m.type is MT.VOTE:
                self._election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(Message(resp_type, to=m.frm, frm=self.id, term=self.term, reject=True))

    # ---- roles ------------------------------------------------------------------------
    def _become_follower(self, term: int, leader: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NO_NODE
        self._reset_common()
        self.role = Role.FOLLOWER
        self.leader = leader
        self._tick = self._tick_election

    def _become_pre_candidate(self) -> None:
        assert self.role is not Role.LEADER
        self._votes = {}
        self._tick = self._tick_election
        self.leader = NO_NODE
        self.role = Role.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        assert self.role is not Role.LEADER
        self.term += 1
        self.vote = self.id
        self._reset_common()
        self.role = Role.CANDIDATE

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self._reset_common()
        self.role = Role.LEADER
        self.leader = self.id
        self._tick = self._tick_heartbeat
        last = self.log.last_index()
        for node in sorted(self.conf.all_nodes()):
            self.progress[node] = Progress(
                match=0, next=last + 1, inflight_max=self.config.inflight_max, is_learner=node in self.conf.learners
            )
        if self.id in self.progress:
            self.progress[self.id].match = self.log.persisted
            self.progress[self.id].become_replicate()
        self._uncommitted_bytes = 0
        # Raft 5.4.2: a leader commits entries of earlier terms only by committing one of its own.
        self._append(Entry(self.term, last + 1, EntryKind.NOOP))

    def _reset_common(self) -> None:
        self.leader = NO_NODE
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        self.progress = {}
        self.lead_transferee = NO_NODE
        self._reads = []
        self._pending_reads = []
        self._tick = self._tick_election

    def _reset_randomized_timeout(self) -> None:
        n = self.config.election_ticks
        self._randomized_timeout = n + self._rng.randrange(n)

    # ---- ticks ------------------------------------------------------------------------
    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self.is_promotable() and self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._hup(transfer=False)

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.config.election_ticks:
            self._election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self._become_follower(self.term, NO_NODE)
                return
            self.lead_transferee = NO_NODE  # a transfer that did not finish in time is abandoned
        if self.role is not Role.LEADER:
            return
        for pr in self.progress.values():
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks > 2 * self.config.election_ticks:
                    pr.become_probe()  # the snapshot was lost on the way: offer it again
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._broadcast_heartbeat(self._reads[-1].context if self._reads else b"")

    def _quorum_active(self) -> bool:
        active = {self.id}
        for node, pr in self.progress.items():
            if node != self.id and pr.recent_active:
                active.add(node)
            pr.recent_active = False
        return self._has_quorum(active)

    def _has_quorum(self, nodes: set[int]) -> bool:
        voters = self.conf.voters
        return len(nodes & voters) * 2 > len(voters)

    # ---- elections ----------------------------------------------------------------------
    def _hup(self, *, transfer: bool) -> None:
        if self.log.applying < self.log.committed and self._has_unapplied_conf():
            return  # do not campaign with a membership change not yet applied
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
            self._campaign(MT.PRE_VOTE, self.term + 1, b"")
        else:
            self._become_candidate()
            self._campaign(MT.VOTE, self.term, TRANSFER_CONTEXT if transfer else b"")

    def _has_unapplied_conf(self) -> bool:
        return any(
            self.log.entry(i).kind is EntryKind.CONF
            for i in range(self.log.applying + 1, self.log.committed + 1)
            if i > self.log.snapshot_index
        )

    def _campaign(self, vote_type: MessageType, term: int, context: bytes) -> None:
        self._votes[self.id] = True
        if self._tally() == "won":
            if vote_type is MT.PRE_VOTE:
                self._become_candidate()
                self._campaign(MT.VOTE, self.term, b"")
            else:
                self._become_leader()
            return
        for node in sorted(self.conf.voters):
            if node != self.id:
                self._send(
                    Message(
                        vote_type,
                        to=node,
                        frm=self.id,
                        term=term,
                        index=self.log.last_index(),
                        log_term=self.log.last_term(),
                        context=context,
                    )
                )

    def _tally(self) -> str:
        voters = self.conf.voters
        granted = sum(1 for n, v in self._votes.items() if v and n in voters)
        rejected = sum(1 for n, v in self._votes.items() if not v and n in voters)
        if granted * 2 > len(voters):
            return "won"
        if rejected * 2 >= len(voters):
            return "lost"
        return "pending"

    def _step_candidate(self, m: Message) -> None:
        expected = MT.PRE_VOTE_RESP if self.role is Role.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
            self._become_follower(m.term, m.frm)  # a leader exists in this term
            self._step_follower(m)
        elif m.type is expected:
            self._votes.setdefault(m.frm, not m.reject)
            outcome = self._tally()
            if outcome == "won":
                if self.role is Role.PRE_CANDIDATE:
                    self._become_candidate()
                    self._campaign(MT.VOTE, self.term, b"")
                else:
                    self._become_leader()
            elif outcome == "lost":
                self._become_follower(self.term, NO_NODE)

    # ---- follower -------------------------------------------------------------------------
    def _step_follower(self, m: Message) -> None:
        if m.type is MT.APP:
            self._election_elapsed = 0
            self.leader = m.frm
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            self._election_elapsed = 0
            self.leader = m.frm
            self.log.commit_to(min(m.commit, self.log.last_index()))
            self._send(Message(MT.HEARTBEAT_RESP, to=m.frm, frm=self.id, term=self.term, context=m.context))
        elif m.type is MT.SNAP:
            self._election_elapsed = 0
            self.leader = m.frm
            self._handle_snapshot(m)
        elif m.type is MT.TIMEOUT_NOW:
            if self.is_promotable():
                self._hup(transfer=True)
        elif m.type is MT.READ_INDEX_RESP:
            self._read_states.append(ReadState(index=m.index, context=m.context))

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term, index=self.log.committed))
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term, index=last_new))
            return
        hint = self.log.find_conflict_by_term(min(m.index, self.log.last_index()), m.log_term)
        self._send(
            Message(
                MT.APP_RESP,
                to=m.frm,
                frm=self.id,
                term=self.term,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=self.log.term(hint) or 0,
            )
        )

    def _handle_snapshot(self, m: Message) -> None:
        assert m.snapshot is not None
        meta = m.snapshot.meta
        if meta.index <= self.log.committed:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term, index=self.log.committed))
            return
        if self.log.match_term(meta.index, meta.term):
            # We already have the entries: just fast-forward the commit.
            self.log.commit_to(meta.index)
        else:
            self.log.restore(meta)
            self._pending_snapshot = m.snapshot
        self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, term=self.term, index=self.log.last_index()))

    # ---- leader ---------------------------------------------------------------------------
    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.frm)
        if m.type is MT.READ_INDEX:
            self._leader_read(m.context, m.frm)
            return
        if pr is None:
            return
        if m.type is MT.APP_RESP:
            pr.recent_active = True
            self._handle_append_response(m, pr)
        elif m.type is MT.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state is ProgressState.REPLICATE and pr.is_paused():
                pr.inflights.popleft()  # an append was lost: let one more through (etcd does too)
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            if m.context:
                self._ack_read(m.context, m.frm)

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint = self.log.find_conflict_by_term(hint, m.log_term)
            if pr.maybe_decrease(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            if was_paused and not pr.is_paused():
                self._send_append(m.frm)
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        if self._maybe_commit():
            self._commit_advanced()
        while self._send_append(m.frm, only_if_entries=True):
            pass
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self._send(Message(MT.TIMEOUT_NOW, to=m.frm, frm=self.id, term=self.term))

    def _commit_advanced(self) -> None:
        """Followers with entries still to receive get them (and the new commit index) now;
        the others learn the commit index from the next heartbeat. An empty append per commit
        would cost every follower a Ready cycle per round for nothing a client waits on."""
        last = self.log.last_index()
        if any(pr.next <= last for node, pr in self.progress.items() if node != self.id):
            self._broadcast_pending = True

    def _maybe_commit(self) -> bool:
        voters = self.conf.voters
        matches = sorted((self.progress[n].match for n in voters if n in self.progress), reverse=True)
        if not matches:
            return False
        quorum = len(voters) // 2 + 1
        if len(matches) < quorum:
            return False
        candidate = matches[quorum - 1]
        # Raft 5.4.2 (Figure 8): count replicas only for entries of the current term.
        if candidate > self.log.committed and self.log.term(candidate) == self.term:
            self.log.commit_to(candidate)
            self._on_commit_advanced()
            return True
        return False

    def _on_commit_advanced(self) -> None:
        self._uncommitted_bytes = sum(len(e.data) for e in self.log.entries_after(self.log.committed))
        if self.log.pending_conf_index() <= self.log.committed and self.id not in self.conf.voters:
            # We were removed and the change is committed: hand over by stepping down.
            self._become_follower(self.term, NO_NODE)
            return
        for context, requester in self._pending_reads:
            self._leader_read(context, requester)
        self._pending_reads = []
        # Nodes added by a committed change need progress trackers (added on append too).
        self._sync_progress_with_conf()

    def _sync_progress_with_conf(self) -> None:
        conf = self.conf
        for node in conf.all_nodes():
            if node not in self.progress:
                self.progress[node] = Progress(
                    match=0,
                    next=self.log.last_index() + 1,
                    inflight_max=self.config.inflight_max,
                )
            self.progress[node].is_learner = node in conf.learners
        for node in list(self.progress):
            if node not in conf.all_nodes() and node != self.id:
                del self.progress[node]

    def _append(self, entry: Entry) -> None:
        self.log.append([entry])
        self._uncommitted_bytes += len(entry.data)
        if entry.kind is EntryKind.CONF:
            self._sync_progress_with_conf()
        # The leader's own copy counts after it is persisted (see advance); followers get the
        # entry with everything else appended before the next Ready (one message, many entries).
        self._broadcast_pending = True

    def _broadcast_append(self) -> None:
        for node in sorted(self.progress):
            if node != self.id:
                self._send_append(node)

    def _send_append(self, to: int, *, only_if_entries: bool = False) -> bool:
        pr = self.progress[to]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        if prev_term is None or prev < self.log.snapshot_index:
            return self._send_snapshot(to, pr)
        entries = (
            self.log.slice(pr.next, self.log.last_index() + 1, self.config.append_bytes_max)
            if pr.next <= self.log.last_index()
            else []
        )
        if only_if_entries and not entries:
            return False
        msg = Message(
            MT.APP,
            to=to,
            frm=self.id,
            term=self.term,
            index=prev,
            log_term=prev_term,
            entries=tuple(entries),
            commit=self.log.committed,
        )
        self._early.append(msg)
        if entries:
            pr.sent_entries(entries[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return bool(entries) and pr.state is ProgressState.REPLICATE

    def _send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # wait until the follower answers at all before shipping a snapshot
        meta = self.snapshot_meta()
        # The runner attaches the snapshot bytes on the way out: I/O stays at the edge.
        self._early.append(
            Message(
                MT.SNAP,
                to=to,
                frm=self.id,
                term=self.term,
                snapshot=Snapshot(meta=meta),
            )
        )
        pr.become_snapshot(meta.index)
        return False

    def report_snapshot_failed(self, node: int) -> None:
        """The runner could not deliver a snapshot: probe again later."""
        pr = self.progress.get(node)
        if pr is not None and pr.state is ProgressState.SNAPSHOT:
            pr.pending_snapshot = 0
            pr.become_probe()

    def report_unreachable(self, node: int) -> None:
        pr = self.progress.get(node)
        if pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for node in sorted(self.progress):
            if node == self.id:
                continue
            pr = self.progress[node]
            self._early.append(
                Message(
                    MT.HEARTBEAT,
                    to=node,
                    frm=self.id,
                    term=self.term,
                    commit=min(pr.match, self.log.committed),
                    context=context,
                )
            )

    # ---- linearizable reads (Raft dissertation 6.4) -------------------------------------
    def _leader_read(self, context: bytes, requester: int) -> None:
        if self.log.term(self.log.committed) != self.term:
            self._pending_reads.append((context, requester))
            return
        request = _ReadRequest(self.log.committed, context, requester, {self.id})
        if self._has_quorum(request.acks):
            self._release_read(request)
            return
        self._reads.append(request)
        self._broadcast_heartbeat(context)

    def _ack_read(self, context: bytes, node: int) -> None:
        for position, request in enumerate(self._reads):
            if request.context == context:
                request.acks.add(node)
                if self._has_quorum(request.acks):
                    # Everything queued before a confirmed read is confirmed too.
                    for done in self._reads[: position + 1]:
                        self._release_read(done)
                    self._reads = self._reads[position + 1 :]
                return

    def _release_read(self, request: _ReadRequest) -> None:
        if request.requester == self.id:
            self._read_states.append(ReadState(request.index, request.context))
        else:
            self._send(
                Message(
                    MT.READ_INDEX_RESP,
                    to=request.requester,
                    frm=self.id,
                    term=self.term,
                    index=request.index,
                    context=request.context,
                )
            )

    # ---- internals ------------------------------------------------------------------------
    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _after_apply(self, committed: list[Entry]) -> None:
        if self.role is Role.LEADER and any(e.kind is EntryKind.CONF for e in committed):
            self._sync_progress_with_conf()
