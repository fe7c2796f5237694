"""A follower's side of replication: appends, heartbeats and snapshots from its leader.

A follower never lets its commit index pass what it holds, answers every append with where its
log now ends (or a hint of where it diverges, so the leader backs off by terms, not entries), and
takes a snapshot only when the leader's point is past its own commit. Part of the pure core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft_store.types import Message, MessageType, Snapshot

if TYPE_CHECKING:
    from raft_store.core import RaftCore

MT = MessageType


class Following:
    """What a follower does with its leader's messages; holds a received snapshot until the
    next Ready hands it to storage."""

    def __init__(self, core: RaftCore) -> None:
        self._core = core
        self._snapshot: Snapshot | None = None

    def has_snapshot(self) -> bool:
        return self._snapshot is not None

    def take_snapshot(self) -> Snapshot | None:
        snapshot, self._snapshot = self._snapshot, None
        return snapshot

    def step(self, m: Message) -> None:
        core = self._core
        if m.type is MT.APP:
            core.elections.elapsed = 0
            core.leader = m.frm
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            core.elections.elapsed = 0
            core.leader = m.frm
            core.log.commit_to(min(m.commit, core.log.last_index()))
            core.send(Message(MT.HEARTBEAT_RESP, to=m.frm, frm=core.id, term=core.term, context=m.context))
        elif m.type is MT.SNAP:
            core.elections.elapsed = 0
            core.leader = m.frm
            self._handle_snapshot(m)
        elif m.type is MT.TIMEOUT_NOW:
            if core.is_promotable():
                core.elections.hup(transfer=True)
        elif m.type is MT.READ_INDEX_RESP:
            core.reads.answered(m)

    def _handle_append(self, m: Message) -> None:
        core = self._core
        log = core.log
        if m.index < log.committed:
            core.send(Message(MT.APP_RESP, to=m.frm, frm=core.id, term=core.term, index=log.committed))
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            core.send(Message(MT.APP_RESP, to=m.frm, frm=core.id, term=core.term, index=last_new))
            return
        hint = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
        core.send(
            Message(
                MT.APP_RESP,
                to=m.frm,
                frm=core.id,
                term=core.term,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=log.term(hint) or 0,
            )
        )

    def _handle_snapshot(self, m: Message) -> None:
        assert m.snapshot is not None
        core = self._core
        log = core.log
        meta = m.snapshot.meta
        if meta.index <= log.committed:
            core.send(Message(MT.APP_RESP, to=m.frm, frm=core.id, term=core.term, index=log.committed))
            return
        if log.match_term(meta.index, meta.term):
            # We already have the entries: just fast-forward the commit.
            log.commit_to(meta.index)
        else:
            log.restore(meta)
            self._snapshot = m.snapshot
        core.send(Message(MT.APP_RESP, to=m.frm, frm=core.id, term=core.term, index=log.last_index()))
