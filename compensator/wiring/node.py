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
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from compensator.config import Config
from compensator.config_processes import HostedReplica, parse_address
from compensator.shell import ProcessError, Running, Shell, metrics_endpoint
from compensator.store import store_auth
from compensator.wiring.parts import gc_policy, metrics_address
from queues.replicated import machine_factory
from queues.stores import StoreError
from raft_store.files import private_dir
from raft_store.hosting import Replica, check_distinct, run_nodes
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.wal import GroupCommitPolicy
from services.node_metrics import HostedCollector, NodeCollector

Addresses = dict[int, tuple[str, int]]


def shell(config: Config) -> Shell:
    """The node's own log lines are few and matter (a storage failure): warnings and up."""
    return Shell(name="node", log_level="warning", gc=gc_policy(config))


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
        wal_preallocate=node.wal_preallocate, volatile_until_fsync=volatile, client_addresses=dict(client_addresses or {}),
    )  # fmt: skip
    try:
        settings.validate()
    except ValueError as error:
        raise ProcessError(str(error)) from None
    return settings


def hosted_configs(config: Config, own: NodeConfig, *, volatile: bool = False) -> list[tuple[HostedReplica, NodeConfig]]:
    """Each of `node.replicas` as Raft settings: its set's membership from its own addresses, the
    timing, secret and TLS of this process (`own`); ProcessError (one line) before any data
    directory is opened when two replicas would share a folder or a listening address."""
    hosted: list[tuple[HostedReplica, NodeConfig]] = []
    for replica in config.node.replicas:
        clients = _numbered(replica.addresses)
        peers = _numbered(replica.peer_addresses) if replica.peer_addresses else clients
        settings = dataclasses.replace(
            own, node_id=replica.id, data_dir=Path(replica.data_dir), peers=peers, client_addresses=clients,
            listen=parse_address(replica.listen) if replica.listen else peers[replica.id],
            initial_voters=frozenset() if replica.join else frozenset(replica.voters or peers),
            volatile_until_fsync=volatile, tick_ms=replica.tick_ms or own.tick_ms,
        )  # fmt: skip
        try:
            settings.validate()
        except ValueError as error:
            raise ProcessError(f"node.replicas ({replica.group}): {error}") from None
        hosted.append((replica, settings))
    try:
        check_distinct([(own_group(config), own), *((replica.group, settings) for replica, settings in hosted)])
    except ValueError as error:
        raise ProcessError(f"node.replicas: {error}") from None
    return hosted


def own_group(config: Config) -> str:
    return f"set {config.store.set_id}"


@contextlib.asynccontextmanager
async def process(
    config: Config, settings: NodeConfig, hosted: list[tuple[HostedReplica, NodeConfig]] | None = None,
) -> AsyncIterator[Running]:  # fmt: skip
    """`compensator node`: SIGTERM stops the node (and every hosted replica); a storage failure of
    any stops them all by itself (exit 1). Call `raft_store.cli.prepare_node_process()` before the
    process's loop starts."""
    hosted = hosted or []
    groups = [(own_group(config) if hosted else "", str(config.store.set_id), settings)]
    groups += [(replica.group, str(replica.set_id), replica_settings) for replica, replica_settings in hosted]
    replicas: list[Replica] = []
    try:
        for group, _, replica_settings in groups:
            private_dir(replica_settings.data_dir)
            try:  # a data directory of the SQL store is refused in one line that says how to convert it
                replicas.append(Replica(replica_settings, machine_factory(replica_settings.data_dir), group))
            except StoreError as error:
                raise ProcessError(f"{group + ': ' if group else ''}{error}") from None
    except BaseException:
        for opened in replicas:
            opened.machine.close()
        raise
    address = metrics_address(config.node.metrics_host, config.node.metrics_port)

    @contextlib.asynccontextmanager
    async def beside(nodes: Sequence[Node]) -> AsyncIterator[None]:
        """The nodes' metrics, collected at scrape time between applies; hosted replicas on one page,
        each sample labelled with its `set`."""
        registry = CollectorRegistry(auto_describe=False)
        collectors = [NodeCollector(node.status, node.query_applied) for node in nodes]
        if hosted:
            registry.register(HostedCollector([(label, c) for (_, label, _), c in zip(groups, collectors, strict=True)]))
        else:
            registry.register(collectors[0])
        async with metrics_endpoint(address, registry, busy=lambda: any(node.applying for node in nodes)):
            yield

    async def run(stop: asyncio.Event) -> int:
        return await run_nodes(replicas, beside, stop=stop)  # it closes the machines

    yield Running(run)
