"""A node's data (its queue store with LMDB's lock file and the checkpoint and clean-stop files beside
it, or a test machine's SQLite store with its -wal and -shm files, the Raft WAL, snapshots) holds
password hashes and unmasked payloads: directories 0700, files 0600, whatever the umask it was
started under, and what an older version left readable is tightened at start."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from queues import QueueClient, RaftClient
from queues.model import Enqueue
from raft_store.machines import KvMachine
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(tree: Path) -> dict[str, int]:
    """Every file's mode. A running node's transient files (a checkpoint's `.tmp`, renamed into
    place) may go between the listing and their stat: those are not there to be loose."""
    found = {".": stat.S_IMODE(tree.stat().st_mode)}
    for path in tree.rglob("*"):
        try:
            found[str(path.relative_to(tree))] = stat.S_IMODE(path.lstat().st_mode)
        except FileNotFoundError:
            continue
    return found


def assert_private(tree: Path, *expected: str) -> None:
    found = modes(tree)
    for name in expected:
        assert any(path == name or path.startswith(name) for path in found), (name, sorted(found))
    loose = {path: f"{mode:04o}" for path, mode in found.items()
             if mode != (0o700 if (tree / path).is_dir() else 0o600)}  # fmt: skip
    assert loose == {}, f"not private: {loose}"


async def test_an_embedded_node_makes_its_files_private_under_umask_022(tmp_path: Path, umask_022: None) -> None:
    """In a process that never set its umask (a node embedded in another program, as tests run
    it): the modes come from the code that creates each file."""
    data = tmp_path / "node1"
    data.mkdir(mode=0o755)
    (data / "left-by-an-older-version").write_text("readable")
    (port,) = free_ports(1)
    address = ("127.0.0.1", port)
    auth = cluster_auth(tmp_path)
    node = Node(NodeConfig(node_id=1, data_dir=data, listen=address, peers={1: address}, initial_voters=frozenset({1}),
                           tick_ms=10, election_ticks=5, snapshot_every_entries=20, auth=auth),
                KvMachine(data / "kv.sqlite"))  # fmt: skip
    await node.start()
    client = RaftClient([address], auth=auth, deadline_s=10)
    try:
        for i in range(60):
            await client.propose(f'{{"op": "put", "key": "k{i}", "value": "v"}}'.encode())
        for _ in range(200):
            if node.status()["snapshot_index"] > 0:
                break
            await asyncio.sleep(0.02)
        assert node.status()["snapshot_index"] > 0
        assert_private(data, "kv.sqlite", "kv.sqlite-wal", "kv.sqlite-shm", "wal", "snapshots")
    finally:
        await client.close()
        await node.stop()
        node.machine.close()
    assert_private(data, "kv.sqlite", "wal", "snapshots")


def test_a_node_process_started_under_umask_022_keeps_the_queue_store_private(tmp_path: Path, umask_022: None) -> None:
    data = tmp_path / "node1"
    auth = cluster_auth(tmp_path)
    (port,) = free_ports(1)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    node = subprocess.Popen(
        [sys.executable, "-m", "compensator", "node", "--id", "1", "--peer", f"1=127.0.0.1:{port}", "--data", str(data),
         "--secret-file", str(auth.secrets.path), "--snapshot-every", "20"],
        cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    async def write() -> None:
        queue = QueueClient(RaftClient([("127.0.0.1", port)], auth=auth, deadline_s=20))
        try:
            for i in range(40):
                await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key=f"k{i}", ref_key="r",
                                                  payload=b'{"payee": "6222 0000 1111 2222"}')])  # fmt: skip
        finally:
            await queue.raft.close()

    try:
        asyncio.run(write())
        assert_private(data, "queue.lmdb", "queue.lmdb-lock", "queue.lmdb-checkpoint", "wal", "snapshots")
    finally:
        node.terminate()
        node.wait(15)
    assert node.returncode == 0
    assert_private(data, "queue.lmdb", "queue.lmdb-clean", "wal", "snapshots")
