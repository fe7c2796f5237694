"""The store node process kind (``compensator node``): one node of the set's Raft log, running the
queue machine (queues/replicated.py), with its metrics (services/node_metrics.py) on the node's
own loop.

Its membership comes from the same ``[store]`` section every client of the set reads:
`store.addresses` lists the nodes (node N is the N-th address), where clients reach them;
`store.peer_addresses`, when the nodes talk to each other on a network of their own, where they
reach each other. So a deployment writes the set's addresses once. The cluster secret and TLS
files are the clients' too (`store.secret_file`, `store.tls_*`). The node's own settings are the
``[node]`` section (its id, where it listens, its data, its timing).

Before there was a ``[store]`` for nodes, a node was given its peers on its command line
(``--peer ID=host:port`` and ``--client-address``, as ``raft-store run`` still is): those flags keep
working, and when they are given they alone say who the peers are.

Must never: run anything at import, or open the node's data directory before its settings
validated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from compensator.config import Config
from compensator.config_processes import parse_address
from compensator.shell import ProcessError, Running, Shell, metrics_endpoint
from compensator.store import store_auth
from compensator.wiring.parts import metrics_address
from queues.replicated import machine_factory
from queues.stores import StoreError
from raft_store import cli as raft_cli
from raft_store.files import private_dir
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.wal import GroupCommitPolicy
from services.node_metrics import NodeCollector

Addresses = dict[int, tuple[str, int]]


def shell(config: Config) -> Shell:
    """The node's own log lines are few and matter (a storage failure): warnings and up."""
    return Shell(name="node", log_level="warning")


def _numbered(addresses: tuple[str, ...]) -> Addresses:
    return {node: parse_address(address) for node, address in enumerate(addresses, 1)}


def membership(config: Config) -> tuple[Addresses, Addresses]:
    """(where the nodes reach each other, where clients reach them), node N the N-th of `[store]`."""
    store = config.store
    clients = _numbered(store.addresses)
    return (_numbered(store.peer_addresses) if store.peer_addresses else clients), clients


def node_config(
    config: Config, *, peers: Mapping[int, tuple[str, int]] | None = None,
    client_addresses: Mapping[int, tuple[str, int]] | None = None, volatile: bool = False,
) -> NodeConfig:  # fmt: skip
    """This node's Raft settings: its membership from `[store]` unless the command line named its
    `peers` (then `client_addresses` too, if any), its own from `[node]`."""
    node = config.node
    if node.id == 0:
        raise ProcessError("no node id: give --id (or node.id), this node's place in store.addresses, from 1")
    if peers is None:
        peers, client_addresses = membership(config)
        where = f"store.addresses ({len(peers)} nodes)"
    else:
        where = "--peer"
    if node.id not in peers and not node.listen:
        raise ProcessError(f"node {node.id} is not in {where}: give its place there, or --listen (and --join)")
    voters = [] if node.join else (list(node.voters) or sorted(peers))
    settings = NodeConfig(
        node_id=node.id, data_dir=Path(node.data_dir or f"var/node{node.id}"),
        listen=parse_address(node.listen) if node.listen else peers[node.id], peers=dict(peers),
        auth=store_auth(config), initial_voters=frozenset(voters), tick_ms=node.tick_ms,
        election_ticks=node.election_ticks,
        group_commit=GroupCommitPolicy(max_entries=node.group_commit_entries, max_delay_ms=node.group_commit_delay_ms),
        snapshot_every_entries=node.snapshot_every_entries, snapshot_every_bytes=node.snapshot_every_mib << 20,
        volatile_until_fsync=volatile, client_addresses=dict(client_addresses or {}),
    )  # fmt: skip
    try:
        settings.validate()
    except ValueError as error:
        raise ProcessError(str(error)) from None
    return settings


@contextlib.asynccontextmanager
async def process(config: Config, settings: NodeConfig) -> AsyncIterator[Running]:
    """`compensator node`: SIGTERM stops the node; a storage failure stops it by itself (exit 1).
    Call `raft_store.cli.prepare_node_process()` before the process's loop starts."""
    private_dir(settings.data_dir)
    try:  # a data directory of the SQL store is refused in one line that says how to convert it
        machine = machine_factory(settings.data_dir)
    except StoreError as error:
        raise ProcessError(str(error)) from None
    address = metrics_address(config.node.metrics_host, config.node.metrics_port)

    @contextlib.asynccontextmanager
    async def beside(node: Node) -> AsyncIterator[None]:
        """The node's metrics, collected at scrape time between applies."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(node.status, node.query_applied))
        async with metrics_endpoint(address, registry, busy=lambda: node.applying):
            yield

    async def run(stop: asyncio.Event) -> int:
        return await raft_cli.run_node(settings, machine, beside, stop=stop)  # it closes the machine

    yield Running(run)
