"""bench.e2e's store: one set of three node processes, as `make run` has, or (`--sets N`) a control
set and N sets, as `compensator run --sets N` has, and everything the run reads from it.

Owns: starting the nodes and the set table (epoch 1 = every set, written in the control set before
any worker starts: a worker reads it once, docs/sets.md), the producer token, quota and retry
policy in every set (they are per set until the operator commands fan out, docs/sets.md), the
COMPENSATOR_STORE__ settings each child is given, and the reads that span the sets: counts summed,
the leaders' progress summed, message views read from the set each request id names, and each
set's event log for the projector's catch-up.

Must never: read one set and report it as the store's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench.harness import MACHINE, BenchError, create_producer, leader_progress
from bench.sets_cluster import SetProcesses, address_list
from delay.policy import RetryPolicy
from ledger.kinds import Kind
from ledger.request_ids import RequestId
from queues import Code, ControlSet, MessageView, QueueClient, RaftClient
from queues.query_codec import IDS_PER_QUERY_MAX
from raft_store.testing.processes import ProcessCluster

CONTROL_ENV: Final = "COMPENSATOR_STORE__CONTROL_ADDRESSES"


@dataclass
class RunStore:
    """The nodes of one run (see the module docstring). `sets` 1: one `ProcessCluster` in
    `root/store`, exactly as before; more: `SetProcesses` with a control set under `root/store`."""

    root: Path
    sets: int = 1
    hosted: bool = True
    """More than one set: three hosts of every set's nodes (False: one process per node)."""
    clusters: dict[int, ProcessCluster] = field(default_factory=dict)
    """The data sets by id (not the control set)."""
    processes: SetProcesses | None = None

    def start(self) -> None:
        if self.sets == 1:
            self.clusters[1] = ProcessCluster(self.root / "store", machine=MACHINE)
        else:
            self.processes = SetProcesses(self.root / "store", self.sets, control=True, hosted=self.hosted)
            self.clusters.update(self.processes.sets)
            self.processes.start_all()
            return
        self.clusters[1].start_all()

    def stop_all(self) -> None:
        if self.processes is not None:
            self.processes.stop_all()
        for cluster in self.clusters.values():
            cluster.stop_all()

    def all_clusters(self) -> list[ProcessCluster]:
        return list(self.processes.clusters.values()) if self.processes is not None else list(self.clusters.values())

    @property
    def home(self) -> ProcessCluster:
        """Set 1: `store.addresses` of every child (its home set; tokens and users live in the control
        set with several sets, docs/sets.md)."""
        return self.clusters[1]

    def settings(self, set_id: int = 1) -> dict[str, str]:
        """A child's COMPENSATOR_STORE__ settings: set `set_id` as its own, and the control set."""
        found = self.clusters[set_id].service_settings()
        if self.processes is not None:
            found.update(self.control_settings(), COMPENSATOR_STORE__SET_ID=str(set_id))
        return found

    def control_settings(self) -> dict[str, str]:
        """The control set's addresses (none with one set): with them, a child routes over every set."""
        if self.processes is None:
            return {}
        return {CONTROL_ENV: ",".join(address_list(self.processes.clusters[0]))}

    def node_cpu_s(self) -> float:
        """Every node's CPU so far, the control set's included."""
        if self.processes is not None:
            return self.processes.total_cpu_seconds()
        return self.clusters[1].cpu_seconds()

    def idle_node_cores(self, seconds: float = 3.0) -> float:
        """Cores the nodes keep busy with no request in flight (heartbeats, the workers' long polls
        on every set, the API's reads): the standing cost each set adds, whatever the load."""
        before, started = self.node_cpu_s(), time.monotonic()
        time.sleep(seconds)
        return round((self.node_cpu_s() - before) / (time.monotonic() - started), 3)

    def client(self, set_id: int, *, deadline_s: float = 60.0) -> QueueClient:
        cluster = self.clusters[set_id]
        return QueueClient(RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0,
                                      deadline_s=deadline_s))  # fmt: skip

    async def configure(self, token: str, policy: RetryPolicy, *, reason: str) -> None:
        """The table (more than one set), then in every set the producer and the retry policy."""
        if self.processes is not None:
            await self.processes.wait_leaders()
            control_cluster = self.processes.clusters[0]
            control = ControlSet(QueueClient(RaftClient(control_cluster.addresses(), auth=control_cluster.auth,
                                                        attempt_timeout_s=10.0, deadline_s=60.0)))  # fmt: skip
            try:
                _, version = await control.read()
                await control.write(self.processes.table(), expected_version=version, actor="bench", reason=reason)
            finally:
                await control.queue.raft.close()
            await create_producer(control_cluster, token, reason=reason)  # tokens live there (store.access_client)
        for set_id, cluster in sorted(self.clusters.items()):
            await create_producer(cluster, token, reason=reason)
            queue = self.client(set_id)
            try:
                for kind in Kind:
                    result = await queue.set_policy(kind.value, policy, actor="bench", reason=reason)
                    if result.code is not Code.OK:
                        raise BenchError(f"could not set the retry policy of {kind.value} in set {set_id}: {result.code.name}")
            finally:
                await queue.raft.close()

    def reader(self) -> StoreReader:
        return StoreReader({set_id: self.client(set_id) for set_id in self.clusters})


@dataclass
class StoreReader:
    """One client per set, for the reads of the measured window and after it."""

    clients: dict[int, QueueClient]

    async def close(self) -> None:
        for queue in self.clients.values():
            await queue.raft.close()

    async def counts(self) -> dict[tuple[str, str], int]:
        """Requests per (kind, state), summed over the sets."""
        total: dict[tuple[str, str], int] = {}
        for read in await asyncio.gather(*(queue.counts() for queue in self.clients.values())):
            for key, count in read.value.items():
                total[key] = total.get(key, 0) + count
        return total

    async def leader_progress(self) -> dict[int, dict[str, float]]:
        """`leader_progress` of each set's leader (entries, commands, fsyncs, stale reads), by set;
        `summed` adds them up."""
        found = await asyncio.gather(*(leader_progress(queue) for queue in self.clients.values()))
        return dict(zip(self.clients, found, strict=True))

    async def views(self, ids: Iterable[RequestId]) -> dict[RequestId, MessageView]:
        """Each request's view (with its attempts), read from the set its id names."""
        by_set: dict[int, list[int]] = {}
        for request in ids:
            by_set.setdefault(request.set_id, []).append(request.message_id)
        found: dict[RequestId, MessageView] = {}
        for set_id, message_ids in sorted(by_set.items()):
            if set_id not in self.clients:
                raise BenchError(f"the API answered an id of set {set_id}, which this run did not start")
            message_ids.sort()
            for start in range(0, len(message_ids), IDS_PER_QUERY_MAX):
                chunk = message_ids[start : start + IDS_PER_QUERY_MAX]
                read = await self.clients[set_id].get_many(chunk, with_history=True)
                found.update((RequestId(set_id, view.message_id), view) for view in read.value)
        return found

    async def last_events(self) -> dict[int, int]:
        """Each set's last event sequence number (what its projector must reach)."""
        return {set_id: (await queue.events_digest(0, 0)).value.last_seq for set_id, queue in self.clients.items()}


def summed(by_set: dict[int, dict[str, float]]) -> dict[str, float]:
    """The sets' leaders' progress added up."""
    total: dict[str, float] = {}
    for found in by_set.values():
        for name, value in found.items():
            total[name] = total.get(name, 0.0) + value
    return total


def progress_between(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]]
) -> dict[int, dict[str, float]]:
    """Each set's leader's progress from `before` to `after` (`StoreReader.leader_progress`)."""
    return {set_id: {name: now[name] - before.get(set_id, {}).get(name, 0.0) for name in now} for set_id, now in after.items()}
