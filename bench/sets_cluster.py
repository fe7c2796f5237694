"""N sets of three node processes (and, for the service, a control set) on loopback, for the
benchmarks that run the store as several sets (docs/sets.md).

Owns: starting the sets under one cluster secret (a deployment's sets share it: one API and one
worker present it to every set), waiting for their leaders, the set table they form (epoch 1 =
every set, as `compensator run --sets N` writes it), a `SetsClient` over them with the real
routing by key, and each set's node CPU.

Must never: leave a node running after `stop_all` returned.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from compensator.config import LocalConfig
from queues import QueueClient, RaftClient, SetsClient
from queues.sets import table
from queues.sets.table import SetTable
from raft_store.testing.credentials import SECRET_NAME, cluster_auth
from raft_store.testing.hosts import ProcessHosts
from raft_store.testing.processes import ProcessCluster, cpu_seconds

MACHINE: Final = "queues.replicated:machine_factory"
CONTROL_SET_ID: Final = table.CONTROL_SET_ID
CONTROL_TICK_MS: Final = LocalConfig().control_tick_ms
"""The control set's nodes' tick, as `compensator run --sets N` starts them (the data sets': 30 ms)."""


def address_list(cluster: ProcessCluster) -> tuple[str, ...]:
    return tuple(f"{host}:{port}" for host, port in cluster.addresses())


@dataclass
class SetProcesses:
    """Sets 1..count (and the control set, id 0, with `control`), each a `ProcessCluster` in
    `root/set<k>` (`root/control`)."""

    root: Path
    count: int
    control: bool = False
    hosted: bool = True
    """Three host processes, host i running node i of every set (`raft-store host`, as `compensator run
    --sets N` deploys them); False: one process per node."""
    node_settings: dict[int, dict[str, object]] = field(default_factory=dict)
    """Hosted: a set's own node settings by set id (e.g. {0: {"tick_ms": 100}} for the control set)."""
    control_tick_ms: int = CONTROL_TICK_MS
    """The control set's tick, hosted or not (a `tick_ms` in `node_settings[0]` wins)."""
    clusters: dict[int, ProcessCluster] = field(default_factory=dict)
    hosts: ProcessHosts | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.auth = cluster_auth(self.root)  # one secret for every set, as a deployment has
        for set_id in ([CONTROL_SET_ID] if self.control else []) + list(range(1, self.count + 1)):
            folder = self.root / ("control" if set_id == CONTROL_SET_ID else f"set{set_id}")
            folder.mkdir()
            shutil.copy(self.root / SECRET_NAME, folder / SECRET_NAME)
            ticks = ["--tick-ms", str(self.control_tick_ms)] if set_id == CONTROL_SET_ID and not self.hosted else []
            self.clusters[set_id] = ProcessCluster(folder, machine=MACHINE, extra_args=ticks)
        if self.control:
            self.node_settings[CONTROL_SET_ID] = {"tick_ms": self.control_tick_ms, **self.node_settings.get(CONTROL_SET_ID, {})}

    @property
    def sets(self) -> dict[int, ProcessCluster]:
        """The data sets, without the control set."""
        return {k: c for k, c in sorted(self.clusters.items()) if k != CONTROL_SET_ID}

    @property
    def nodes(self) -> int:
        return sum(c.size for c in self.clusters.values())

    def start_all(self) -> None:
        if self.hosted:
            names = {k: "control set" if k == CONTROL_SET_ID else f"set {k}" for k in self.clusters}
            self.hosts = ProcessHosts(self.root / "hosts", {names[k]: c for k, c in self.clusters.items()}, machine=MACHINE,
                                      settings={names[k]: found for k, found in self.node_settings.items()})  # fmt: skip
            self.hosts.start_all()
            return
        for cluster in self.clusters.values():
            cluster.start_all()

    def stop_all(self) -> None:
        if self.hosts is not None:
            self.hosts.stop_all()
        for cluster in self.clusters.values():
            cluster.stop_all()

    def pids(self) -> list[int]:
        """The node processes' ids, each once (a host is node i of every set)."""
        return sorted({p.pid for c in self.clusters.values() for p in c.procs.values()})

    def total_cpu_seconds(self) -> float:
        """Every node process's CPU so far, each process once."""
        return cpu_seconds(p for c in self.clusters.values() for p in c.procs.values())

    async def wait_leaders(self, timeout_s: float = 60.0) -> None:
        for cluster in self.clusters.values():
            raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=60.0)
            try:
                await cluster.wait_leader(raft, timeout_s=timeout_s)
            finally:
                await raft.close()

    def table(self) -> SetTable:
        """Epoch 1 = every set, as `compensator run --sets N` and `sets init` write it."""
        return table.first_table({k: address_list(c) for k, c in self.sets.items()})

    def facade(self, *, attempt_timeout_s: float, deadline_s: float) -> SetsClient:
        """The store's facade over the sets with a fixed table (no control set read): intake is
        routed by key exactly as the API routes it."""

        def connect(set_id: int, _addresses: tuple[str, ...]) -> QueueClient:
            cluster = self.clusters[set_id]
            return QueueClient(RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=attempt_timeout_s,
                                          deadline_s=deadline_s))  # fmt: skip

        return SetsClient(self.table(), connect=connect)

    def cpu_seconds(self) -> dict[int, float]:
        """Each set's node CPU (user+system) so far, the control set's under 0: one process per node
        only (a host's CPU is every set's)."""
        assert not self.hosted, "hosted sets have no CPU of their own: total_cpu_seconds"
        return {k: c.cpu_seconds() for k, c in self.clusters.items()}
