"""Real node processes on loopback under kill -9, SIGSTOP/SIGCONT and whole-cluster power loss.

The nodes run in the storage mode that holds writes in process memory until fsync, so a kill -9
loses exactly what was not fsynced: the acknowledgement contract (a majority fsynced it) is
what keeps every acknowledged append alive.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest

from raft_store.client import ClientError, RaftClient
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow


class Appender:
    """Workers appending unique values to their own key; records what was acknowledged."""

    def __init__(self, client: RaftClient, workers: int) -> None:
        self.client = client
        self.acked: dict[int, list[int]] = {w: [] for w in range(workers)}
        self.unknown: dict[int, set[int]] = {w: set() for w in range(workers)}
        self.stop = False
        self.ack_times: list[tuple[float, tuple[str, int] | None]] = []
        self._tasks = [asyncio.get_running_loop().create_task(self._run(w)) for w in range(workers)]

    async def _run(self, worker: int) -> None:
        value = 0
        while not self.stop:
            value += 1
            command = json.dumps({"op": "append", "key": f"w{worker}", "value": str(value)}).encode()
            try:
                await self.client.propose(command)
            except ClientError:
                self.unknown[worker].add(value)  # outcome in doubt: may or may not be applied
                continue
            self.acked[worker].append(value)
            self.ack_times.append((time.perf_counter(), self.client._leader))

    async def finish(self) -> None:
        self.stop = True
        await asyncio.gather(*self._tasks)

    async def verify(self, client: RaftClient) -> dict[str, int]:
        lost = duplicated = unexpected = recovered = 0
        for worker, values in self.acked.items():
            answer, _ = await client.read(json.dumps({"key": f"w{worker}"}).encode())
            stored = json.loads(answer)["value"] or ""
            applied = [int(v) for v in stored.split(",") if v]
            lost += len(set(values) - set(applied))
            duplicated += len(applied) - len(set(applied))
            extra = set(applied) - set(values)
            recovered += len(extra & self.unknown[worker])
            unexpected += len(extra - self.unknown[worker])
        return {"lost": lost, "duplicated": duplicated, "unexpected": unexpected, "recovered": recovered,
                "acked": sum(len(v) for v in self.acked.values())}


async def _converged(cluster: ProcessCluster, client: RaftClient, timeout_s: float = 20) -> dict[int, int]:
    deadline = time.monotonic() + timeout_s
    applied: dict[int, int] = {}
    while time.monotonic() < deadline:
        statuses = await cluster.statuses(client)
        applied = {node: int(s["applied"]) for node, s in statuses.items()}  # type: ignore[call-overload]
        if len(applied) == cluster.size and len(set(applied.values())) == 1:
            return applied
        await asyncio.sleep(0.2)
    raise AssertionError(f"nodes did not converge: {applied}")


@pytest.fixture
def cluster(tmp_path: Path):
    c = ProcessCluster(tmp_path, machine="kv", extra_args=["--volatile", "--snapshot-every", "200"])
    c.start_all()
    yield c
    c.stop_all()


async def test_kill_leader_under_load_loses_nothing(cluster: ProcessCluster) -> None:
    client = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20)
    leader = await cluster.wait_leader(client)
    load = Appender(client, workers=8)
    await asyncio.sleep(2.0)
    killed_at = time.perf_counter()
    cluster.kill(leader, signal.SIGKILL)
    await asyncio.sleep(2.5)
    cluster.start(leader)
    await asyncio.sleep(1.5)
    await load.finish()
    outcome = await load.verify(client)
    new_commits = [t for t, address in load.ack_times if t > killed_at and address != cluster.address(leader)]
    failover_ms = 1000 * (min(new_commits) - killed_at) if new_commits else None
    print(f"\nkill -9 leader: {outcome}, first commit by the new leader after {failover_ms} ms")
    assert outcome["lost"] == 0 and outcome["duplicated"] == 0 and outcome["unexpected"] == 0
    assert outcome["acked"] > 100
    assert failover_ms is not None and failover_ms < 5000
    await _converged(cluster, client)
    await client.close()


async def test_paused_node_past_election_timeout(cluster: ProcessCluster) -> None:
    client = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20)
    leader = await cluster.wait_leader(client)
    load = Appender(client, workers=4)
    await asyncio.sleep(1.0)
    cluster.pause(leader)  # the leader freezes, a new one is elected, then the old one wakes up
    await asyncio.sleep(1.5)
    cluster.resume(leader)
    follower = next(n for n in cluster.ids if n != leader)
    cluster.pause(follower)
    await asyncio.sleep(1.5)
    cluster.resume(follower)
    await asyncio.sleep(1.0)
    await load.finish()
    outcome = await load.verify(client)
    print(f"\nSIGSTOP/SIGCONT leader then follower: {outcome}")
    assert outcome["lost"] == 0 and outcome["duplicated"] == 0 and outcome["unexpected"] == 0
    statuses = await cluster.statuses(client)
    leaders = [n for n, s in statuses.items() if s["role"] == "leader"]
    assert len(leaders) == 1
    await _converged(cluster, client)
    await client.close()


async def test_whole_cluster_power_loss(cluster: ProcessCluster) -> None:
    """kill -9 of all three at once drops every un-fsynced write; acknowledged ones survive."""
    client = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20)
    await cluster.wait_leader(client)
    load = Appender(client, workers=8)
    await asyncio.sleep(2.0)
    for node in cluster.ids:
        cluster.kill(node, signal.SIGKILL)
    for node in cluster.ids:
        cluster.start(node)
    # In-flight requests are retried with their session numbers: applied at most once.
    await load.finish()
    await cluster.wait_leader(client)
    outcome = await load.verify(client)
    print(f"\npower loss of all nodes: {outcome}")
    assert outcome["lost"] == 0 and outcome["duplicated"] == 0 and outcome["unexpected"] == 0
    assert outcome["acked"] > 100
    await _converged(cluster, client)
    await client.close()


async def test_concurrent_linearizable_reads_see_every_acknowledged_write(cluster: ProcessCluster) -> None:
    """Reads that arrive together share one ReadIndex round; each still sees every write
    acknowledged before it was sent, on the leader and through followers."""
    client = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=20)
    await cluster.wait_leader(client)
    for round_ in range(5):
        await client.propose(json.dumps({"op": "put", "key": "x", "value": str(round_)}).encode())
        answers = await asyncio.gather(*[client.read(json.dumps({"key": "x"}).encode()) for _ in range(500)])
        assert {json.loads(answer)["value"] for answer, _ in answers} == {str(round_)}
    for node in cluster.ids:
        follower = RaftClient([cluster.address(node)], auth=cluster.auth, deadline_s=20)
        answer, _ = await follower.read(json.dumps({"key": "x"}).encode())
        assert json.loads(answer)["value"] == "4"
        await follower.close()
    await client.close()


async def test_a_client_given_one_follower_reaches_the_leader_by_advertised_client_addresses(tmp_path: Path) -> None:
    """Peers talk on 127.0.0.1 and clients are told "localhost": each address names the same
    listener through a different route, so the client's connections show which map it used."""
    cluster = ProcessCluster(tmp_path, machine="kv")
    cluster.extra_args += cluster.client_address_args("localhost")
    cluster.start_all()
    operator = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=20)
    try:
        leader = await cluster.wait_leader(operator)
        status = await operator.status(cluster.address(leader))
        assert status["client_addresses"] == {str(n): f"localhost:{cluster.address(n)[1]}" for n in cluster.ids}
        assert status["addresses"] == {str(n): f"127.0.0.1:{cluster.address(n)[1]}" for n in cluster.ids}
        follower = next(node for node in cluster.ids if node != leader)
        client = RaftClient([("localhost", cluster.address(follower)[1])], auth=cluster.auth, deadline_s=20)
        try:
            await client.propose(json.dumps({"op": "put", "key": "k", "value": "v"}).encode())
            answer, _ = await client.read(json.dumps({"key": "k"}).encode())
            assert json.loads(answer)["value"] == "v"
            assert client.redirects >= 1
            assert {host for host, _ in client._conns} == {"localhost"}, client._conns.keys()
        finally:
            await client.close()
    finally:
        await operator.close()
        cluster.stop_all()
