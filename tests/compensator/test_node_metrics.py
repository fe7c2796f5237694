"""A store node's /metrics, from a real node process: Raft role and indexes, fsync batching and the
queue's depth by kind and state, in the Prometheus text format an alert rule reads."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queues import AuthenticationFailed, QueueClient, RaftClient, StoreAuth
from queues.model import Enqueue
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


async def _enqueue(port: int, auth: StoreAuth, stranger: StoreAuth) -> None:
    queue = QueueClient(RaftClient([("127.0.0.1", port)], auth=auth, deadline_s=10))
    try:
        await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key=f"k{i}", ref_key=f"r{i}", payload=b"p")
                                  for i in range(5)])  # fmt: skip
    finally:
        await queue.raft.close()
    outsider = QueueClient(RaftClient([("127.0.0.1", port)], auth=stranger, deadline_s=10))
    try:
        with pytest.raises(AuthenticationFailed):
            await outsider.enqueue_many([Enqueue(kind="transfer", idempotency_key="x", ref_key="x", payload=b"p")])
    finally:
        await outsider.raft.close()


def test_a_node_serves_its_raft_and_queue_metrics(tmp_path: Path) -> None:
    port, metrics_port = free_ports(2)
    auth = cluster_auth(tmp_path)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    node = subprocess.Popen(
        [sys.executable, "-m", "compensator", "node", "--id", "1", "--peer", f"1=127.0.0.1:{port}",
         "--data", str(tmp_path / "node1"), "--metrics-address", f"127.0.0.1:{metrics_port}",
         "--secret-file", str(auth.secrets.path)],
        cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                first = samples(httpx.get(url).text)
                if first.get(("compensator_raft_is_leader", (("node", "1"),))) == 1:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and node.poll() is None, node.stderr
            time.sleep(0.05)
        asyncio.run(_enqueue(port, auth, cluster_auth(tmp_path, name="stranger.secret")))
        answer = httpx.get(url)
        other = httpx.get(f"http://127.0.0.1:{metrics_port}/")
    finally:
        node.terminate()
        node.wait(15)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert other.status_code == 404
    found = samples(answer.text)
    node_label = (("node", "1"),)
    assert found[("compensator_queue_depth", (("kind", "transfer"), ("node", "1"), ("state", "ready")))] == 5
    assert found[("compensator_raft_commit_index", node_label)] == found[("compensator_raft_applied_index", node_label)] > 0
    assert found[("compensator_raft_term", node_label)] >= 1
    assert found[("compensator_raft_unapplied_bytes", node_label)] == 0  # everything committed is applied
    assert found[("compensator_raft_apply_background", node_label)] == 0  # a leader applies at normal priority
    assert found[("compensator_raft_fsyncs_total", node_label)] >= 1
    assert found[("compensator_raft_fsync_batch_entries_count", node_label)] == found[("compensator_raft_fsyncs_total", node_label)]
    assert found[("compensator_raft_wal_spare_failures_total", node_label)] == 0  # the next segment was zero-filled
    assert ("compensator_queue_oldest_due_age_seconds", (("kind", "transfer"), ("node", "1"))) in found
    assert found[("compensator_raft_connections_refused_total", (("node", "1"), ("reason", "unknown_secret")))] == 1
    assert node.returncode == 0
