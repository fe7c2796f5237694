"""Linearizable reads by ReadIndex (Raft dissertation 6.4), the leader's half and the answers.

A read point is the leader's commit index once a majority has confirmed, by answering a
heartbeat carrying the read's context, that the leader still leads. A leader that has not yet
committed an entry of its own term does not know the true commit index: reads wait for it.
Part of the pure core: state in, messages and read states out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raft_store.types import Message, MessageType, ReadState

if TYPE_CHECKING:
    from raft_store.core import RaftCore

MT = MessageType


@dataclass(slots=True)
class _ReadRequest:
    index: int
    context: bytes
    requester: int
    acks: set[int]


class ReadIndex:
    """The reads a leader is confirming, those waiting for its first commit, and the read states
    ready for this node's runner."""

    def __init__(self, core: RaftCore) -> None:
        self._core = core
        self._reads: list[_ReadRequest] = []
        self._pending: list[tuple[bytes, int]] = []  # before the leader commits in its term
        self._states: list[ReadState] = []

    def reset(self) -> None:
        """A change of role forgets the reads under way: their requesters retry."""
        self._reads = []
        self._pending = []

    def has_states(self) -> bool:
        return bool(self._states)

    def take_states(self) -> list[ReadState]:
        states, self._states = self._states, []
        return states

    def latest_context(self) -> bytes:
        """The context a heartbeat carries: acknowledging the latest read confirms all before it."""
        return self._reads[-1].context if self._reads else b""

    def answered(self, m: Message) -> None:
        """The leader's answer to this follower's READ_INDEX."""
        self._states.append(ReadState(index=m.index, context=m.context))

    def leader_read(self, context: bytes, requester: int) -> None:
        core = self._core
        if core.log.term(core.log.committed) != core.term:
            self._pending.append((context, requester))
            return
        request = _ReadRequest(core.log.committed, context, requester, {core.id})
        if core.has_quorum(request.acks):
            self._release(request)
            return
        self._reads.append(request)
        core.replication.broadcast_heartbeat(context)

    def commit_advanced(self) -> None:
        """The leader's commit index moved in its term: the reads that waited for it start."""
        for context, requester in self._pending:
            self.leader_read(context, requester)
        self._pending = []

    def ack(self, context: bytes, node: int) -> None:
        for position, request in enumerate(self._reads):
            if request.context == context:
                request.acks.add(node)
                if self._core.has_quorum(request.acks):
                    # Everything queued before a confirmed read is confirmed too.
                    for done in self._reads[: position + 1]:
                        self._release(done)
                    self._reads = self._reads[position + 1 :]
                return

    def _release(self, request: _ReadRequest) -> None:
        core = self._core
        if request.requester == core.id:
            self._states.append(ReadState(request.index, request.context))
        else:
            core.send(
                Message(
                    MT.READ_INDEX_RESP,
                    to=request.requester,
                    frm=core.id,
                    term=core.term,
                    index=request.index,
                    context=request.context,
                )
            )
