"""The queue on a real 3-process Raft cluster, through QueueClient: lifecycle, queries, follower
reads, the expiry driver, enqueue under kill -9 of the leader, and fencing across a leader change.

The nodes run `--machine queues.replicated:machine_factory` in the storage mode that keeps writes
in process memory until fsync (`--volatile`), so a kill -9 loses exactly what was not fsynced.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from delay.policy import DAY_MS, RetryPolicy
from queues import query_codec as qc
from queues.audit import ReplicaAuditor, close_clients, replica_clients
from queues.client import QueueClient, QueueError
from queues.core.keys import u64
from queues.core.port import Table
from queues.core.records import encode, event_decoder
from queues.lateness import LatenessReport
from queues.maintenance import MaintenanceConfig, MaintenanceDriver
from queues.model import Code, DeadLetterFilter, Enqueue, EventType, State
from queues.replicated import DB_NAME
from queues.stores.lmdb_store import LmdbStore
from raft_store.client import ClientError, RaftClient
from raft_store.testing.processes import ProcessCluster

pytestmark = pytest.mark.slow

MACHINE = "queues.replicated:machine_factory"
FAST = RetryPolicy(tiers_ms=(100,), tier_jitter_ratio=0.0, attempts_max=2)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    cluster = ProcessCluster(tmp_path, machine=MACHINE, extra_args=["--volatile"])
    cluster.start_all()
    try:
        yield cluster
    finally:
        cluster.stop_all()


async def _connect(cluster: ProcessCluster) -> tuple[RaftClient, QueueClient]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    await cluster.wait_leader(raft)
    queue = QueueClient(raft)
    await queue.set_policy("test", FAST)
    return raft, queue


async def _converged(cluster: ProcessCluster, raft: RaftClient, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    applied: dict[int, int] = {}
    while time.monotonic() < deadline:
        statuses = await cluster.statuses(raft)
        applied = {node: int(str(s["applied"])) for node, s in statuses.items()}
        if len(applied) == cluster.size and len(set(applied.values())) == 1:
            return next(iter(applied.values()))
        await asyncio.sleep(0.1)
    raise AssertionError(f"nodes did not converge: {applied}")


async def _lease_one(queue: QueueClient, lease_ms: int = 30_000, timeout_s: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await queue.lease("w1", kinds=("test",), count_max=1, lease_ms=lease_ms)
        if result.grants:
            return result.grants[0]
        await asyncio.sleep(0.02)
    raise AssertionError("nothing became leasable")


async def test_lifecycle_queries_and_follower_reads(cluster: ProcessCluster) -> None:
    raft, queue = await _connect(cluster)
    try:
        # enqueue, dedup, conflict
        first = await queue.enqueue("test", idempotency_key="k1", ref_key="order-1", payload=b"p1")
        assert first.code is Code.OK and first.state is State.READY
        again = await queue.enqueue("test", idempotency_key="k1", ref_key="order-1", payload=b"p1")
        assert (again.code, again.message_id) == (Code.EXISTS, first.message_id)
        clash = await queue.enqueue("test", idempotency_key="k1", ref_key="order-1", payload=b"other")
        assert clash.code is Code.CONFLICT
        unknown = await queue.enqueue("nope", idempotency_key="k0", ref_key="x", payload=b"")
        assert unknown.code is Code.UNKNOWN_KIND

        # lease -> ack (repeat ack answers ALREADY_ACKED)
        grant = await _lease_one(queue)
        assert (grant.message_id, grant.attempt, grant.payload) == (first.message_id, 1, b"p1")
        assert (await queue.ack(grant.message_id, grant.token)).code is Code.OK
        assert (await queue.ack(grant.message_id, grant.token)).code is Code.ALREADY_ACKED

        # fail -> delayed -> fail again -> dead letter (attempts_max 2)
        second = await queue.enqueue("test", idempotency_key="k2", ref_key="order-2", payload=b"p2")
        grant = await _lease_one(queue)
        failed = await queue.fail(grant.message_id, grant.token, "timeout", "downstream slow")
        assert failed.code is Code.OK and failed.state is State.DELAYED
        grant = await _lease_one(queue)
        assert (grant.message_id, grant.attempt) == (second.message_id, 2)
        dead = await queue.fail(grant.message_id, grant.token, "timeout", "still slow")
        assert dead.state is State.DEAD

        page = (await queue.dead_letters(DeadLetterFilter(kind="test"))).value
        assert [m.message_id for m in page.items] == [second.message_id]
        assert page.next_cursor is None and page.items[0].dead_reason == "attempts_exhausted"
        history = (await queue.by_ref_key("order-2")).value
        assert [a.outcome for a in history[0].history] == ["failed", "failed"]

        # redrive -> ready -> lease -> ack
        redriven = await queue.redrive("ops", "downstream fixed", ids=[second.message_id])
        assert redriven.ids == (second.message_id,)
        grant = await _lease_one(queue)
        assert (grant.message_id, grant.attempt) == (second.message_id, 3)
        assert (await queue.ack(grant.message_id, grant.token)).code is Code.OK

        # a delayed message, counts, oldest due age, events, lookups by id and key
        third = await queue.enqueue("test", idempotency_key="k3", ref_key="order-3", payload=b"p3", delay_ms=60_000)
        assert third.state is State.DELAYED
        counts = (await queue.counts()).value
        assert counts[("test", "done")] == 2 and counts[("test", "delayed")] == 1
        assert "test" not in (await queue.oldest_due_age_ms()).value
        by_key = (await queue.by_idempotency_keys(["k1", "k3", "missing"])).value
        assert [m.message_id for m in by_key] == [first.message_id, third.message_id]
        read = await queue.get(first.message_id)
        assert read.value is not None and read.value.state is State.DONE and read.applied_index > 0
        events = (await queue.events_after(0)).value
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert sum(e.type is EventType.ENQUEUED for e in events) == 3

        # retention set at runtime through the log (a refused value changes nothing)
        with pytest.raises(QueueError):
            await queue.set_retention(actor="ops", reason="typo", retention_ms=60_000)
        kept = await queue.set_retention(actor="ops", reason="audit asks 30 days", retention_ms=30 * DAY_MS)
        assert (kept.retention_ms, kept.event_retention_ms) == (30 * DAY_MS, 7 * DAY_MS)
        (audit,) = [e for e in (await queue.events_after(0)).value if e.type is EventType.RETENTION_SET]
        assert audit.data["actor"] == "ops" and audit.data["retention_ms_before"] == 7 * DAY_MS
        in_force = (await queue.retention()).value
        assert (in_force.retention_ms, in_force.event_retention_ms, in_force.floor_ms) == (30 * DAY_MS, 7 * DAY_MS, DAY_MS)

        # follower reads: answer with the applied index they reflect, equal once converged
        applied = await _converged(cluster, raft)
        for node in cluster.ids:
            follower = QueueClient(raft, reader=RaftClient([cluster.address(node)], auth=cluster.auth, deadline_s=5.0))
            stale = await follower.get(third.message_id, stale_ok=True)
            assert stale.applied_index == applied
            assert stale.value is not None and stale.value.state is State.DELAYED
            await follower.reader.close()

        # bad query bytes: an error answer, never a crash
        raw, _ = await raft.read(b"\x01garbage")
        assert isinstance(qc.decode_answer(raw), qc.QueryError)
        raw, _ = await raft.read(b"\x09")
        answer = qc.decode_answer(raw)
        assert isinstance(answer, qc.QueryError) and answer.code is qc.QueryErrorCode.UNSUPPORTED_VERSION
        with pytest.raises(QueueError):
            await queue.dead_letters(cursor="not-a-cursor")
        assert (await queue.counts()).value  # the node still serves
    finally:
        await raft.close()


async def test_expiry_driver_and_lateness(cluster: ProcessCluster) -> None:
    raft, queue = await _connect(cluster)
    driver = MaintenanceDriver(QueueClient(raft, coalesce=False), MaintenanceConfig(expire_every_s=0.1))
    try:
        enqueued = await queue.enqueue("test", idempotency_key="e1", ref_key="r", payload=b"x")
        grant = await _lease_one(queue, lease_ms=200)
        driver.start()
        deadline = time.monotonic() + 10
        view = None
        while time.monotonic() < deadline:
            view = (await queue.get(enqueued.message_id)).value
            if view is not None and view.state is not State.LEASED:
                break
            await asyncio.sleep(0.05)
        assert view is not None and view.state in (State.DELAYED, State.READY)
        assert view.history[0].outcome == "expired" and driver.stats.expired >= 1
        # the expired token is fenced once the message is leased again
        again = await _lease_one(queue)
        assert again.attempt == 2
        assert (await queue.ack(grant.message_id, grant.token)).code is Code.STALE_TOKEN

        # lateness of delayed messages leased by a polling worker
        now_ms = time.time_ns() // 1_000_000
        for i in range(20):
            await queue.enqueue("test", idempotency_key=f"d{i}", ref_key="r", payload=b"x", due_ms=now_ms + 300 + i * 20)
        report = LatenessReport()
        while len(report) < 20 and time.time_ns() // 1_000_000 < now_ms + 10_000:
            result = await queue.lease("w2", kinds=("test",), count_max=100, lease_ms=10_000)
            report.observe(result.grants, 10_000)
            await asyncio.sleep(0.01)
        summary = report.summary()
        assert summary["count"] == 20 and summary["lateness_p99_ms"] < 1000
    finally:
        await driver.stop()
        await raft.close()


async def test_enqueue_under_leader_kill_loses_nothing_and_duplicates_nothing(cluster: ProcessCluster) -> None:
    raft, queue = await _connect(cluster)
    acked: dict[str, int] = {}
    unknown: set[str] = set()
    stop = False

    async def enqueuer(worker: int) -> None:
        n = 0
        while not stop:
            n += 1
            key = f"w{worker}-{n}"
            try:
                result = await queue.enqueue("test", idempotency_key=key, ref_key=key, payload=key.encode())
            except ClientError:
                unknown.add(key)
                continue
            assert result.code is Code.OK, result
            acked[key] = result.message_id

    try:
        tasks = [asyncio.get_running_loop().create_task(enqueuer(w)) for w in range(16)]
        await asyncio.sleep(2.0)
        leader = await cluster.wait_leader(raft)
        cluster.kill(leader, signal.SIGKILL)
        before_kill = len(acked)
        await asyncio.sleep(3.0)
        cluster.start(leader)
        await asyncio.sleep(2.0)
        stop = True
        await asyncio.gather(*tasks)
        assert len(acked) > before_kill > 0, "no progress across the leader change"

        # an unknown outcome is resolved by retrying the same key: applied at most once
        recovered = 0
        for key in sorted(unknown):
            result = await queue.enqueue("test", idempotency_key=key, ref_key=key, payload=key.encode())
            recovered += result.code is Code.EXISTS
            acked[key] = result.message_id

        # every acknowledged enqueue is present, under its acknowledged id
        keys = sorted(acked)
        found: dict[str, int] = {}
        for start in range(0, len(keys), 1000):
            for view in (await queue.by_idempotency_keys(keys[start : start + 1000])).value:
                found[view.idempotency_key] = view.message_id
        lost = [k for k in keys if k not in found]
        moved = [k for k in keys if k in found and found[k] != acked[k]]
        assert not lost and not moved

        # exactly once: one `enqueued` event per key in the replicated event log
        enqueued: Counter[str] = Counter()
        seq = 0
        while True:
            events = (await queue.events_after(seq, limit=10_000)).value
            if not events:
                break
            seq = events[-1].seq
            enqueued.update(str(e.data["idempotency_key"]) for e in events if e.type is EventType.ENQUEUED)
        duplicates = {k: c for k, c in enqueued.items() if c > 1}
        unexpected = set(enqueued) - set(acked)
        assert not duplicates and not unexpected

        # drain: every message delivered and acknowledged
        delivered: Counter[str] = Counter()
        deadline = time.monotonic() + 30
        while sum(delivered.values()) < len(keys) and time.monotonic() < deadline:
            grants = (await queue.lease("drain", kinds=("test",), count_max=1000, lease_ms=60_000)).grants
            delivered.update(g.idempotency_key for g in grants)
            outcomes = await queue.ack_many([(g.message_id, g.token) for g in grants])
            assert all(o.code is Code.OK for o in outcomes)
        assert set(delivered) == set(keys) and max(delivered.values()) == 1

        # every replica holds the same state
        await _converged(cluster, raft)
        for node in cluster.ids:
            reader = RaftClient([cluster.address(node)], auth=cluster.auth, deadline_s=5.0)
            counts = (await QueueClient(raft, reader=reader).counts(stale_ok=True)).value
            await reader.close()
            assert counts == {("test", "done"): len(keys)}, (node, counts)
        print(f"acked={len(keys)} unknown={len(unknown)} recovered={recovered} lost=0 duplicated=0")
    finally:
        stop = True
        await raft.close()


async def test_stale_token_refused_across_leader_change(cluster: ProcessCluster) -> None:
    raft, queue = await _connect(cluster)
    try:
        enqueued = await queue.enqueue("test", idempotency_key="s1", ref_key="r", payload=b"x")
        old = await _lease_one(queue, lease_ms=300)
        leader = await cluster.wait_leader(raft)
        cluster.kill(leader, signal.SIGKILL)
        await cluster.wait_leader(raft, exclude=leader)
        await asyncio.sleep(0.4)  # the old lease is past its deadline under the new leader's clock
        new = await _lease_one(queue, lease_ms=30_000)
        assert new.message_id == enqueued.message_id and new.token > old.token and new.attempt == 2
        for refused in (
            await queue.ack(old.message_id, old.token),
            await queue.fail(old.message_id, old.token, "timeout"),
            await queue.extend(old.message_id, old.token, 1000),
        ):
            assert refused.code is Code.STALE_TOKEN
        assert (await queue.ack(new.message_id, new.token)).code is Code.OK
        cluster.start(leader)
        await _converged(cluster, raft)
        view = (await queue.get(enqueued.message_id)).value
        assert view is not None and view.state is State.DONE
        assert [a.outcome for a in view.history] == ["expired", "succeeded"]
    finally:
        await raft.close()


async def test_replica_audit_names_a_replica_whose_store_was_corrupted_while_it_was_down(cluster: ProcessCluster) -> None:
    raft, queue = await _connect(cluster)
    clients = replica_clients(cluster.addresses(), cluster.auth)
    names = {node: f"{host}:{port}" for node, (host, port) in zip(cluster.ids, cluster.addresses(), strict=True)}
    try:
        for start in range(0, 300, 100):
            await queue.enqueue_many([
                Enqueue(kind="test", idempotency_key=f"a{i}", ref_key=f"r{i}", payload=b"x" * 100)
                for i in range(start, start + 100)
            ])  # fmt: skip
        grants = (await queue.lease("w1", kinds=("test",), count_max=200, lease_ms=60_000)).grants
        await queue.ack_many([(g.message_id, g.token) for g in grants])
        await _converged(cluster, raft)
        auditor = ReplicaAuditor(clients)
        assert await auditor.audit_once() is None
        assert auditor.stats.audited_through == auditor.stats.events_compared >= 300 + 200 + 200

        # A flipped bit in a follower's store, written while it was down, is what nothing else sees:
        # the node restarts, replays its log tail, answers reads and acks appends as before.
        leader = await cluster.wait_leader(raft)
        victim = next(node for node in cluster.ids if node != leader)
        cluster.kill(victim, signal.SIGTERM)
        store = LmdbStore(cluster.root / f"node{victim}" / DB_NAME)  # opened as the node opens it
        with store.write() as tx:
            row = event_decoder.decode(tx.get(Table.EVENTS, u64(250)) or b"")
            tx.put(Table.EVENTS, u64(250), encode(msgspec.structs.replace(row, message_id=row.message_id + 1)))
            assert tx.get(Table.BODIES, u64(5)) is not None
            tx.put(Table.BODIES, u64(5), b"y" * 100)
        store.close()  # a clean stop: the node trusts the file as it is
        cluster.start(victim)
        await queue.enqueue("test", idempotency_key="after", ref_key="r", payload=b"x")
        await _converged(cluster, raft)

        found = await ReplicaAuditor(clients).audit_once()
        assert found is not None and found.seq == 250
        assert found.differ == (names[victim],) and set(found.agree) == set(names.values()) - {names[victim]}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "queues.audit", "--once", "--addresses", ",".join(names.values()),
             *cluster.auth_args()],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 1, done.stderr
        report = json.loads(done.stdout)
        assert report["diverged"] is True and report["corrupt"] == {names[victim]: [5]}
        assert report["payloads_scrubbed"] == 3 * 301
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(f"queues.audit: replica {names[victim]} diverged from ") and "at event seq 250" in line
    finally:
        await close_clients(clients)
        await raft.close()


async def test_a_payload_corrupted_at_rest_never_reaches_a_handler_and_ends_as_a_dead_letter(
    cluster: ProcessCluster,
) -> None:
    raft, queue = await _connect(cluster)  # kind "test": 2 attempts, 100 ms apart
    try:
        bad = await queue.enqueue("test", idempotency_key="bad", ref_key="r1", payload=b"pay 100")
        good = await queue.enqueue("test", idempotency_key="good", ref_key="r2", payload=b"pay 200")
        await _converged(cluster, raft)
    finally:
        await raft.close()
    cluster.stop_all()
    for node in cluster.ids:  # every copy, so whichever node leads grants the corrupt one
        store = LmdbStore(cluster.root / f"node{node}" / DB_NAME)
        with store.write() as tx:
            assert tx.get(Table.BODIES, u64(bad.message_id)) == b"pay 100"
            tx.put(Table.BODIES, u64(bad.message_id), b"pay 900")
        store.close()
    cluster.start_all()
    raft, queue = await _connect(cluster)
    try:
        handed: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        view = None
        while time.monotonic() < deadline:
            for grant in (await queue.lease("w1", kinds=("test",), count_max=10, lease_ms=30_000)).grants:
                handed.append((grant.message_id, grant.payload))
                assert (await queue.ack(grant.message_id, grant.token)).code is Code.OK
            view = (await queue.get(bad.message_id)).value
            if view is not None and view.state is State.DEAD:
                break
            await asyncio.sleep(0.05)
        assert handed == [(good.message_id, b"pay 200")]
        assert view is not None and view.state is State.DEAD and view.last_error_class == "payload_corrupt"
        assert [(a.outcome, a.error_class) for a in view.history] == [("failed", "payload_corrupt")] * 2
    finally:
        await raft.close()
