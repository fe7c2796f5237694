"""The leader's side of client writes: proposals batched into entries, and who waits for each.

Client commands arriving at the leader in one loop iteration share one log entry (up to
`batch_commands_max` commands), stamped with the log's clock as the leader reads it. Whoever
proposed an entry is answered once it applies: OK with its results; NOT_LEADER when another
leader's entry took the index (ours can never apply); IN_DOUBT when our entry may still commit
under the next leader. A client tells its caller "not applied" only on NOT_LEADER.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from raft_store import codec
from raft_store.codec import FrameType, Status
from raft_store.core import ProposalDropped, RaftCore, Role
from raft_store.membership import MembershipError
from raft_store.metrics import NodeMetrics
from raft_store.node_clock import NodeClock
from raft_store.node_config import NodeConfig
from raft_store.ready_runner import Results
from raft_store.state_machine import encode_batch
from raft_store.transport import ClientConnection
from raft_store.types import ConfChange, ConfChangeType, Entry


@dataclass(slots=True)
class Waiter:
    conn: ClientConnection | None
    request_id: int
    count: int
    future: asyncio.Future[codec.Result] | None = None

    def reply(self, status: Status, hint: int, results: tuple[bytes, ...]) -> None:
        result = codec.Result(self.request_id, status, hint, results)
        if self.future is not None:
            if not self.future.done():
                self.future.set_result(result)
        elif self.conn is not None:
            self.conn.send(FrameType.RESULT, codec.encode_result(result))


class Proposals:
    def __init__(self, config: NodeConfig, clock: NodeClock, metrics: NodeMetrics) -> None:
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self.core: RaftCore | None = None
        self._pending: list[tuple[Waiter, tuple[tuple[int, int, bytes], ...]]] = []
        self._pending_since = 0.0
        self._waiting: dict[int, tuple[int, list[Waiter]]] = {}
        self._admin_waiting: dict[int, tuple[int, Waiter]] = {}

    def take(self, waiter: Waiter, commands: tuple[tuple[int, int, bytes], ...]) -> None:
        core = self.core
        assert core is not None
        if core.role is not Role.LEADER:
            waiter.reply(Status.NOT_LEADER, core.leader, ())
            return
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append((waiter, commands))

    def await_admin(self, index: int, term: int, waiter: Waiter) -> None:
        self._admin_waiting[index] = (term, waiter)

    def responds(self, index: int) -> bool:
        """Only the node that proposed an entry has clients waiting for its results."""
        return index in self._waiting

    def propose_pending(self) -> float | None:
        """Propose what is pending, in entries of up to `batch_commands_max` commands; or, when the
        group-commit policy says wait, the seconds until it will not."""
        core = self.core
        assert core is not None
        if not self._pending:
            return None
        if core.role is not Role.LEADER:
            for waiter, _ in self._pending:
                waiter.reply(Status.NOT_LEADER, core.leader, ())
            self._pending = []
            return None
        policy = self._config.group_commit
        if policy.max_delay_ms > 0:
            pending = sum(len(c) for _, c in self._pending)
            age_ms = (time.monotonic() - self._pending_since) * 1000
            if not policy.should_sync(pending, age_ms):
                return max(0.0, (policy.max_delay_ms - age_ms) / 1000)
        self._clock.set_role(core.role is Role.LEADER, core.leader, core.conf.voters)
        now_ms = self._clock.read_ms()  # the log's clock as the leader reads it, stamped into the entry
        queued, self._pending = self._pending, []
        limit = self._config.batch_commands_max
        at, count = 0, len(queued)
        while at < count:  # one pass over the pending list (a pop(0) per caller was quadratic)
            batch: list[tuple[int, int, bytes]] = []
            waiters: list[Waiter] = []
            while at < count and (not batch or len(batch) + len(queued[at][1]) <= limit):
                waiter, commands = queued[at]
                at += 1
                batch.extend(commands)
                waiters.append(waiter)
            try:
                index = core.propose(encode_batch(now_ms, batch))
            except ProposalDropped:
                for waiter in waiters:
                    waiter.reply(Status.DROPPED, core.leader, ())
                continue
            self._waiting[index] = (core.term, waiters)
            self._metrics.proposed_commands += len(batch)
        return None

    def answer(self, committed: list[Entry], results: Results) -> None:
        node_id = self._config.node_id
        for entry, result in zip(committed, results, strict=True):
            waiting = self._waiting.pop(entry.index, None)
            if waiting is not None:
                term, waiters = waiting
                if term != entry.term or result is None:
                    # Another term at the index: another leader's entry replaced ours, which can
                    # never apply. Our own entry without results committed, so "not applied"
                    # would be a guess: in doubt.
                    status = Status.NOT_LEADER if term != entry.term else Status.IN_DOUBT
                    for waiter in waiters:
                        waiter.reply(status, 0, ())
                else:
                    offset = 0
                    for waiter in waiters:
                        waiter.reply(Status.OK, node_id, tuple(result[offset : offset + waiter.count]))
                        offset += waiter.count
            admin = self._admin_waiting.pop(entry.index, None)
            if admin is not None:
                term, waiter = admin
                waiter.reply(Status.OK if term == entry.term else Status.NOT_LEADER, node_id, (b"applied",))

    def fail_all(self, hint: int) -> None:
        """Answer everyone waiting when this node stops leading or stops. What is in the log may
        still commit under the next leader (IN_DOUBT); what never reached it cannot (NOT_LEADER)."""
        for _, waiters in self._waiting.values():
            for waiter in waiters:
                waiter.reply(Status.IN_DOUBT, hint, ())
        self._waiting = {}
        for _, waiter in self._admin_waiting.values():
            waiter.reply(Status.IN_DOUBT, hint, ())
        self._admin_waiting = {}
        for waiter, _ in self._pending:
            waiter.reply(Status.NOT_LEADER, hint, ())
        self._pending = []


_CONF_CHANGES = {
    "add_voter": ConfChangeType.ADD_VOTER,
    "add_learner": ConfChangeType.ADD_LEARNER,
    "remove": ConfChangeType.REMOVE_NODE,
}


def admin(
    core: RaftCore, proposals: Proposals, add_peer: Callable[[int, tuple[str, int]], None],
    conn: ClientConnection, body: bytes,
) -> None:  # fmt: skip
    """An operator's request (JSON): transfer leadership, or add or remove a node; the change is
    answered once its entry applies."""
    try:
        request = json.loads(body)
        op, node, request_id = str(request["op"]), int(request["node"]), int(request.get("request_id", 0))
    except (ValueError, KeyError, TypeError) as exc:
        conn.send(FrameType.RESULT, codec.encode_result(codec.Result(0, Status.ERROR, 0, (str(exc).encode(),))))
        return
    waiter = Waiter(conn, request_id, 1)
    if core.role is not Role.LEADER:
        waiter.reply(Status.NOT_LEADER, core.leader, ())
        return
    if op == "transfer":
        core.transfer_leadership(node)
        waiter.reply(Status.OK, core.leader, (b"transfer started",))
        return
    if op not in _CONF_CHANGES:
        waiter.reply(Status.ERROR, core.leader, (f"unknown op {op!r}".encode(),))
        return
    if "address" in request:
        host, port = str(request["address"]).rsplit(":", 1)
        add_peer(node, (host, int(port)))
    try:
        index = core.propose_conf_change(ConfChange(_CONF_CHANGES[op], node))
    except (ProposalDropped, MembershipError) as exc:
        waiter.reply(Status.ERROR, core.leader, (str(exc).encode(),))
        return
    proposals.await_admin(index, core.term, waiter)
