"""Several Raft nodes in one process: a host runs one replica of each of several groups (a
deployment's sets and its control set) on one event loop.

Why: on a machine with few cores every process costs its own loop, timers, sockets and wake-ups;
twelve node processes for three sets and a control set on two cores paid that twelve times over
(docs/sets.md, "Hosting several replicas in one process"). A hosted replica is still its own
everything: its own listener, data directory, WAL, snapshots, machine, threads and Raft state; only
the loop and the process are shared. Its data directory is the same whether it runs alone or
hosted, so a replica moves between the two by being started the other way.

A storage failure of any replica stops the whole process with exit 1: a disk that failed under one
replica is the machine's disk under all of them, and the supervisor's one restart (or the
operator's one replacement) brings them back together. The last lines on stderr name each failed
replica (`stop_reason`); the healthy ones stop cleanly (their stores committed), as on SIGTERM.

Must never: share anything replicated between the hosted replicas, or keep serving some replicas
after another stopped for its storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raft_store.files import WalFailedError
from raft_store.framing import CorruptLogError
from raft_store.log_context import about
from raft_store.node import Node, NodeStopped
from raft_store.node_config import NodeConfig
from raft_store.process import stop_on_signals
from raft_store.snapshots import CorruptSnapshotError
from raft_store.state_machine import GroupCommittingMachine, StateMachine
from raft_store.stop_reason import stop_reason

log = logging.getLogger("raft_store.hosting")
STORAGE_ERRORS = (OSError, sqlite3.Error, WalFailedError, CorruptLogError, CorruptSnapshotError, NodeStopped)
"""What stops a node for its storage (at start, or as `Node.failure`): answered with `stop_reason`."""

Beside = Callable[[Sequence[Node]], contextlib.AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class Replica:
    """One hosted node: its settings, its machine (owned by `run_nodes` from then on), and the name of
    its group in the lines the process prints (`set 2`; empty for a process of one node)."""

    config: NodeConfig
    machine: StateMachine
    group: str = ""


def check_distinct(configs: Sequence[tuple[str, NodeConfig]]) -> None:
    """Two replicas of one process never share a data directory or a listening address (ValueError,
    one line, before anything is opened)."""
    seen_dirs: dict[str, str] = {}
    seen_listen: dict[tuple[str, int], str] = {}
    for group, config in configs:
        where = str(config.data_dir.resolve())
        if where in seen_dirs:
            raise ValueError(f"{group or 'a replica'} and {seen_dirs[where] or 'another'} share the data directory {config.data_dir}")
        if config.listen in seen_listen:
            host, port = config.listen
            raise ValueError(f"{group or 'a replica'} and {seen_listen[config.listen] or 'another'} both listen on {host}:{port}")
        seen_dirs[where] = seen_listen[config.listen] = group


async def run_nodes(replicas: Sequence[Replica], beside: Beside | None = None, stop: asyncio.Event | None = None) -> int:
    """Runs every replica until SIGTERM or SIGINT (0), or until `stop` is set when an embedding
    process gives one, or until any replica stops for its storage (1: every replica stops, and the
    last lines on stderr name the failed ones). `beside` is entered once all started and left once
    all stopped (an embedding command's endpoints, such as its metrics).

    After a failure nothing of the failed replica is committed on the way out (its machine's open
    transaction is rolled back: the log replays it)."""
    nodes: list[Node] = []
    failures: dict[int, BaseException] = {}
    try:
        for index, replica in enumerate(replicas):
            try:
                with about(replica.group):  # its tasks and threads log as its set's (log_context)
                    node = Node(replica.config, replica.machine)
                    await node.start()
            except STORAGE_ERRORS as exc:  # recovery failed: the same line as for a failure later
                failures[index] = exc
                log.critical("%s could not start: %r", _name(replica), exc, exc_info=exc)
                break
            nodes.append(node)
        if failures:
            await asyncio.gather(*(node.stop() for node in nodes))
        else:
            async with beside(nodes) if beside is not None else contextlib.nullcontext():
                await _serve_until_stopped(nodes, stop)
        for index, node in enumerate(nodes):
            if node.failure is not None:
                failures[index] = node.failure
    except BaseException:
        for replica in replicas:
            _close_after_failure(replica.machine)
        raise
    for index, replica in enumerate(replicas):
        if index in failures:
            _close_after_failure(replica.machine)
        else:
            replica.machine.close()
    for index, failure in sorted(failures.items()):
        replica = replicas[index]
        line = stop_reason(failure, node_id=replica.config.node_id, data_dir=replica.config.data_dir, group=replica.group)
        print(line, file=sys.stderr, flush=True)
    return 1 if failures else 0


def _name(replica: Replica) -> str:
    return f"node {replica.config.node_id}" + (f" of {replica.group}" if replica.group else "")


def _close_after_failure(machine: StateMachine) -> None:
    """Close without committing: the failure may have left half an apply in the open transaction."""
    try:
        if isinstance(machine, GroupCommittingMachine):
            machine.rollback()
        machine.close()
    except Exception as exc:  # the store may be as broken as the log: the reason line comes next
        log.warning("closing the state machine after the failure: %r", exc)


async def _serve_until_stopped(nodes: Sequence[Node], given: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    stop = given or asyncio.Event()
    # An embedding process that gives `stop` handles its signals itself (compensator/shell.py).
    with stop_on_signals(stop) if given is None else contextlib.nullcontext(stop):
        for replica_node in nodes:
            host, port = replica_node.config.listen
            started = {"event": "started", "node": replica_node.config.node_id, "listen": f"{host}:{port}"}
            print(json.dumps(started), flush=True)
        waits = [loop.create_task(stop.wait()), *(loop.create_task(node.stopped.wait()) for node in nodes)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*(node.stop() for node in nodes))
