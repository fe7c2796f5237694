"""Values shared by the Raft core, the WAL, the codec and the runners.

Everything here is an immutable value: the core hands these to the edges (disk, network, state
machine) and the edges hand them back. No I/O, no clock, nothing mutable that two layers could
race on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

NodeId = NewType("NodeId", int)
Term = NewType("Term", int)
Index = NewType("Index", int)

NO_NODE: int = 0


class EntryKind(enum.IntEnum):
    """What a log entry carries.

    NORMAL entries carry an opaque state-machine command batch; NOOP is the entry a new leader
    appends so it can commit in its own term; CONF carries a membership change.
    """

    NORMAL = 0
    NOOP = 1
    CONF = 2


class Role(enum.Enum):
    """A node's part in its current term."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    kind: EntryKind
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any vote or append reply leaves the node."""

    term: int = 0
    vote: int = 0
    commit: int = 0


@dataclass(frozen=True, slots=True)
class ConfState:
    """Membership: voters count for elections and commitment, learners only receive the log."""

    voters: frozenset[int] = frozenset()
    learners: frozenset[int] = frozenset()

    def all_nodes(self) -> frozenset[int]:
        return self.voters | self.learners


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta
    data: bytes = b""


class ConfChangeType(enum.IntEnum):
    ADD_VOTER = 0
    ADD_LEARNER = 1
    REMOVE_NODE = 2


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single-server membership change (Raft dissertation 4.1): one node at a time."""

    change: ConfChangeType
    node: int

    def encode(self) -> bytes:
        return bytes([int(self.change)]) + self.node.to_bytes(8, "big")

    @staticmethod
    def decode(data: bytes) -> ConfChange:
        if len(data) != 9:
            raise ValueError("conf change must be 9 bytes")
        return ConfChange(ConfChangeType(data[0]), int.from_bytes(data[1:], "big"))


class MessageType(enum.IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APP = 5
    APP_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAP = 9
    TIMEOUT_NOW = 10
    # A follower forwards a snapshot-status report or read index request to the leader.
    READ_INDEX = 11
    READ_INDEX_RESP = 12


@dataclass(frozen=True, slots=True)
class Message:
    """One Raft message; a single shape (as in etcd) keeps the codec and the simulator simple.

    Field use by type:
    - APP: index/log_term name the entry before `entries`; commit is the leader's commit.
    - APP_RESP: index is the last index the follower now matches (or, on reject, the probed
      index) and reject_hint/log_term carry the conflict hint for fast back-off.
    - VOTE/PRE_VOTE: index/log_term are the candidate's last entry.
    - HEARTBEAT(_RESP), READ_INDEX(_RESP): context carries a read-index request id.
    - every type: `wall_ms` and `clock_ms` are the sender's wall clock and its reading of the log's
      clock when it sent (0: not said). The core never reads them; the runner stamps them on the
      way out and feeds them to its `LogClock` on the way in (log_clock.py).
    """

    type: MessageType
    to: int
    frm: int
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""
    snapshot: Snapshot | None = None
    wall_ms: int = 0
    clock_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the state machine has applied `index`."""

    index: int
    context: bytes
