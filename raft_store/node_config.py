"""A node's configuration: who it is, whom it talks to and how, its timing and its storage limits.

Kept apart from the runner (node.py) so that building and checking a configuration (the command
line, tests, embedders) needs none of the runner's machinery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from raft_store.auth import StoreAuth
from raft_store.wal import GroupCommitPolicy

log = logging.getLogger("raft_store.node")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: int
    data_dir: Path
    listen: tuple[str, int]
    peers: dict[int, tuple[str, int]]
    auth: StoreAuth
    """The cluster secrets (and TLS) that every connection to and from this node must prove."""
    initial_voters: frozenset[int] = frozenset()
    cluster_id: int = 1
    tick_ms: int = 30
    election_ticks: int = 10
    heartbeat_ticks: int = 2
    batch_commands_max: int = 8192
    group_commit: GroupCommitPolicy = field(
        default_factory=lambda: GroupCommitPolicy(max_entries=8192, max_delay_ms=0.0)
    )
    snapshot_every_entries: int = 20_000
    # Entries carry batches of commands, so bound the log kept in memory by bytes too.
    snapshot_every_bytes: int = 64 << 20
    volatile_until_fsync: bool = False
    segment_bytes: int = 64 << 20
    wal_preallocate: bool = True
    """Zero-fill the log's next segment ahead of need, so a sync flushes data and no file system
    metadata (raft_store/wal_spare.py); off where that buys nothing, as on copy-on-write file systems."""
    client_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Node id -> the address clients use for that node, advertised in the status answer. Peers
    may talk on a network clients cannot reach, so clients never use `peers` addresses."""

    def validate(self) -> None:
        if self.node_id <= 0:
            raise ValueError("node_id must be positive")
        if self.tick_ms <= 0:
            raise ValueError("tick_ms must be positive")
        if self.initial_voters and self.node_id not in self.initial_voters and self.node_id not in self.peers:
            log.info("node %d starts outside the initial voters: it waits to be added", self.node_id)
        self.group_commit.validate()
        for node, (host, port) in self.client_addresses.items():
            if node <= 0 or not host or not 0 < port < 65536:
                raise ValueError(f"client address {host}:{port} of node {node} is not a node id and host:port")
        for node in self.initial_voters:
            if node != self.node_id and node not in self.peers:
                raise ValueError(f"initial voter {node} has no address in peers")
