"""Operator commands against real processes: add a learner, promote it, transfer, remove."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raft_store", *args], capture_output=True, text=True, timeout=60)


async def wait_for(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await predicate():
                return
        except OSError:
            pass  # the node is still starting
        await asyncio.sleep(0.2)
    raise AssertionError("condition not reached in time")


async def test_learner_promotion_transfer_and_removal(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, size=4, machine="kv", extra_args=["--snapshot-every", "50"])
    # The operator's commands list nodes 1-3 only; they reach node 4 when it leads because the
    # nodes advertise client addresses (clients never use peer addresses).
    cluster.extra_args += cluster.client_address_args()
    cluster.root.mkdir(parents=True, exist_ok=True)
    for node in (1, 2, 3):
        cluster.start(node, "--voters", "1,2,3")
    client = RaftClient(cluster.addresses()[:3], auth=cluster.auth, deadline_s=20)
    try:
        leader = await cluster.wait_leader(client)
        for i in range(200):  # enough history that the newcomer needs a snapshot
            await client.propose(json.dumps({"op": "put", "key": f"k{i}", "value": str(i)}).encode())
        cluster.start(4, "--join")
        addresses = ",".join(f"{h}:{p}" for h, p in cluster.addresses()[:3])
        host, port = cluster.address(4)
        result = cli("add-learner", *cluster.auth_args(), "--addresses", addresses, "--node", "4", "--address", f"{host}:{port}")
        assert result.returncode == 0, result.stderr

        async def learner_caught_up() -> bool:
            status = await client.status(cluster.address(4))
            return bool(status["applied"] >= 200 and 4 in status["learners"])

        await wait_for(learner_caught_up)
        # The SQLite machine compacts by checkpoints (no copy of the store); the newcomer's snapshot
        # file was written on demand, and it installed it rather than replaying from index 1.
        leader_status = await client.status(cluster.address(leader))
        assert leader_status["metrics"]["checkpoints"] >= 1
        assert leader_status["metrics"]["snapshots"] >= 1
        assert (await client.status(cluster.address(4)))["snapshot_index"] > 0
        assert cli("add-voter", *cluster.auth_args(), "--addresses", addresses, "--node", "4").returncode == 0

        async def four_voters() -> bool:
            status = await client.status(cluster.address(leader))
            return bool(status["voters"] == [1, 2, 3, 4])

        await wait_for(four_voters)
        assert cli("transfer", *cluster.auth_args(), "--addresses", addresses, "--node", "4").returncode == 0

        async def node4_leads() -> bool:
            return (await client.status(cluster.address(4)))["role"] == "leader"

        await wait_for(node4_leads)
        assert cli("remove", *cluster.auth_args(), "--addresses", addresses, "--node", str(leader)).returncode == 0

        async def removed() -> bool:
            status = await client.status(cluster.address(4))
            return leader not in status["voters"]

        await wait_for(removed)
        answer, _ = await client.read(json.dumps({"key": "k199"}).encode())
        assert json.loads(answer)["value"] == "199"
        status = cli("status", *cluster.auth_args(), "--addresses", addresses + f",{host}:{port}")
        assert status.returncode == 0 and '"role": "leader"' in status.stdout
    finally:
        await client.close()
        cluster.stop_all()
