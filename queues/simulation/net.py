"""Simulated clients: exactly-once session lanes over lossy links to the nodes.

A real `RaftClient` (raft_store/client.py) gives each in-flight command its own session lane
(client_id) and keeps that lane's (client_id, seq) across every retry and redirect, so a command
the log already holds is answered from the session table instead of applying twice. A lane whose
outcome is in doubt is dropped, never reused. The simulation keeps exactly that contract, and adds
what a real network does to it: requests and answers dropped, duplicated and delayed, answers
from a node that lost leadership, clients that pick a stale leader, and give-ups after timeouts
(an "unknown" outcome for the caller). Client links are also cut for a while, one client from one
node, both ways or one way only (requests arrive and answers are lost: the command may apply
while its client sees nothing), as a partition between an application host and one node is.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from queues.client import travels_sessionless
from queues.codec import decode_result, encode_command
from queues.model import QueueCommand, QueueResult
from raft_store.sqlite_machine import SESSION_RESULT_STALE

if TYPE_CHECKING:
    from queues.simulation.cluster import QueueCluster


class Status(enum.Enum):
    OK = "ok"
    NOT_LEADER = "not_leader"
    DROPPED = "dropped"


Reply = Callable[[Status, bytes], None]
"""How a node answers one request; the answer travels back over the lossy link."""

Done = Callable[[QueueResult | None], None]
"""The caller's continuation: the decoded result, or None when the client gave up (unknown)."""


@dataclass(slots=True)
class Lane:
    client_id: int
    seq: int = 0


@dataclass(slots=True)
class Call:
    lane: Lane
    data: bytes
    on_done: Done
    tries_max: int
    tries: int = 0
    done: bool = False


@dataclass(slots=True)
class NetStats:
    calls: int = 0
    answered: int = 0
    unknown: int = 0
    requests: int = 0
    dropped: int = 0
    cuts: int = 0
    """Client-to-node links cut (a fault each)."""
    cut_drops: int = 0
    """Requests and answers lost to a cut link."""


@dataclass(slots=True)
class ClientNet:
    """The links between every simulated client process and the nodes."""

    cluster: QueueCluster
    timeout_ms: int = 250
    drop: float = 0.03
    duplicate: float = 0.02
    delay_ms_max: int = 15
    stale_leader_probability: float = 0.1
    cut_every_ms: tuple[int, int] = (300, 1500)
    cut_ms: tuple[int, int] = (150, 1500)
    stats: NetStats = field(default_factory=NetStats)
    cut: dict[tuple[str, int], tuple[bool, bool]] = field(default_factory=dict)
    """(client, node) -> (requests lost, answers lost) while the link is cut."""
    clients: list[str] = field(default_factory=list)
    _next_lane: int = 0
    _cut_rng: random.Random = field(default_factory=random.Random)

    def start(self, seed: int) -> None:
        """Begin cutting client links. Draws come from a generator of their own, so that the
        seed's other draws (crashes, partitions, the workload's) keep their order."""
        self._cut_rng = random.Random(seed ^ 0xC1C7)
        self.cluster.at(self._cut_rng.uniform(*self.cut_every_ms), self._cut_loop)

    def _cut_loop(self) -> None:
        cluster = self.cluster
        if cluster.healed:
            self.cut.clear()
            return
        rng = self._cut_rng
        if self.clients:
            link = (rng.choice(self.clients), rng.choice(cluster.ids))
            way = rng.random()
            self.cut[link] = (way < 0.7, way >= 0.4)  # both ways 30 %, requests only 40 %, answers only 30 %
            self.stats.cuts += 1
            cluster.log(f"client link {link[0]}-n{link[1]} cut ({'both ways' if all(self.cut[link]) else 'one way'})")
            cluster.at(rng.uniform(*self.cut_ms), lambda: self._mend(link))
        cluster.at(rng.uniform(*self.cut_every_ms), self._cut_loop)

    def _mend(self, link: tuple[str, int]) -> None:
        self.cut.pop(link, None)

    def link_open(self, client: str, node: int, *, answer: bool) -> bool:
        cut = self.cut.get((client, node))
        if cut is None or not cut[1 if answer else 0] or self.cluster.healed:
            return True
        self.stats.cut_drops += 1
        return False

    def new_lane(self) -> Lane:
        self._next_lane += 1
        return Lane(self._next_lane)

    def pick_node(self) -> int:
        """Mostly the current leader; sometimes any node, as a client with a stale leader hint."""
        rng = self.cluster.rng
        leader = self.cluster.leader()
        if leader is None or rng.random() < self.stale_leader_probability:
            return rng.choice(self.cluster.ids)
        return leader

    def send(self, deliver: Callable[[], None]) -> None:
        """One hop over a lossy link: maybe lost, maybe twice, always after a delay."""
        cluster = self.cluster
        rng = cluster.rng
        if not cluster.healed and rng.random() < self.drop:
            self.stats.dropped += 1
            return
        copies = 2 if not cluster.healed and rng.random() < self.duplicate else 1
        for _ in range(copies):
            cluster.at(rng.uniform(0.5, self.delay_ms_max if not cluster.healed else 2), deliver)


class Client:
    """One client process: a pool of lanes, retries on timeout or redirect, give-up as unknown."""

    def __init__(self, net: ClientNet, name: str) -> None:
        self.net = net
        self.name = name
        self._free: list[Lane] = []
        net.clients.append(name)

    def submit(self, command: QueueCommand, on_done: Done, *, tries_max: int = 4) -> None:
        if travels_sessionless(command):
            lane = Lane(0)  # as QueueClient sends it: no session (an enqueue with a request id)
        else:
            lane = self._free.pop() if self._free else self.net.new_lane()
            lane.seq += 1
        call = Call(lane, encode_command(command), on_done, tries_max)
        self.net.stats.calls += 1
        self._try(call)

    def _try(self, call: Call) -> None:
        if call.done:
            return
        if call.tries >= call.tries_max:
            call.done = True  # the lane's outcome is in doubt: never reuse it
            self.net.stats.unknown += 1
            call.on_done(None)
            return
        call.tries += 1
        attempt = call.tries
        net = self.net
        cluster = net.cluster
        node_id = net.pick_node()
        net.stats.requests += 1

        def reply(status: Status, result: bytes) -> None:
            if net.link_open(self.name, node_id, answer=True):
                net.send(lambda: self._answer(call, attempt, status, result))

        request = (call.lane.client_id, call.lane.seq, call.data)
        if net.link_open(self.name, node_id, answer=False):
            net.send(lambda: cluster.receive(node_id, request, reply))
        cluster.at(net.timeout_ms, lambda: self._retry(call, attempt))

    def _retry(self, call: Call, attempt: int) -> None:
        if not call.done and call.tries == attempt:
            self._try(call)

    def _answer(self, call: Call, attempt: int, status: Status, result: bytes) -> None:
        if call.done:
            return  # a duplicate or a late answer to a finished call
        if status is not Status.OK:
            backoff = self.net.cluster.rng.uniform(5, 40)
            self.net.cluster.at(backoff, lambda: self._retry(call, attempt))
            return
        if result == SESSION_RESULT_STALE:
            self.net.cluster.qchecker.violation(
                f"{self.name}: lane {call.lane.client_id} seq {call.lane.seq} answered as a stale session"
            )
        call.done = True
        self.net.stats.answered += 1
        if call.lane.client_id:
            self._free.append(call.lane)
        call.on_done(decode_result(result))
