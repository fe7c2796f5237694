"""A node's status answer: what `raft-store status`, the metrics endpoint and operators read.

Apart from node.py so the runner keeps to running; this only reads the node (on its loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raft_store.node import Node


def node_status(node: Node) -> dict[str, Any]:
    core = node.core
    assert core is not None
    config = node.config
    last = core.log.last_index()
    followers = {
        str(peer): {
            "match": pr.match,
            "next": pr.next,
            "state": pr.state.value,
            "lag": last - pr.match,
            "learner": pr.is_learner,
            "connected": node.transport.is_connected(peer),
        }
        for peer, pr in sorted(core.progress.items())
        if peer != config.node_id
    }
    spare = node.wal.spare if node.wal is not None else None
    return {
        "node": config.node_id,
        "role": core.role.value,
        "term": core.term,
        "leader": core.leader,
        "commit": core.log.committed,
        "applied": core.log.applied,
        "last_index": last,
        "snapshot_index": core.log.snapshot_index,
        # A follower applies in the background, some entries behind its commit index (docs/raft.md).
        "apply": {
            "background": node.apply_background,
            "unapplied_bytes": node.runner.unapplied_bytes if node.runner is not None else 0,
        },
        "voters": sorted(core.conf.voters),
        "learners": sorted(core.conf.learners),
        "followers": followers,
        # Where the nodes reach each other, for operators; clients use "client_addresses".
        "addresses": {
            str(n): f"{h}:{p}" for n, (h, p) in sorted({**node.transport.peers, config.node_id: config.listen}.items())
        },
        "client_addresses": {str(n): f"{h}:{p}" for n, (h, p) in sorted(config.client_addresses.items())},
        "failure": repr(node.failure) if node.failure else None,
        "clock": node.clock.status(),
        # A spare that cannot be filled costs speed, not safety (docs/storage.md): counted, not fatal.
        "metrics": {**node.metrics.as_dict(), "wal_spare_failures": spare.failures if spare is not None else 0},
    }


__all__ = ["node_status"]
