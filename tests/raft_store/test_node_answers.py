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

import pytest

from raft_store.client import ClientError, LongPoll, RaftClient, RequestRefused
from raft_store.codec import Status
from raft_store.core import Role
from raft_store.machines import CounterMachine
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports


class SlowQueries(CounterMachine):
    """b"slow" takes half a second (five election timeouts at these ticks), b"boom" raises."""

    def query(self, data: bytes) -> bytes:
        if data == b"boom":
            raise RuntimeError("the query broke")
        if data == b"slow":
            time.sleep(0.5)
        return super().query(data)


@contextlib.asynccontextmanager
async def two_nodes(
    tmp_path: Path, *, election_ticks: int, machine: type[CounterMachine] = CounterMachine
) -> AsyncIterator[tuple[Node, Node]]:
    """(leader, follower) of a new two-voter cluster: with two voters an entry needs both."""
    ports = free_ports(2)
    peers = {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}
    auth = cluster_auth(tmp_path)
    nodes = [
        Node(NodeConfig(node_id=n, data_dir=tmp_path / f"node{n}", listen=peers[n], peers=peers,
                        initial_voters=frozenset(peers), tick_ms=10, election_ticks=election_ticks, auth=auth), machine())
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


async def test_a_slow_query_leaves_the_loop_leading_and_a_failing_one_answers_an_error(tmp_path: Path) -> None:
    """Queries run on the apply thread: while one takes five election timeouts the leader keeps
    its term and commits, and a query that raises answers ERROR with the node still serving."""
    async with two_nodes(tmp_path, election_ticks=10, machine=SlowQueries) as (leader, _):
        assert leader.core is not None
        term = leader.core.term
        client = RaftClient([leader.config.listen], auth=leader.transport.auth, attempt_timeout_s=5.0, deadline_s=5.0)
        try:
            slow = asyncio.ensure_future(client.read(b"slow", linearizable=False))
            await asyncio.sleep(0.05)  # the slow query is on the apply thread now
            assert leader.applying and leader.query_applied(b"") is None  # the loop keeps off the machine
            committed = leader.core.log.committed
            proposals = [asyncio.ensure_future(leader.propose_local([(0, 0, b"x")])) for _ in range(5)]
            while leader.core.log.committed < committed + 1:  # replicated and fsynced by both meanwhile
                await asyncio.sleep(0.005)
            assert not slow.done()  # committed while the query ran (applied after it: one connection)
            answer, applied = await slow
            assert all(result.status is Status.OK for result in await asyncio.gather(*proposals))
            assert applied >= 1 and b'"applied"' in answer
            with pytest.raises(RequestRefused, match="the query broke"):
                await client.read(b"boom", linearizable=False)
            answer, applied = await client.read(b"fine")  # linearizable, after all five commands
            assert b'"count": 5' in answer and applied == leader.core.log.applied
            assert leader.core.term == term and leader.core.role is Role.LEADER
        finally:
            await client.close()


async def test_a_node_stopped_during_a_slow_query_does_not_leave_its_client_waiting(tmp_path: Path) -> None:
    async with two_nodes(tmp_path, election_ticks=10, machine=SlowQueries) as (leader, _):
        client = RaftClient([leader.config.listen], auth=leader.transport.auth, attempt_timeout_s=5.0, deadline_s=2.0)
        try:
            slow = asyncio.ensure_future(client.read(b"slow", linearizable=False))
            await asyncio.sleep(0.05)
            await leader.stop()
            began = time.perf_counter()
            with contextlib.suppress(ClientError):  # answered before the close, or told it cannot be
                await asyncio.wait_for(slow, 3.0)
            assert time.perf_counter() - began < 3.0
        finally:
            await client.close()


async def test_a_waiting_read_is_answered_when_a_command_applies_or_when_its_wait_runs_out(tmp_path: Path) -> None:
    """The long poll an idle worker waits for work with: held until a command past the index the
    caller last saw has applied, then answered from that state; else answered when the wait ends."""
    async with two_nodes(tmp_path, election_ticks=10) as (leader, _):
        assert leader.core is not None
        client = RaftClient([leader.config.listen], auth=leader.transport.auth, attempt_timeout_s=2.0, deadline_s=5.0)
        try:
            _, seen = await client.read(b"", linearizable=False)
            began = time.perf_counter()
            answer, applied = await client.read(b"", linearizable=False, wait=LongPoll(seen, 0.3))
            assert time.perf_counter() - began >= 0.29 and applied == seen  # nothing applied: the wait ran out
            assert b'"count": 0' in answer

            waiting = asyncio.ensure_future(client.read(b"", linearizable=False, wait=LongPoll(seen, 5.0)))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            began = time.perf_counter()
            assert (await leader.propose_local([(0, 0, b"x")])).status is Status.OK
            answer, applied = await asyncio.wait_for(waiting, 1.0)
            assert time.perf_counter() - began < 1.0 and applied > seen and b'"count": 1' in answer

            answer, _ = await client.read(b"", linearizable=False, wait=LongPoll(seen, 5.0))
            assert b'"count": 1' in answer  # already past that index: answered at once
            with pytest.raises(ValueError, match="must be stale"):
                await client.read(b"", wait=LongPoll(seen, 1.0))
        finally:
            await client.close()


async def test_wake_one_reads_of_one_query_are_answered_one_per_apply_oldest_first(tmp_path: Path) -> None:
    """Idle workers asking the same question: an apply wakes one of them, the next apply the next."""
    async with two_nodes(tmp_path, election_ticks=10) as (leader, _):
        client = RaftClient([leader.config.listen], auth=leader.transport.auth, attempt_timeout_s=2.0, deadline_s=5.0)
        try:
            _, seen = await client.read(b"", linearizable=False)
            waiting = []
            for _ in range(2):
                waiting.append(asyncio.ensure_future(client.read(b"", linearizable=False, wait=LongPoll(seen, 5.0, True))))
                await asyncio.sleep(0.05)  # in this order at the node
            other = asyncio.ensure_future(client.read(b"other", linearizable=False, wait=LongPoll(seen, 5.0, True)))
            await asyncio.sleep(0.05)
            assert (await leader.propose_local([(0, 0, b"x")])).status is Status.OK
            first = await asyncio.wait_for(waiting[0], 1.0)
            await asyncio.wait_for(other, 1.0)  # another query: woken by the same apply
            await asyncio.sleep(0.2)
            assert not waiting[1].done()
            assert (await leader.propose_local([(0, 0, b"y")])).status is Status.OK
            second = await asyncio.wait_for(waiting[1], 1.0)
            assert first[1] < second[1] and b'"count": 2' in second[0]
        finally:
            await client.close()
