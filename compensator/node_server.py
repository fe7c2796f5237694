"""``compensator node``: one store node running the queue machine.

The same options as ``raft-store run`` (raft_store.cli owns them), without ``--machine``: the
service's node always runs the queue, built here, so nothing about what runs is chosen by a
string.

Must never: open the node's data directory before its options validated.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from queues.replicated import DB_NAME, ReplicatedQueueMachine
from raft_store import cli as raft_cli


class NodeCommandError(ValueError):
    """Bad node options: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    node = subparsers.add_parser("node", help="run one store node (Raft, the queue machine)")
    raft_cli.add_node_arguments(node)
    node.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    try:
        config = raft_cli.node_config(args)
    except raft_cli.UsageError as error:
        raise NodeCommandError(str(error)) from None
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    raft_cli.prepare_node_process()
    return asyncio.run(raft_cli.run_node(config, ReplicatedQueueMachine(str(data_dir / DB_NAME))))
