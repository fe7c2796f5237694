"""The replica audit: replicas fed the same log agree; one whose state diverged is named, with the
first event where it differs, whether it diverged by a different apply or by a corrupted store.

In process: three ReplicatedQueueMachines fed the same entries, read through QueueClient's real
read path (encoded queries, `query()` bytes). The real cluster version (processes, a store edited
while its node was down) is in test_replicated.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from local_reads import LocalReads
from queue_node import tamper

from queues import codec
from queues import query_codec as qc
from queues.audit import ReplicaAuditor
from queues.client import QueueClient
from queues.core import reads as queries
from queues.core.keys import u64
from queues.core.port import Table
from queues.core.records import encode, event_decoder
from queues.machine import QueueConfig
from queues.model import Ack, BatchResult, Enqueue, Lease, LeaseResult, Purge, QueueCommand, Redrive
from queues.replicated import ReplicatedQueueMachine
from raft_store.state_machine import Command
from raft_store.testing.credentials import cluster_auth

T0 = 1_700_000_000_000


class Replicas:
    def __init__(self, count: int = 3, config: QueueConfig | None = None) -> None:
        self.machines = {f"n{i}": ReplicatedQueueMachine(":memory:", config, clock_ms=lambda: T0) for i in range(1, count + 1)}
        self.index = 0
        self.now_ms = T0

    def apply(self, commands: list[QueueCommand], only: tuple[str, ...] = ()) -> list[bytes]:
        self.index += 1
        data = [Command(0, 0, codec.encode_command(c)) for c in commands]
        results = [
            machine.apply_batch(self.index, self.now_ms, data)
            for name, machine in self.machines.items()
            if not only or name in only
        ]
        return results[0]

    def clients(self) -> dict[str, QueueClient]:
        return {name: QueueClient(LocalReads(m), coalesce=False) for name, m in self.machines.items()}  # type: ignore[arg-type]

    def traffic(self, count: int, prefix: str = "k") -> None:
        self.apply([Enqueue(kind="transfer", idempotency_key=f"{prefix}{i}", ref_key="r", payload=b"p") for i in range(count)])
        self.now_ms += 1
        lease = codec.decode_result(self.apply([Lease(worker_id="w", count_max=count, lease_ms=60_000)])[0])
        assert isinstance(lease, LeaseResult)
        self.apply([Ack(message_id=g.message_id, token=g.token) for g in lease.grants[: count // 2]])


def test_replicas_fed_the_same_log_agree_and_the_cursor_follows_the_log() -> None:
    replicas = Replicas()
    replicas.traffic(50)
    auditor = ReplicaAuditor(replicas.clients(), chunk=16)
    assert asyncio.run(auditor.audit_once()) is None
    last = queries.last_event_seq(replicas.machines["n1"].view)
    assert last == 125  # 50 enqueued, 50 leased, 25 succeeded
    assert (auditor.stats.audited_through, auditor.stats.events_compared) == (last, last)
    replicas.traffic(10, prefix="more")
    assert asyncio.run(auditor.audit_once()) is None
    assert auditor.stats.audited_through == last + 25 and auditor.stats.divergences == 0


def test_a_replica_that_applied_differently_is_named_at_its_first_differing_event() -> None:
    replicas = Replicas()
    replicas.traffic(40)
    # n3 applies one enqueue the others never saw (as a replica on other code might), then the
    # same log again: every event after it differs in seq, and the first is the one to report.
    replicas.apply([Enqueue(kind="transfer", idempotency_key="only-n3", ref_key="r", payload=b"x")], only=("n3",))
    replicas.index -= 1
    replicas.apply([Enqueue(kind="transfer", idempotency_key="every", ref_key="r", payload=b"x")], only=("n1", "n2"))
    replicas.traffic(30, prefix="after")
    auditor = ReplicaAuditor(replicas.clients(), chunk=64)
    found = asyncio.run(auditor.audit_once())
    assert found is not None
    assert (found.seq, found.agree, found.differ) == (101, ("n1", "n2"), ("n3",))
    assert found.events["n1"] is not None and found.events["n1"].data["idempotency_key"] == "every"
    assert found.events["n3"] is not None and found.events["n3"].data["idempotency_key"] == "only-n3"
    assert "replica n3 diverged from n1,n2 at event seq 101" in found.describe()
    assert auditor.stats.audited_through == 64  # the first chunk agreed; the cursor stays before the divergence
    assert asyncio.run(auditor.audit_once()) == found and auditor.stats.divergences == 1  # found again, counted once


def test_a_corrupted_event_on_one_replica_is_found_by_bisection() -> None:
    replicas = Replicas()
    replicas.traffic(200)
    n2 = replicas.machines["n2"]
    row = event_decoder.decode(n2.view.get(Table.EVENTS, u64(377)) or b"")
    tamper(n2, Table.EVENTS, u64(377), encode(msgspec.structs.replace(row, ts_ms=row.ts_ms + 1)))
    found = asyncio.run(ReplicaAuditor(replicas.clients(), chunk=qc.EVENTS_LIMIT_MAX).audit_once())
    assert found is not None and (found.seq, found.agree, found.differ) == (377, ("n1", "n3"), ("n2",))
    # with two replicas there is no majority: both are named
    two = {name: c for name, c in replicas.clients().items() if name != "n3"}
    found = asyncio.run(ReplicaAuditor(two).audit_once())
    assert found is not None and (found.seq, found.agree, found.differ) == (377, (), ("n1", "n2"))
    assert "no majority" in found.describe()


def test_events_purged_before_the_audit_reached_them_are_skipped_and_counted() -> None:
    replicas = Replicas(config=QueueConfig(event_retention_ms=1000))
    replicas.traffic(20)  # events 1-50
    replicas.now_ms += 1000
    replicas.traffic(4, prefix="late")  # events 51-60, kept
    replicas.apply([Purge()])
    auditor = ReplicaAuditor(replicas.clients())
    assert asyncio.run(auditor.audit_once()) is None
    assert (auditor.stats.skipped_purged, auditor.stats.events_compared, auditor.stats.audited_through) == (50, 10, 60)


def test_the_digest_query_covers_a_range_and_reports_the_bounds() -> None:
    replicas = Replicas(count=1)
    replicas.traffic(10)  # events 1-25
    reads = QueueClient(LocalReads(replicas.machines["n1"]))  # type: ignore[arg-type]
    bounds = asyncio.run(reads.events_digest(0, 0)).value
    assert (bounds.first_seq, bounds.last_seq, bounds.through, bounds.count) == (1, 25, 0, 0)
    whole = asyncio.run(reads.events_digest(0)).value
    assert (whole.through, whole.count, len(whole.digest)) == (25, 25, 16)
    part = asyncio.run(reads.events_digest(20, 100)).value
    assert (part.through, part.count) == (25, 5) and part.digest != whole.digest
    assert asyncio.run(reads.events_digest(30, 5)).value.through == 30  # past the end: empty
    with pytest.raises(ValueError):
        ReplicaAuditor({"only": reads})


def test_cli_refuses_bad_input_with_one_line_and_a_nonzero_exit() -> None:
    for args, message in (
        (["--addresses", "127.0.0.1:1"], "at least two replicas"),
        (["--addresses", "nohost,127.0.0.1:2"], "not host:port"),
        (["--addresses", "127.0.0.1:1,127.0.0.1:2", "--every-s", "0"], "--every-s must be positive"),
    ):
        done = subprocess.run([sys.executable, "-m", "queues.audit", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1], done.stderr


def test_cli_with_no_replica_answering_says_so_and_exits_2(tmp_path: Path) -> None:
    secret = ["--secret-file", str(cluster_auth(tmp_path).secrets.path)]
    done = subprocess.run(
        [sys.executable, "-m", "queues.audit", "--addresses", "127.0.0.1:9,127.0.0.1:10", "--once", *secret],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["unreachable"] == 1
    assert done.stderr.strip().splitlines()[-1] == "queues.audit: fewer than two replicas answered; nothing was compared"


def test_a_corrupted_payload_is_found_by_the_scrub_on_the_replica_that_stores_it() -> None:
    replicas = Replicas()
    replicas.traffic(30)
    tamper(replicas.machines["n3"], Table.BODIES, u64(7), b"q")  # p -> q
    tamper(replicas.machines["n1"], Table.BODIES, u64(21), None)
    auditor = ReplicaAuditor(replicas.clients(), scrub_chunk=10)
    assert asyncio.run(auditor.audit_once()) is None  # events agree: only the scrub can see this
    assert auditor.corrupt == {"n3": {7}} and auditor.stats.payloads_scrubbed == 30
    asyncio.run(auditor.audit_once())
    asyncio.run(auditor.audit_once())
    assert auditor.corrupt == {"n3": {7}, "n1": {21}}
    assert (auditor.stats.corrupt_payloads, auditor.stats.scrub_passes) == (2, 3)
    tamper(replicas.machines["n3"], Table.BODIES, u64(7), b"p")  # repaired
    asyncio.run(auditor.scrub_all())
    assert auditor.corrupt == {"n1": {21}} and auditor.stats.corrupt_payloads == 2  # each reported once
    read = asyncio.run(replicas.clients()["n1"].scrub_payloads(20, 5)).value
    assert (read.through, read.last_id, read.checked, read.corrupt) == (25, 30, 5, (21,))


def test_an_edited_payload_is_scrubbed_against_the_hash_stored_with_the_edit() -> None:
    replicas = Replicas()
    replicas.traffic(6)  # messages 1-3 acked, 4-6 leased
    replicas.now_ms += 60_000  # past the leases: 4-6 are due again
    redriven = codec.decode_result(
        replicas.apply([Redrive(actor="finance", reason="fix amount", ids=(5,), payload=b"corrected")])[0]
    )
    assert isinstance(redriven, BatchResult) and redriven.ids == (5,)
    auditor = ReplicaAuditor(replicas.clients())
    asyncio.run(auditor.scrub_all())
    assert auditor.corrupt == {} and auditor.stats.payloads_scrubbed == 18
    tamper(replicas.machines["n2"], Table.EDITED, u64(5), b"\x00")
    asyncio.run(auditor.scrub_all())
    assert auditor.corrupt == {"n2": {5}}
