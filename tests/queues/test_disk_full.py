"""A full disk stops a queue node with a last line that says so and what to do, commits nothing on
the way out, and a restart on the same files (with space again) holds every acknowledged request.

The node's data directory is a 4 MiB tmpfs mounted in a mount namespace of its own (`unshare`), so
the disk really fills; when the node has exited, the namespace's shell copies the files out and
the node is started again on the copy, on a disk with room. Where this machine allows no mount
namespace, strace makes the node's fsyncs fail with ENOSPC instead (as a thin-provisioned or
network volume does), and the node is started again on the same files.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from queues.client import QueueClient
from queues.model import Code
from raft_store.auth import StoreAuth
from raft_store.client import ClientError, RaftClient
from raft_store.testing.credentials import SECRET_NAME, cluster_auth
from raft_store.testing.processes import free_ports

pytestmark = pytest.mark.slow

PAYLOAD = os.urandom(48 << 10)
MOUNT = 'd="$1"; o="$2"; shift 2; mount -t tmpfs -o size=4m none "$d" || exit 97; "$@"; rc=$?; cp -a "$d"/. "$o"/; exit $rc'
"""Mount a small tmpfs over the data directory, run the node, copy its files out, exit as it did."""


def node_command(port: int, data: Path, secret: Path) -> list[str]:
    return [sys.executable, "-m", "compensator", "node", "--id", "1", "--peer", f"1=127.0.0.1:{port}",
            "--data", str(data), "--secret-file", str(secret)]  # fmt: skip


def unshare_works(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m none {tmp_path}"],
                           capture_output=True, check=False)  # fmt: skip
    return probe.returncode == 0


def filling(tmp_path: Path, port: int) -> tuple[list[str], Path]:
    """The command of a node whose disk fills, and where its files are once it has stopped."""
    mount, saved, secret = tmp_path / "mount", tmp_path / "saved", tmp_path / SECRET_NAME
    mount.mkdir()
    saved.mkdir()
    if unshare_works(mount):
        return ["unshare", "-Urm", "sh", "-c", MOUNT, "sh", str(mount), str(saved), *node_command(port, mount / "node1", secret)], saved / "node1"
    tracer = shutil.which("strace")
    if tracer is None:
        pytest.fail("no mount namespace here, and strace is needed to fill the disk instead: apt-get install strace"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    inject = ["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e", "inject=fsync,fdatasync:error=ENOSPC:when=30+"]
    return [tracer, *inject, *node_command(port, saved / "node1", secret)], saved / "node1"


async def fill(port: int, node: subprocess.Popen[bytes], auth: StoreAuth) -> list[str]:
    """Enqueue until the node has stopped; the keys it acknowledged (an enqueue without an answer
    from a node still running, slow on a loaded machine, is not counted and the next one goes on)."""
    raft = RaftClient([("127.0.0.1", port)], auth=auth, attempt_timeout_s=1.0, deadline_s=3.0)
    queue = QueueClient(raft)
    acked: list[str] = []
    try:
        for number in range(2000):
            key = f"full-{number}"
            try:
                result = await queue.enqueue("transfer", idempotency_key=key, ref_key="packet", payload=PAYLOAD)
            except ClientError:
                if node.poll() is not None:
                    break
                continue
            assert result.code is Code.OK
            acked.append(key)
    finally:
        await raft.close()
    return acked


async def test_a_full_disk_stops_the_node_with_the_reason_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    auth = cluster_auth(tmp_path)
    command, data = filling(tmp_path, port)
    stderr_path = tmp_path / "node.err"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        try:
            acked = await fill(port, proc, auth)
            returncode = await asyncio.to_thread(proc.wait, 60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = stderr_path.read_text()
    lines = [line for line in output.splitlines() if line.strip()]
    assert returncode == 1, output[-3000:]
    assert lines[-1].startswith("node 1 stopped: the disk is full ("), lines[-1]
    assert "Free space on the file system holding" in lines[-1] and "then start the node again" in lines[-1]
    assert "cannot commit" not in output, output[-3000:]
    assert 5 < len(acked) < 2000, (len(acked), output[-3000:])

    # Space again (the copy is on the test's own disk): every acknowledged request is there.
    with open(tmp_path / "restarted.err", "wb") as stderr:
        restarted = subprocess.Popen(node_command(port, data, tmp_path / SECRET_NAME), stdout=subprocess.DEVNULL, stderr=stderr)
    raft = RaftClient([("127.0.0.1", port)], auth=auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        found = (await QueueClient(raft).by_idempotency_keys(acked)).value
    except ClientError as error:
        raise AssertionError(f"the restarted node did not answer: {(tmp_path / 'restarted.err').read_text()}") from error
    finally:
        await raft.close()
        restarted.terminate()
        restarted.wait(10)
    assert sorted(view.idempotency_key for view in found) == sorted(acked)
