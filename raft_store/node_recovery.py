"""A node's start from its data directory: the WAL, the newest snapshot or checkpoint, the machine.

Refuses, in one clear exception, what it cannot start from safely: a store behind its own
checkpoint (replaced or rolled back), a WAL that starts past the snapshot (a gap), a machine that
applied beyond the log. A torn WAL tail is truncated and counted (a crash mid-write), never a
record in the middle.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable

from raft_store.core import Config as CoreConfig
from raft_store.core import RaftCore, Recovered
from raft_store.metrics import NodeMetrics
from raft_store.node_config import NodeConfig
from raft_store.node_snapshots import NodeSnapshots, NodeStopped
from raft_store.state_machine import StateMachine
from raft_store.types import ConfState, SnapshotMeta
from raft_store.wal import Recovered as WalRecovered
from raft_store.wal import Wal

log = logging.getLogger("raft_store.node")


def recover(
    cfg: NodeConfig, machine: StateMachine, snapshots: NodeSnapshots, metrics: NodeMetrics,
    clock_from_machine: Callable[[], None],
) -> tuple[Wal, RaftCore]:  # fmt: skip
    """Open the WAL and rebuild the core's starting point (runs on the WAL thread)."""
    wal, rec = Wal.open(
        cfg.data_dir / "wal", segment_bytes=cfg.segment_bytes, volatile=cfg.volatile_until_fsync,
        preallocate=cfg.wal_preallocate and not cfg.volatile_until_fsync,
    )  # fmt: skip
    if rec.torn_tail is not None:
        log.warning("node %d: WAL torn tail truncated: %s", cfg.node_id, rec.torn_tail)
        metrics.torn_tails += 1
    try:
        core = _starting_point(cfg, machine, snapshots, clock_from_machine, rec)
    except BaseException:
        with contextlib.suppress(Exception):  # a refused start leaves nothing open; its reason stands
            wal.close()
        raise
    return wal, core


def _starting_point(
    cfg: NodeConfig, machine: StateMachine, snapshots: NodeSnapshots, clock_from_machine: Callable[[], None],
    rec: WalRecovered,
) -> RaftCore:  # fmt: skip
    clock_from_machine()
    latest = snapshots.store.latest()
    snapshots.shippable = latest
    if latest is not None:
        meta, path = latest
    else:
        meta, path = SnapshotMeta(0, 0, ConfState(voters=cfg.initial_voters)), None
    checkpoint = snapshots.store.checkpoint()
    if checkpoint is not None and checkpoint.index > meta.index:
        # The log before the checkpoint is gone; only the machine's own store holds it.
        if machine.applied_index() < checkpoint.index:
            raise NodeStopped(
                f"state store reflects index {machine.applied_index()}, behind its checkpoint at"
                f" {checkpoint.index}: the store was replaced or rolled back; move this data directory"
                " aside and let the node rejoin empty (it then receives a snapshot)"
            )
        meta, path = checkpoint, None
    if path is not None and machine.applied_index() < meta.index:
        snapshots.restore_machine(path, meta)
    entries = [e for e in rec.entries if e.index > meta.index]
    if entries and entries[0].index != meta.index + 1:
        raise NodeStopped(f"WAL starts at {entries[0].index}, snapshot ends at {meta.index}: refusing a gap")
    last = entries[-1].index if entries else meta.index
    applied = machine.applied_index()
    if applied > last:
        raise NodeStopped(f"state machine applied {applied} beyond the log's last index {last}")
    return RaftCore(
        CoreConfig(node_id=cfg.node_id, election_ticks=cfg.election_ticks, heartbeat_ticks=cfg.heartbeat_ticks),
        Recovered(hard_state=rec.hard_state, snapshot=meta, entries=tuple(entries), applied=max(applied, meta.index)),
        random.Random(),
    )
