"""``compensator node``: one store node running the queue machine.

The same options as ``raft-store run`` (raft_store.cli owns them), without ``--machine``: the
service's node always runs the queue, built here, so nothing about what runs is chosen by a
string.

Must never: open the node's data directory before its options validated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from compensator.config import parse_address
from compensator.node_metrics import MetricsServer, NodeCollector
from queues.replicated import DB_NAME, ReplicatedQueueMachine
from raft_store import cli as raft_cli
from raft_store.files import private_dir
from raft_store.node import Node


class NodeCommandError(ValueError):
    """Bad node options: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    node = subparsers.add_parser("node", help="run one store node (Raft, the queue machine)")
    raft_cli.add_node_arguments(node)
    node.add_argument("--metrics-address", help="serve Prometheus metrics on HOST:PORT (GET /metrics); default off")
    node.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    try:
        config = raft_cli.node_config(args)
    except raft_cli.UsageError as error:
        raise NodeCommandError(str(error)) from None
    metrics_address = None
    if args.metrics_address:
        try:
            metrics_address = parse_address(args.metrics_address)
        except ValueError as error:
            raise NodeCommandError(f"--metrics-address: {error}") from None
    data_dir = Path(config.data_dir)
    raft_cli.prepare_node_process()
    private_dir(data_dir)
    machine = ReplicatedQueueMachine(str(data_dir / DB_NAME))
    beside = None if metrics_address is None else functools.partial(_metrics, address=metrics_address)
    return asyncio.run(raft_cli.run_node(config, machine, beside))


@contextlib.asynccontextmanager
async def _metrics(node: Node, *, address: tuple[str, int]) -> AsyncIterator[None]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node.status, node.query_applied))
    server = MetricsServer(registry, *address, applying=lambda: node.applying)
    await server.start()
    try:
        yield
    finally:
        await server.stop()
