"""What an idle set costs: a heartbeat is a message in and a message out, and nothing else.

A deployment runs many sets (docs/sets.md), most of them idle most of the time, so each set's
standing cost is its heartbeats (docs/benchmarks.md, "an idle node's turn"). These pin the two
things that keep a heartbeat cheap: its reply never reaches the disk or the machine (no write, no
fsync, no thread hop), and a node runs one turn per input, not one per wake-up of some helper.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raft_store.core import Config, RaftCore, Recovered, Role
from raft_store.machines import CounterMachine
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.ready_runner import ReadyRunner, RunnerConfig
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports
from raft_store.types import ConfState, Message, MessageType, SnapshotMeta
from tests.raft_store.test_ready_runner import ManualLane, Ports, _Applier


def _follower() -> tuple[ReadyRunner, Ports, ManualLane, ManualLane]:
    conf = ConfState(voters=frozenset({1, 2, 3}))
    core = RaftCore(Config(node_id=1), Recovered(snapshot=SnapshotMeta(0, 0, conf)), random.Random(1))
    ports, disk, machine = Ports(), ManualLane(), ManualLane()
    # Never inline: any write would show as a job on the disk lane.
    runner = ReadyRunner(core, RunnerConfig(inline_persist_bytes_max=-1, inline_apply_bytes_max=-1), storage=ports,
                         applier=_Applier(ports), reader=ports, disk=disk, machine=machine, effects=ports)  # fmt: skip
    return runner, ports, disk, machine


def _heartbeat(term: int, commit: int = 0) -> Message:
    return Message(MessageType.HEARTBEAT, to=1, frm=2, term=term, commit=commit)


def test_a_heartbeat_reply_is_sent_at_once_without_a_write_or_a_thread_hop() -> None:
    runner, ports, disk, machine = _follower()
    runner.core.step(_heartbeat(term=1))  # the first one moves the term: that is written and fsynced
    runner.pump()
    assert len(disk.jobs) == 1 and not ports.sent, "the new term is durable before the reply leaves"
    disk.complete()
    runner.pump()
    assert [m.type for m in ports.sent] == [MessageType.HEARTBEAT_RESP]
    writes = len(ports.batches)
    for _ in range(50):  # an idle follower's next 3 seconds
        runner.core.step(_heartbeat(term=1))
        runner.pump()
    assert len(ports.sent) == 51, "every heartbeat answered in the same turn"
    assert len(ports.batches) == writes and not disk.jobs, "a heartbeat's reply wrote nothing"
    assert not machine.jobs and runner.idle and not ports.failures
    assert runner.core.role is Role.FOLLOWER


async def test_an_idle_node_runs_one_turn_per_input(tmp_path: Path) -> None:
    ports = free_ports(2)
    peers = {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}
    auth = cluster_auth(tmp_path)
    nodes = [
        Node(NodeConfig(node_id=n, data_dir=tmp_path / f"node{n}", listen=peers[n], peers=peers,
                        initial_voters=frozenset(peers), tick_ms=10, election_ticks=30, auth=auth), CounterMachine())
        for n in peers
    ]  # fmt: skip
    for node in nodes:
        await node.start()
    try:
        for _ in range(500):
            if any(n.core is not None and n.core.role is Role.LEADER for n in nodes) and all(
                n.core is not None and n.core.leader for n in nodes
            ):
                break
            await asyncio.sleep(0.01)
        (follower,) = [n for n in nodes if n.core is not None and n.core.role is Role.FOLLOWER]
        await asyncio.sleep(0.2)  # past the election's writes
        counts = {"turns": 0, "steps": 0, "lane_jobs": 0, "wal_writes": 0}

        def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                counts[name] += 1
                return fn(*args, **kwargs)

            return wrapper

        assert follower.core is not None and follower.wal is not None
        follower._turn = counted("turns", follower._turn)  # type: ignore[method-assign]
        follower.core.step = counted("steps", follower.core.step)  # type: ignore[method-assign]
        follower._io.submit = counted("lane_jobs", follower._io.submit)  # type: ignore[method-assign]
        follower._apply.submit = counted("lane_jobs", follower._apply.submit)  # type: ignore[method-assign]
        follower.wal.append = counted("wal_writes", follower.wal.append)  # type: ignore[method-assign]
        follower.wal.set_hard_state = counted("wal_writes", follower.wal.set_hard_state)  # type: ignore[method-assign]
        await asyncio.sleep(1.0)
        # A heartbeat every 2 ticks of 10 ms: about 50 in the second.
        assert counts["steps"] >= 25, counts
        assert counts["lane_jobs"] == 0 and counts["wal_writes"] == 0, f"heartbeats reached the disk or machine: {counts}"
        # One turn per heartbeat, and the election timer's few wake-ups (it goes off at most
        # once per election timeout, 300 ms here, and is armed again).
        assert counts["turns"] <= counts["steps"] + 6, f"more turns than inputs: {counts}"
    finally:
        for node in nodes:
            await node.stop()


async def test_wakes_before_a_turn_make_one_turn(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    peers = {1: ("127.0.0.1", port)}
    node = Node(NodeConfig(node_id=1, data_dir=tmp_path / "node1", listen=peers[1], peers=peers,
                           initial_voters=frozenset(peers), tick_ms=10, auth=cluster_auth(tmp_path)), CounterMachine())  # fmt: skip
    await node.start()
    try:
        await asyncio.sleep(0.05)
        turns = 0
        turn = node._turn

        def counted() -> None:
            nonlocal turns
            turns += 1
            turn()

        node._turn = counted  # type: ignore[method-assign]
        for _ in range(100):
            node.wake()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert turns == 1
        assert node.failure is None
    finally:
        await node.stop()
