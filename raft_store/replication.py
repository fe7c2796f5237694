"""The leader's side of replication: what each follower has, what to send it next, and when an
entry is committed.

Appends are batched (everything proposed before the next Ready goes out in one message per
follower) and pipelined up to `inflight_max` per follower; a follower too far behind gets a
snapshot, whose bytes the runner attaches on the way out. An entry is committed once a majority
of voters hold it and it is of the leader's own term (Raft 5.4.2). Membership changes take
effect as they are appended, so the trackers follow the configuration in the log. Heartbeats
carry the newest read's context, which is how reads are confirmed; when each follower gets one is
heartbeats.py's (not when it was just sent an append). Part of the pure core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft_store.heartbeats import Heartbeats
from raft_store.progress import Progress, ProgressState
from raft_store.types import NO_NODE, Entry, EntryKind, Message, MessageType, Role, Snapshot

if TYPE_CHECKING:
    from raft_store.core import RaftCore

MT = MessageType


class Replication:
    """The progress of every member, the bytes proposed but not committed, and whether an append
    is owed to the followers before the next Ready."""

    def __init__(self, core: RaftCore) -> None:
        self._core = core
        self.progress: dict[int, Progress] = {}
        self.uncommitted_bytes = 0
        self.broadcast_pending = False
        self.heartbeats = Heartbeats(core)

    def reset(self) -> None:
        self.progress = {}
        self.heartbeats.reset()

    def start_leading(self) -> None:
        """Track every member from the end of the log and append this term's first entry."""
        core = self._core
        last = core.log.last_index()
        for node in sorted(core.conf.all_nodes()):
            self.progress[node] = Progress(
                match=0, next=last + 1, inflight_max=core.config.inflight_max, is_learner=node in core.conf.learners
            )
        if core.id in self.progress:
            self.progress[core.id].match = core.log.persisted
            self.progress[core.id].become_replicate()
        self.uncommitted_bytes = 0
        # Raft 5.4.2: a leader commits entries of earlier terms only by committing one of its own.
        self.append(Entry(core.term, last + 1, EntryKind.NOOP))

    def append(self, entry: Entry) -> None:
        self._core.log.append([entry])
        self.uncommitted_bytes += len(entry.data)
        if entry.kind is EntryKind.CONF:
            self.sync_progress_with_conf()
        # The leader's own copy counts after it is persisted (see advance); followers get the
        # entry with everything else appended before the next Ready (one message, many entries).
        self.broadcast_pending = True

    def flush(self) -> None:
        """Before a Ready: the appends owed to the followers go out, one message each."""
        if self.broadcast_pending and self._core.role is Role.LEADER:
            for node in sorted(self.progress):
                if node != self._core.id:
                    self.send_append(node)
        self.broadcast_pending = False

    def persisted(self) -> None:
        """The leader's own log is durable further: its copy counts now."""
        core = self._core
        pr = self.progress.get(core.id)
        if pr is not None:
            pr.maybe_update(core.log.persisted)
        if self._maybe_commit():
            self._commit_advanced()

    def transfer_to(self, target: int) -> None:
        core = self._core
        pr = self.progress[target]
        if pr.match == core.log.last_index():
            core.send(Message(MT.TIMEOUT_NOW, to=target, frm=core.id, term=core.term))
        else:
            self.send_append(target)

    def step(self, m: Message) -> None:
        core = self._core
        pr = self.progress.get(m.frm)
        if m.type is MT.READ_INDEX:
            core.reads.leader_read(m.context, m.frm)
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
            if pr.match < core.log.last_index():
                self.send_append(m.frm)
            if m.context:
                core.reads.ack(m.context, m.frm)

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        core = self._core
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint = core.log.find_conflict_by_term(hint, m.log_term)
            if pr.maybe_decrease(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self.send_append(m.frm)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            if was_paused and not pr.is_paused():
                self.send_append(m.frm)
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        if self._maybe_commit():
            self._commit_advanced()
        while self.send_append(m.frm, only_if_entries=True):
            pass
        if m.frm == core.lead_transferee and pr.match == core.log.last_index():
            core.send(Message(MT.TIMEOUT_NOW, to=m.frm, frm=core.id, term=core.term))

    def _commit_advanced(self) -> None:
        """Followers with entries still to receive get them (and the new commit index) now;
        the others learn the commit index from the next heartbeat. An empty append per commit
        would cost every follower a Ready cycle per round for nothing a client waits on."""
        last = self._core.log.last_index()
        if any(pr.next <= last for node, pr in self.progress.items() if node != self._core.id):
            self.broadcast_pending = True

    def _maybe_commit(self) -> bool:
        core = self._core
        voters = core.conf.voters
        matches = sorted((self.progress[n].match for n in voters if n in self.progress), reverse=True)
        if not matches:
            return False
        quorum = len(voters) // 2 + 1
        if len(matches) < quorum:
            return False
        candidate = matches[quorum - 1]
        # Raft 5.4.2 (Figure 8): count replicas only for entries of the current term.
        if candidate > core.log.committed and core.log.term(candidate) == core.term:
            core.log.commit_to(candidate)
            self._on_commit_advanced()
            return True
        return False

    def _on_commit_advanced(self) -> None:
        core = self._core
        self.uncommitted_bytes = sum(len(e.data) for e in core.log.entries_after(core.log.committed))
        if core.log.pending_conf_index() <= core.log.committed and core.id not in core.conf.voters:
            # We were removed and the change is committed: hand over by stepping down.
            core.become_follower(core.term, NO_NODE)
            return
        core.reads.commit_advanced()
        # Nodes added by a committed change need progress trackers (added on append too).
        self.sync_progress_with_conf()

    def sync_progress_with_conf(self) -> None:
        core = self._core
        conf = core.conf
        for node in conf.all_nodes():
            if node not in self.progress:
                self.progress[node] = Progress(
                    match=0,
                    next=core.log.last_index() + 1,
                    inflight_max=core.config.inflight_max,
                )
            self.progress[node].is_learner = node in conf.learners
        for node in list(self.progress):
            if node not in conf.all_nodes() and node != core.id:
                del self.progress[node]

    def send_append(self, to: int, *, only_if_entries: bool = False) -> bool:
        core = self._core
        log = core.log
        pr = self.progress[to]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None or prev < log.snapshot_index:
            return self._send_snapshot(to, pr)
        entries = log.slice(pr.next, log.last_index() + 1, core.config.append_bytes_max) if pr.next <= log.last_index() else []
        if only_if_entries and not entries:
            return False
        msg = Message(
            MT.APP,
            to=to,
            frm=core.id,
            term=core.term,
            index=prev,
            log_term=prev_term,
            entries=tuple(entries),
            commit=log.committed,
        )
        core.send_early(msg)
        pr.quiet_ticks, pr.on_beat = 0, False  # the follower heard from its leader: no heartbeat owed for an interval
        if entries:
            pr.sent_entries(entries[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return bool(entries) and pr.state is ProgressState.REPLICATE

    def _send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # wait until the follower answers at all before shipping a snapshot
        core = self._core
        meta = core.snapshot_meta()
        # The runner attaches the snapshot bytes on the way out: I/O stays at the edge.
        core.send_early(Message(MT.SNAP, to=to, frm=core.id, term=core.term, snapshot=Snapshot(meta=meta)))
        pr.become_snapshot(meta.index)
        return False

    def snapshot_failed(self, node: int) -> None:
        pr = self.progress.get(node)
        if pr is not None and pr.state is ProgressState.SNAPSHOT:
            pr.pending_snapshot = 0
            pr.become_probe()

    def unreachable(self, node: int) -> None:
        pr = self.progress.get(node)
        if pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    def broadcast_heartbeat(self, context: bytes) -> None:
        """Every follower hears from the leader now (a read's round: read_index.py)."""
        self.heartbeats.broadcast(self.progress, context)

    def tick(self) -> None:
        """A leader's tick: step down without a quorum's recent answers (check-quorum), give up
        a transfer that did not finish in an election timeout, re-offer lost snapshots, and send
        the heartbeats due (heartbeats.py: not to a follower that was just sent an append)."""
        core = self._core
        elections = core.elections
        elections.elapsed += 1
        self.heartbeats.count_tick(self.progress)
        if elections.elapsed >= core.config.election_ticks:
            elections.elapsed = 0
            if core.config.check_quorum and not self._quorum_active():
                core.become_follower(core.term, NO_NODE)
                return
            core.lead_transferee = NO_NODE  # a transfer that did not finish in time is abandoned
        if core.role is not Role.LEADER:
            return
        for pr in self.progress.values():
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks > 2 * core.config.election_ticks:
                    pr.become_probe()  # the snapshot was lost on the way: offer it again
        self.heartbeats.send_due(self.progress)

    def ticks_until_due(self) -> int:
        """The leader's next tick that does more than count (see `RaftCore.ticks_until_due`): a
        heartbeat due, the check-quorum and transfer deadline, or a lost snapshot's re-offer."""
        core = self._core
        due = min(core.config.election_ticks - core.elections.elapsed, self.heartbeats.ticks_until_due(self.progress))
        for pr in self.progress.values():
            if pr.state is ProgressState.SNAPSHOT:
                due = min(due, 2 * core.config.election_ticks + 1 - pr.snapshot_ticks)
        return max(1, due)

    def _quorum_active(self) -> bool:
        core = self._core
        active = {core.id}
        for node, pr in self.progress.items():
            if node != core.id and pr.recent_active:
                active.add(node)
            pr.recent_active = False
        return core.has_quorum(active)

    def applied(self, committed: list[Entry]) -> None:
        if self._core.role is Role.LEADER and any(e.kind is EntryKind.CONF for e in committed):
            self.sync_progress_with_conf()
