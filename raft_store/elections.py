"""Elections: the election timer, pre-vote and vote campaigns, and the votes this node grants.

Pre-vote (Raft dissertation 9.6) lets a node that was cut off learn whether it could win before
it raises its term; check-quorum's lease makes a node that hears from a live leader refuse to
depose it. The timer's randomness is the injected `random.Random`, drawn at the same points in
every run, which keeps the core deterministic under a seed. Part of the pure core.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from raft_store.types import NO_NODE, EntryKind, Message, MessageType, Role

if TYPE_CHECKING:
    from raft_store.core import RaftCore

MT = MessageType
TRANSFER_CONTEXT = b"transfer"


class Elections:
    """The votes of the campaign under way and the election timer (ticks since a leader or a
    candidate was last heard, against this term's randomized timeout)."""

    def __init__(self, core: RaftCore, rng: random.Random) -> None:
        self._core = core
        self._rng = rng
        self._votes: dict[int, bool] = {}
        self.elapsed = 0
        self._timeout = core.config.election_ticks
        self.reset_timeout()

    def reset_timeout(self) -> None:
        n = self._core.config.election_ticks
        self._timeout = n + self._rng.randrange(n)

    def forget_votes(self) -> None:
        self._votes = {}

    def in_lease(self) -> bool:
        """A leader was heard within the election timeout: a vote request must not depose it."""
        core = self._core
        return core.config.check_quorum and core.leader != NO_NODE and self.elapsed < core.config.election_ticks

    def tick(self) -> None:
        """A follower's or candidate's tick: campaign once the timeout passes without a leader."""
        self.elapsed += 1
        if self._core.is_promotable() and self.elapsed >= self._timeout:
            self.elapsed = 0
            self.hup(transfer=False)

    def ticks_until_due(self) -> int:
        """A follower's or candidate's next tick that does more than count: the one its timeout
        passes on. A node that cannot campaign never has one; it answers an election timeout, a
        bound and not a deadline (its ticks are counted all the same)."""
        core = self._core
        if not core.is_promotable():
            return core.config.election_ticks
        return max(1, self._timeout - self.elapsed)

    def hup(self, *, transfer: bool) -> None:
        core = self._core
        if core.log.applying < core.log.committed and self._has_unapplied_conf():
            return  # do not campaign with a membership change not yet applied
        if core.config.pre_vote and not transfer:
            core.become_pre_candidate()
            self._campaign(MT.PRE_VOTE, core.term + 1, b"")
        else:
            core.become_candidate()
            self._campaign(MT.VOTE, core.term, TRANSFER_CONTEXT if transfer else b"")

    def _has_unapplied_conf(self) -> bool:
        log = self._core.log
        return any(
            log.entry(i).kind is EntryKind.CONF
            for i in range(log.applying + 1, log.committed + 1)
            if i > log.snapshot_index
        )

    def _campaign(self, vote_type: MessageType, term: int, context: bytes) -> None:
        core = self._core
        self._votes[core.id] = True
        if self._tally() == "won":
            if vote_type is MT.PRE_VOTE:
                core.become_candidate()
                self._campaign(MT.VOTE, core.term, b"")
            else:
                core.become_leader()
            return
        for node in sorted(core.conf.voters):
            if node != core.id:
                core.send(
                    Message(
                        vote_type,
                        to=node,
                        frm=core.id,
                        term=term,
                        index=core.log.last_index(),
                        log_term=core.log.last_term(),
                        context=context,
                    )
                )

    def _tally(self) -> str:
        voters = self._core.conf.voters
        granted = sum(1 for n, v in self._votes.items() if v and n in voters)
        rejected = sum(1 for n, v in self._votes.items() if not v and n in voters)
        if granted * 2 > len(voters):
            return "won"
        if rejected * 2 >= len(voters):
            return "lost"
        return "pending"

    def step_candidate(self, m: Message) -> None:
        core = self._core
        expected = MT.PRE_VOTE_RESP if core.role is Role.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
            core.become_follower(m.term, m.frm)  # a leader exists in this term
            core.following.step(m)
        elif m.type is expected:
            self._votes.setdefault(m.frm, not m.reject)
            outcome = self._tally()
            if outcome == "won":
                if core.role is Role.PRE_CANDIDATE:
                    core.become_candidate()
                    self._campaign(MT.VOTE, core.term, b"")
                else:
                    core.become_leader()
            elif outcome == "lost":
                core.become_follower(core.term, NO_NODE)

    def handle_vote_request(self, m: Message) -> None:
        core = self._core
        can_vote = (
            core.vote == m.frm
            or (core.vote == NO_NODE and core.leader == NO_NODE)
            or (m.type is MT.PRE_VOTE and m.term > core.term)
        )
        resp_type = MT.VOTE_RESP if m.type is MT.VOTE else MT.PRE_VOTE_RESP
        if can_vote and core.log.is_up_to_date(m.index, m.log_term):
            # A granted pre-vote answers with the term the candidate will campaign in.
            core.send(Message(resp_type, to=m.frm, frm=core.id, term=m.term))
            if m.type is MT.VOTE:
                self.elapsed = 0
                core.vote = m.frm
        else:
            core.send(Message(resp_type, to=m.frm, frm=core.id, term=core.term, reject=True))
