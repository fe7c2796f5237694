"""Safety and liveness properties, checked after every simulated event.

Properties (Raft paper Figure 3, plus the durability promises a node makes on the wire):
- election safety: at most one leader per term;
- log matching: two logs with an entry of the same index and term agree on everything before it;
- leader completeness: a new leader's log holds every entry committed before it;
- state machine safety: no two nodes apply different entries at one index;
- acknowledged is forever: every acked proposal is applied on every node after healing;
- acknowledged appends survive crashes: an entry a node said it stored is on its disk;
- promises survive restarts: a node never restarts with a term lower than one it has sent, nor
  with a different vote in a term in which it granted one;
- linearizable reads: a read index is at least the commit index when the read was requested;
- liveness: after healing, one leader and full convergence within a bound;
- one clock: every node's reading of the log's clock never goes back while it runs, and never
  reads further ahead of true time than the majority's clocks allow (clocks.py), whatever one
  node's clock says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from raft_store.core import Role
from raft_store.simulation.clocks import BAND_MS, EPOCH_MS, SAMPLE_TTL_MS, SLACK_MS, majority_ahead_ms
from raft_store.types import Entry, HardState, Message, MessageType, ReadState, Snapshot, SnapshotMeta

if TYPE_CHECKING:
    from raft_store.simulation.cluster import Cluster, SimNode

MT = MessageType
_UNPERSISTED_TERMS = (MT.PRE_VOTE, MT.PRE_VOTE_RESP)


class Checker:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.leaders: dict[int, int] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}  # index -> (term, data)
        self.max_committed = 0
        self.acked: dict[int, tuple[int, int]] = {}  # value -> (index, term)
        self.term_sent: dict[int, int] = {}
        self.votes_granted: dict[tuple[int, int], int] = {}  # (node, term) -> candidate
        self.read_floor: dict[bytes, int] = {}
        self.reads_checked = 0
        self.promised: dict[int, tuple[int, int]] = {}  # node -> (index, term) it acked
        self.must_survive: dict[int, tuple[int, int]] = {}
        self._checked_commit: dict[int, int] = {}
        self._complete_checked: set[tuple[int, int]] = set()  # (node, term) leaderships checked
        self._events = 0
        self._readings: dict[int, tuple[int, int]] = {}  # node -> (generation, last reading)
        self._bound_at = -1  # true ms of the last bound computed
        self._majority_ahead_ms: dict[frozenset[int], int] = {}  # voter configuration -> its majority's lead
        self._rate_rise_ms = 0.0  # the fastest clock's lead not yet added to allowed_ahead_ms (under 1 ms)
        self._degraded_until = -1  # true ms until which no correct majority of clocks may be assumed
        self.allowed_ahead_ms = 0
        """How far ahead of true time the log's clock may read: the majority's time, carried on as it moves."""
        self.log_ahead_max_ms = 0
        """The furthest any reading of the log's clock was ahead of true time (reported)."""

    def violation(self, text: str) -> None:
        self.cluster.fail(text)

    # ---- hooks -------------------------------------------------------------------------
    def on_send(self, m: Message) -> None:
        if m.type not in _UNPERSISTED_TERMS:
            self.term_sent[m.frm] = max(self.term_sent.get(m.frm, 0), m.term)
        if m.type is MT.APP_RESP and not m.reject and m.index > 0:
            core = self.cluster.nodes[m.frm].core
            term = core.log.term(m.index) if core is not None else None
            if term is not None and m.index >= self.promised.get(m.frm, (0, 0))[0]:
                self.promised[m.frm] = (m.index, term)
        if m.type is MT.VOTE_RESP and not m.reject:
            key = (m.frm, m.term)
            previous = self.votes_granted.setdefault(key, m.to)
            if previous != m.to:
                self.violation(f"n{m.frm} granted votes to n{previous} and n{m.to} in term {m.term}")

    def on_restart(self, node: int, hs: HardState, entries: list[Entry], snap: SnapshotMeta) -> None:
        sent = self.term_sent.get(node, 0)
        if hs.term < sent:
            self.violation(f"n{node} restarted at term {hs.term} after sending term {sent}")
        granted = self.votes_granted.get((node, hs.term))
        if granted is not None and hs.vote != granted:
            self.violation(f"n{node} restarted with vote {hs.vote} in term {hs.term}, granted n{granted}")
        self._checked_commit[node] = snap.index
        must = self.must_survive.pop(node, None)
        if must is not None and must[0] > snap.index:
            index, term = must
            have = (
                entries[index - entries[0].index].term
                if entries and entries[0].index <= index <= entries[-1].index
                else None
            )
            if have != term:
                self.violation(f"n{node} acknowledged entry {index}@{term} and lost it in a crash")

    def on_crash(self, node: int) -> None:
        """What the node acknowledged and still held must be on its disk when it comes back."""
        core = self.cluster.nodes[node].core
        promise = self.promised.pop(node, None)
        if core is not None and promise is not None and core.log.term(promise[0]) == promise[1]:
            self.must_survive[node] = promise

    def on_apply(self, node: int, entry: Entry) -> None:
        known = self.committed.get(entry.index)
        if known is not None and known != (entry.term, entry.data):
            self.violation(f"n{node} applied {entry.index}@{entry.term}, another node applied {known[0]}")
        self._register(entry)

    def on_ack(self, value: int, entry: Entry) -> None:
        self.acked[value] = (entry.index, entry.term)

    def on_snapshot_installed(self, node: int, snapshot: Snapshot) -> None:
        self._checked_commit[node] = snapshot.meta.index

    def on_read_requested(self, context: bytes, leader: int) -> None:
        self.read_floor[context] = self.max_committed

    def on_read_state(self, node: int, state: ReadState) -> None:
        floor = self.read_floor.get(state.context)
        if floor is not None and state.index < floor:
            self.violation(f"n{node} read index {state.index} below commit {floor} at request time")
        self.reads_checked += 1

    def on_read_served(self, node: int, state: ReadState, applied: int) -> None:
        """A read job ran: the state it read must include its read index, hence every entry
        committed when the read was asked."""
        floor = self.read_floor.get(state.context, 0)
        if applied < max(state.index, floor):
            self.violation(f"n{node} served a read at applied {applied}, below its read index {state.index}"
                           f" (commit {floor} at request time)")

    def on_clock_reading(self, node: int, generation: int, reading: int, *, grounded: bool) -> None:
        if not grounded:  # knows nothing yet: its own clock, which nothing keeps (log_clock.py)
            return
        previous = self._readings.get(node)
        if previous is not None and previous[0] == generation and reading < previous[1]:
            self.violation(f"n{node}'s log clock went back from {previous[1]} to {reading}")
        self._readings[node] = (generation, reading)
        self.check_clock_bound(f"n{node}'s reading of the log's clock", reading)

    def clock_allowed_ahead_ms(self) -> int:
        """How far ahead of true time the log's clock may read now: where the highest majority's time
        is, or, once the log was carried ahead of it, that lead moved on only as a majority's time
        moves (the log's clock never goes back, and above its base advances by the smaller of the
        monotonic and the base's advance); without a majority of correct clocks up, as the fastest
        monotonic clock gains."""
        cluster = self.cluster
        if self._bound_at != cluster.now:
            # Each configuration a node may lead with has a majority of its own (with membership
            # changes, the voters of a set of five may be four): the bound takes the highest.
            clocks = cluster.time.clocks
            confs = {frozenset(clocks)} | {node.core.conf.voters for node in cluster.nodes.values()
                                           if node.core is not None and node.core.conf.voters}  # fmt: skip
            majorities = {conf: majority_ahead_ms({n: clocks[n] for n in conf}, cluster.now) for conf in confs}
            rises = [now - self._majority_ahead_ms[conf] for conf, now in majorities.items()
                     if conf in self._majority_ahead_ms]  # fmt: skip
            if self._without_correct_majority(confs):
                self._degraded_until = cluster.now + SAMPLE_TTL_MS + SLACK_MS
            if cluster.now <= self._degraded_until and self._bound_at >= 0:
                # Beyond the fault model (docs/queue.md, "One clock"): with a voter down or cut off and
                # a bad clock among the rest, a leader's base may be the bad clock itself, and a reading
                # carried above it moves on by the smaller of its monotonic advance and the base's: at
                # most the fastest monotonic clock's rate. Summed exactly (a millisecond rounded up per
                # step would let the bound run at true rate).
                fastest = max(clock.rate for clock in clocks.values())
                self._rate_rise_ms += max(0.0, fastest - 1) * (cluster.now - self._bound_at)
                whole = int(self._rate_rise_ms)
                self._rate_rise_ms -= whole
                rises.append(whole)
            else:
                self._rate_rise_ms = 0.0
            self.allowed_ahead_ms = max(max(majorities.values()), self.allowed_ahead_ms + max([0, *rises]))
            self._majority_ahead_ms = majorities
            self._bound_at = cluster.now
        return self.allowed_ahead_ms + BAND_MS + SLACK_MS

    def _without_correct_majority(self, confs: set[frozenset[int]]) -> bool:
        """Whether some configuration's voters that are up and connected hold no majority of correct
        clocks (a crash or a partition on top of a clock fault: two faults in a set of three)."""
        cluster = self.cluster
        bad = set(cluster.time.plan.bad)
        cut = {n for pair in cluster.blocked for n in pair}
        down = {n for n, node in cluster.nodes.items() if node.core is None} | cut
        return any(len(conf & (bad | down)) > (len(conf) - 1) // 2 for conf in confs if conf & bad)

    def check_clock_bound(self, what: str, value: int) -> None:
        ahead = value - (EPOCH_MS + self.cluster.now)
        self.log_ahead_max_ms = max(self.log_ahead_max_ms, ahead)
        allowed = self.clock_allowed_ahead_ms()
        if ahead > allowed:
            self.violation(f"{what} is {ahead} ms ahead of true time; the majority's clocks allow {allowed} ms:"
                           " a minority's clock moved the log's time")  # fmt: skip

    # ---- after every event ---------------------------------------------------------------
    def after_event(self) -> None:
        self._events += 1
        for node_id, node in self.cluster.nodes.items():
            core = node.core
            if core is None:
                continue
            if core.role is Role.LEADER:
                first = self.leaders.setdefault(core.term, node_id)
                if first != node_id:
                    self.violation(f"two leaders in term {core.term}: n{first} and n{node_id}")
                if (node_id, core.term) not in self._complete_checked:
                    self._check_leader_complete(node_id)
                    self._complete_checked.add((node_id, core.term))
            self._check_commits(node_id)
        if self._events % 16 == 0:
            self._check_log_matching()

    def _register(self, entry: Entry) -> None:
        known = self.committed.get(entry.index)
        if known is None:
            self.committed[entry.index] = (entry.term, entry.data)
            self.max_committed = max(self.max_committed, entry.index)
        elif known != (entry.term, entry.data):
            self.violation(f"index {entry.index} committed as {known[0]} and as {entry.term}")

    def _check_commits(self, node_id: int) -> None:
        core = self.cluster.nodes[node_id].core
        assert core is not None
        log = core.log
        start = max(self._checked_commit.get(node_id, 0), log.snapshot_index) + 1
        for index in range(start, log.committed + 1):
            self._register(log.entry(index))
        self._checked_commit[node_id] = max(self._checked_commit.get(node_id, 0), log.committed)

    def _check_leader_complete(self, node_id: int) -> None:
        core = self.cluster.nodes[node_id].core
        assert core is not None
        log = core.log
        for index, (term, _) in self.committed.items():
            if index <= log.snapshot_index:
                continue
            if log.term(index) != term:
                self.violation(f"new leader n{node_id} (term {core.term}) lacks committed entry {index}@{term}")

    def _check_log_matching(self) -> None:
        live = [(n, node.core) for n, node in self.cluster.nodes.items() if node.core is not None]
        for i, (a, core_a) in enumerate(live):
            for b, core_b in live[i + 1 :]:
                la, lb = core_a.log, core_b.log
                lo = max(la.snapshot_index, lb.snapshot_index) + 1
                hi = min(la.last_index(), lb.last_index())
                matched = False
                for index in range(hi, lo - 1, -1):
                    ea, eb = la.entry(index), lb.entry(index)
                    if matched or ea.term == eb.term:
                        matched = True
                        if ea != eb:
                            self.violation(f"log matching broken at {index} between n{a} and n{b}")

    # ---- end of run ---------------------------------------------------------------------
    def check_converged(self, final_value: int) -> None:
        if final_value not in self.acked:
            self.violation("a proposal made after healing did not commit in time")
        self.check_healed(self._check_values)

    def check_healed(self, per_node: Callable[[int, SimNode], None] | None = None) -> None:
        """After healing: one leader, and every healthy member running and applied up to the
        leader's last index; `per_node` then checks each member's state."""
        cluster = self.cluster
        leader = cluster.leader()
        if leader is None:
            self.violation("no leader after healing")
        live = {n: node for n, node in cluster.nodes.items() if not node.corrupted}
        lcore = cluster.nodes[leader].core  # type: ignore[index]
        assert lcore is not None
        members = lcore.conf.all_nodes()
        target = lcore.log.last_index()
        for node_id, node in live.items():
            if node_id not in members:
                continue
            if node.core is None:
                self.violation(f"n{node_id} not running after healing")
            if node.state_index != target:
                self.violation(f"n{node_id} applied {node.state_index}, leader has {target} after healing")
            if per_node is not None:
                per_node(node_id, node)

    def _check_values(self, node_id: int, node: SimNode) -> None:
        applied = {index: (term, data) for index, term, data in node.applied}
        for value, (index, term) in self.acked.items():
            got = applied.get(index)
            if got is None or got[0] != term or int.from_bytes(got[1][:8], "big") != value:
                self.violation(f"acked value {value} at {index}@{term} lost on n{node_id}")
        for index, (term, data) in applied.items():
            if self.committed.get(index, (term, data)) != (term, data):
                self.violation(f"n{node_id} state differs at {index}")
