"""What a node answers about a command it could not finish, which the client's errors rest on.

NOT_LEADER must mean "not in my log" (so certainly not applied through me); a leader that logged
a command and lost leadership before it committed must say IN_DOUBT, because the entry may still
commit under the next leader. Two nodes run in this process on loopback with short ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from raft_store.codec import Status
from raft_store.core import Role
from raft_store.machines import CounterMachine
from raft_store.node import Node, NodeConfig
from raft_store.testing.processes import free_ports


@contextlib.asynccontextmanager
async def two_nodes(tmp_path: Path, *, election_ticks: int) -> AsyncIterator[tuple[Node, Node]]:
    """(leader, follower) of a new two-voter cluster: with two voters an entry needs both."""
    ports = free_ports(2)
    peers = {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}
    nodes = [
        Node(NodeConfig(node_id=n, data_dir=tmp_path / f"node{n}", listen=peers[n], peers=peers,
                        initial_voters=frozenset(peers), tick_ms=10, election_ticks=election_ticks), CounterMachine())
        for n in peers
    ]
    for node in nodes:
        await node.start()
    try:
        leader = await _leader(nodes)
        (follower,) = [node for node in nodes if node is not leader]
        yield leader, follower
    finally:
        for node in nodes:
            if not node.stopped.is_set():
                await node.stop()


async def _leader(nodes: list[Node], timeout_s: float = 5.0) -> Node:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in nodes:
            if node.core is not None and node.core.role is Role.LEADER:
                return node
        await asyncio.sleep(0.01)
    raise AssertionError("no leader elected")


async def test_a_follower_refuses_and_a_leader_that_lost_its_quorum_is_in_doubt(tmp_path: Path) -> None:
    async with two_nodes(tmp_path, election_ticks=10) as (leader, follower):
        assert (await leader.propose_local([(0, 0, b"x")])).status is Status.OK

        refused = await follower.propose_local([(0, 0, b"y")])
        assert (refused.status, refused.leader_hint) == (Status.NOT_LEADER, leader.config.node_id)

        await follower.stop()  # the leader's next entry cannot commit
        stranded = asyncio.ensure_future(leader.propose_local([(0, 0, b"z")]))
        # Check-quorum makes the leader step down after an election timeout without its follower.
        answer = await asyncio.wait_for(stranded, 5.0)
        assert answer.status is Status.IN_DOUBT
        assert leader.core is not None and leader.core.role is not Role.LEADER

        late = await leader.propose_local([(0, 0, b"w")])
        assert late.status is Status.NOT_LEADER


async def test_a_leader_stopped_with_a_command_in_its_log_is_in_doubt(tmp_path: Path) -> None:
    async with two_nodes(tmp_path, election_ticks=30) as (leader, follower):
        await follower.stop()
        stranded = asyncio.ensure_future(leader.propose_local([(0, 0, b"z")]))
        await asyncio.sleep(0.05)  # proposed and in the log, well before the check-quorum timeout
        assert not stranded.done()
        await leader.stop()
        assert stranded.result().status is Status.IN_DOUBT
