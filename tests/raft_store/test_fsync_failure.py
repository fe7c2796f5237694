"""fsync returning EIO stops the node: never retried, never ignored (the "fsyncgate" lesson).

strace injects EIO into the node's fsync and fdatasync calls (the log syncs with fdatasync) after
the first few; the node must exit non-zero, and no command may be acknowledged after the failed
fsync. A restart on a healthy disk recovers everything that was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raft_store.client import ClientError, RaftClient
from raft_store.testing.credentials import SECRET_NAME, cluster_auth
from raft_store.testing.processes import free_ports

pytestmark = pytest.mark.slow


def strace() -> str:
    """strace, or a failure naming its package: a missing system package is a set-up error, not a skip."""
    found = shutil.which("strace")
    if found is None:
        pytest.fail("strace is needed to inject fsync failures: apt-get install strace"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    return found


def node_args(port: int, data: Path) -> list[str]:
    return [sys.executable, "-m", "raft_store", "run", "--id", "1", "--peer", f"1=127.0.0.1:{port}",
            "--data", str(data), "--machine", "kv", "--secret-file", str(data.parent / SECRET_NAME)]


async def test_fsync_eio_stops_the_node(tmp_path: Path) -> None:
    tracer = strace()
    (port,) = free_ports(1)
    data = tmp_path / "node1"
    auth = cluster_auth(tmp_path)
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [tracer, "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync,fdatasync",
         "-e", "inject=fsync,fdatasync:error=EIO:when=40+",
         *node_args(port, data)],
        stdout=log, stderr=log, start_new_session=True,  # killed as a group: strace's node with it
    )
    client = RaftClient([("127.0.0.1", port)], auth=auth, attempt_timeout_s=1.0, deadline_s=3.0)
    acked: list[int] = []
    try:
        for value in range(1, 10_000):
            try:
                await client.propose(json.dumps({"op": "append", "key": "k", "value": str(value)}).encode())
            except ClientError:
                break
            acked.append(value)
        returncode = proc.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # strace and the node it traces: killing
            os.killpg(proc.pid, signal.SIGKILL)  # strace alone left the node running after a failure
        proc.wait(10)
        await client.close()
        log.close()
    output = (tmp_path / "node.log").read_text()
    assert returncode != 0, output
    assert "FsyncFailed" in output or "fsync" in output.lower()
    assert 0 < len(acked) < 9_999
    # A healthy restart holds exactly what was acknowledged before the failure (and maybe
    # commands whose answer never came, but nothing acknowledged is missing).
    proc = subprocess.Popen(node_args(port, data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = RaftClient([("127.0.0.1", port)], auth=auth, deadline_s=20)
    try:
        answer, _ = await client.read(json.dumps({"key": "k"}).encode())
    finally:
        await client.close()
        proc.terminate()
        proc.wait(10)
    stored = [int(v) for v in (json.loads(answer)["value"] or "").split(",") if v]
    assert set(acked) <= set(stored)
    assert len(stored) == len(set(stored))
    await asyncio.sleep(0)
