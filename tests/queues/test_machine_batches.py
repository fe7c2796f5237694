"""What the per-entry batching of the queue machine must keep true.

The machine keeps counters, new idempotency keys, payloads and events of one log entry in Python
and writes them at the entry's end; leases are kept in sessions as (id, token) pairs; the clock of
the log never goes backwards. Each test here would fail if one of those shortcuts leaked.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from queues import codec
from queues.core import reads as queries
from queues.core.entry import Entry
from queues.core.keys import u64
from queues.core.port import Table
from queues.machine import QueueMachine, StoreLayoutError
from queues.model import (
    Ack,
    Code,
    Discard,
    Enqueue,
    EnqueueResult,
    Lease,
    LeaseResult,
    Outcome,
    QueueCommand,
    QueueResult,
    State,
)
from raft_store.state_machine import Command

T0 = 1_700_000_000_000


class Replica:
    def __init__(self, path: str = ":memory:") -> None:
        self.machine = QueueMachine(path)
        self.index = 0

    def entry(
        self, now_ms: int, commands: list[tuple[int, int, QueueCommand]], *, respond: bool = True
    ) -> list[QueueResult]:
        self.index += 1
        batch = [Command(client, seq, codec.encode_command(c)) for client, seq, c in commands]
        raw = self.machine.apply_batch(self.index, now_ms, batch, respond=respond)
        return [codec.decode_result(r) for r in raw]


def enqueue(key: str, payload: bytes = b"p", delay_ms: int = 0) -> Enqueue:
    return Enqueue(kind="transfer", idempotency_key=key, ref_key="r", payload=payload, delay_ms=delay_ms)


def test_enqueue_then_lease_in_one_entry_sees_payload_and_key() -> None:
    replica = Replica()
    results = replica.entry(
        T0,
        [
            (1, 1, enqueue("a", b"alpha")),
            (2, 1, enqueue("a", b"alpha")),  # same key, same entry: the first one's id
            (3, 1, enqueue("a", b"other")),  # same key, different payload: conflict
            (4, 1, Lease(worker_id="w", count_max=10, lease_ms=1000)),
        ],
    )
    first, again, conflict, lease = results
    assert isinstance(first, EnqueueResult) and first.code is Code.OK
    assert isinstance(again, EnqueueResult) and (again.code, again.message_id) == (Code.EXISTS, first.message_id)
    assert isinstance(conflict, EnqueueResult) and conflict.code is Code.CONFLICT
    assert isinstance(lease, LeaseResult)
    assert [(g.message_id, g.payload) for g in lease.grants] == [(first.message_id, b"alpha")]
    events = queries.events_after(replica.machine.view, 0, limit=10)
    assert [e.seq for e in events] == [1, 2]  # enqueued, leased: dense, in order


def test_retried_lease_returns_its_live_grants_and_grants_nothing_new() -> None:
    replica = Replica()
    replica.entry(T0, [(1, i + 1, enqueue(f"k{i}", f"body{i}".encode())) for i in range(5)])
    (lease,) = replica.entry(T0 + 1, [(7, 1, Lease(worker_id="w", count_max=3, lease_ms=10_000))])
    assert isinstance(lease, LeaseResult) and len(lease.grants) == 3
    (retry,) = replica.entry(T0 + 2, [(7, 1, Lease(worker_id="w", count_max=3, lease_ms=10_000))])
    assert retry == lease  # byte-for-byte the same grants, payloads read back from the store
    first = lease.grants[0]
    (ack,) = replica.entry(T0 + 3, [(8, 1, Ack(message_id=first.message_id, token=first.token))])
    assert isinstance(ack, Outcome) and ack.code is Code.OK
    (retry,) = replica.entry(T0 + 4, [(7, 1, Lease(worker_id="w", count_max=3, lease_ms=10_000))])
    assert isinstance(retry, LeaseResult) and retry.grants == lease.grants[1:]  # the acked one is no longer its
    (late,) = replica.entry(T0 + 20_000, [(7, 1, Lease(worker_id="w", count_max=3, lease_ms=10_000))])
    assert isinstance(late, LeaseResult) and late.grants == ()  # expired leases are not handed out again
    stored = replica.machine.view.get(Table.SESSIONS, u64(7))
    assert stored is not None and b"body1" not in stored  # sessions keep (id, token) pairs, not payloads
    counts = {(c.kind, c.state): c.count for c in queries.counts(replica.machine.view, now_ms=T0 + 4)}
    assert counts[("transfer", State.LEASED)] == 2 and counts[("transfer", State.READY)] == 2


def test_log_time_never_goes_backwards() -> None:
    """A new leader whose clock is behind must not make a due time or a deadline come again."""
    replica = Replica()
    (first,) = replica.entry(T0, [(1, 1, enqueue("a", delay_ms=100))])
    (second,) = replica.entry(T0 - 5_000, [(1, 2, enqueue("b", delay_ms=100))])
    assert isinstance(first, EnqueueResult) and isinstance(second, EnqueueResult)
    view = queries.get_message(replica.machine.view, second.message_id, now_ms=T0)
    assert view is not None and view.due_ms == T0 + 100 and view.created_ms == T0


def test_rollback_forgets_cached_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that fails mid-way rolls back; a kind it registered must not stay cached."""
    from delay.policy import DEFAULT_POLICY
    from queues.model import SetPolicy

    replica = Replica()
    original = Entry.finish

    def explode(self: Entry) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(Entry, "finish", explode)
    with pytest.raises(RuntimeError):
        replica.entry(
            T0,
            [
                (0, 0, SetPolicy(kind="refund", policy=DEFAULT_POLICY)),
                (0, 0, Enqueue(kind="refund", idempotency_key="y", ref_key="r", payload=b"")),  # caches it
            ],
        )
    monkeypatch.setattr(Entry, "finish", original)
    replica.index -= 1  # the entry was not applied; the node would apply it again
    (result,) = replica.entry(
        T0, [(0, 0, Enqueue(kind="refund", idempotency_key="x", ref_key="r", payload=b""))]
    )
    assert isinstance(result, EnqueueResult) and result.code is Code.UNKNOWN_KIND


def test_a_store_of_an_older_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, payload BLOB)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreLayoutError, match=r"queues\.migrate"):
        QueueMachine(str(path))


def test_checkpoint_makes_state_durable_and_reports_the_index(tmp_path: Path) -> None:
    replica = Replica(str(tmp_path / "queue.lmdb"))
    replica.entry(T0, [(1, 1, enqueue("a"))])
    assert replica.machine.checkpoint() == 1
    assert Replica().machine.checkpoint() == 0  # an in-memory store cannot; the node copies instead


def test_snapshot_copies_taken_beside_applies_are_consistent(tmp_path: Path) -> None:
    """The node pins a copy between applies, then writes it on its own thread while applies go on."""
    import queue
    import threading

    from raft_store.state_machine import PinnedCopy

    replica = Replica(str(tmp_path / "queue.lmdb"))
    assert Replica().machine.open_copy() is None  # an in-memory store is copied between applies
    replica.entry(T0, [(1, i + 1, enqueue(f"first-{i}")) for i in range(10)])
    pinned = replica.machine.open_copy()
    assert pinned is not None
    assert pinned.index == 1
    for n in range(1, 6):  # committed after the pin, before the copy is written
        replica.entry(T0 + n, [(1, n * 10 + i + 1, enqueue(f"k{n}-{i}")) for i in range(10)])
    pins: queue.Queue[PinnedCopy | None] = queue.Queue()

    def apply_many() -> None:
        # As the node does: every pin is taken in the applying thread, between two applies.
        for n in range(6, 60):
            replica.entry(T0 + n, [(1, n * 10 + i + 1, enqueue(f"k{n}-{i}")) for i in range(10)])
            if n % 10 == 0:
                pins.put(replica.machine.open_copy())
        pins.put(None)

    worker = threading.Thread(target=apply_many)
    worker.start()
    copies = [(pinned.write(tmp_path / "pinned.lmdb"), tmp_path / "pinned.lmdb")]
    pinned.close()
    while (pin := pins.get(timeout=60)) is not None:  # written here, while the worker applies on
        target = tmp_path / f"copy-{len(copies)}.lmdb"
        try:
            copies.append((pin.write(target), target))
        finally:
            pin.close()
    worker.join()
    assert len(copies) == 6
    assert copies[0][0] == 1  # the pinned state, however far the applies went meanwhile
    for number, (index, path) in enumerate(copies):
        restored = QueueMachine(str(tmp_path / f"restored-{number}.lmdb"))
        restored.restore_snapshot(path, index)
        counted = {(c.kind, c.state): c.count for c in queries.counts(restored.view, now_ms=T0 + 60)}
        assert counted.get(("transfer", State.READY), 0) == 10 * index, (index, counted)
        restored.close()
    replica.machine.close()


def test_a_follower_apply_without_answers_leaves_the_same_state() -> None:
    """A follower applies with respond=False and skips the lease payloads; nothing else may differ.

    The payload budget of a lease (8 MiB) must cut at the same grant from lengths alone, and the
    session record must let a retried Lease get the same grants back from either replica."""
    leader, follower = Replica(), Replica()
    big = b"b" * (256 << 10)  # the largest payload: 32 of them fill a lease's 8 MiB
    for replica, respond in ((leader, True), (follower, False)):
        replica.entry(T0, [(1, i + 1, enqueue(f"k{i}", big)) for i in range(40)] + [(2, 1, enqueue("s", b"small"))],
                      respond=respond)
        replica.entry(T0 + 1, [(5, 1, Lease(worker_id="w", count_max=100, lease_ms=1000))], respond=respond)
        replica.entry(T0 + 2, [(5, 2, Lease(worker_id="w", count_max=100, lease_ms=1000)),
                               (6, 1, Ack(message_id=1, token=1))], respond=respond)
    assert leader.machine.store_digest() == follower.machine.store_digest()  # every table, byte for byte
    counts = queries.counts(leader.machine.view, now_ms=T0 + 3)
    assert counts == queries.counts(follower.machine.view, now_ms=T0 + 3)
    assert {(c.state, c.count) for c in counts} == {(State.DONE, 1), (State.LEASED, 40)}
    retried = [r.entry(T0 + 3, [(5, 2, Lease(worker_id="w", count_max=100, lease_ms=1000))])[0] for r in (leader, follower)]
    assert isinstance(retried[0], LeaseResult) and isinstance(retried[1], LeaseResult)
    assert retried[0] == retried[1]
    # The second lease got the 8 left over from the first one's budget, and the small one.
    assert [g.payload for g in retried[0].grants] == [big] * 8 + [b"small"]


def test_a_retried_sessionless_enqueue_answers_as_the_first_time() -> None:
    """Enqueues travel without a session lane; their request_id tells a retry from a repeat."""
    replica = Replica()
    first = Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"p", request_id=7)
    same_entry = replica.entry(T0, [(0, 0, first), (0, 0, first)])
    later = replica.entry(
        T0 + 1,
        [
            (0, 0, first),  # the client's retry after a lost answer
            (0, 0, Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"p", request_id=8)),
            (0, 0, Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"p")),
            (0, 0, Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"q", request_id=7)),
        ],
    )
    codes = [(r.code, r.message_id) for r in same_entry + later if isinstance(r, EnqueueResult)]
    assert codes == [(Code.OK, 1), (Code.OK, 1), (Code.OK, 1), (Code.EXISTS, 1), (Code.EXISTS, 1), (Code.CONFLICT, 1)]


def test_a_run_of_enqueues_in_one_entry_answers_as_one_entry_each() -> None:
    """An entry reads its enqueues' keys in one query and writes their rows at the first command
    that is not an enqueue: the answers and the state must be those of one command per entry.

    The Discard between the enqueues is the trap: the keys were read before it, so an enqueue of
    the discarded message's key must not answer from that read (READY), but DISCARDED."""
    setup = [enqueue("old", b"o"), enqueue("gone", b"g")]
    tested: list[QueueCommand] = [
        Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"a", request_id=5),
        enqueue("old", b"o"),
        Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"a", request_id=5),
        Discard(message_id=2, actor="finance", reason="duplicate"),
        enqueue("gone", b"g"),
        Lease(worker_id="w", count_max=10, lease_ms=1000),
        Enqueue(kind="transfer", idempotency_key="a", ref_key="r", payload=b"a", request_id=6),
        enqueue("b", b"b1"),
        enqueue("b", b"b2"),
        enqueue("c", b"c", delay_ms=5000),
    ]
    batched, single = Replica(), Replica()
    for replica in (batched, single):
        for command in setup:
            replica.entry(T0, [(0, 0, command)])
    got = batched.entry(T0 + 1, [(0, 0, c) if isinstance(c, Enqueue) else (9, 1 + i, c) for i, c in enumerate(tested)])
    want = [
        single.entry(T0 + 1, [(0, 0, c) if isinstance(c, Enqueue) else (9, 1 + i, c)])[0]
        for i, c in enumerate(tested)
    ]
    assert got == want
    states = [(r.code, r.state) for r in got if isinstance(r, EnqueueResult)]
    assert states == [
        (Code.OK, State.READY),
        (Code.EXISTS, State.READY),
        (Code.OK, State.READY),
        (Code.EXISTS, State.DISCARDED),
        (Code.EXISTS, State.LEASED),
        (Code.OK, State.READY),
        (Code.CONFLICT, State.READY),
        (Code.OK, State.DELAYED),
    ]

    def rows(replica: Replica) -> list[object]:
        state = replica.machine.canonical()
        return [
            state["messages"], state["idempotency"], [[e[0], e[3], e[4], e[6]] for e in state["events"]],
            state["phase_counts"],
        ]

    assert rows(batched) == rows(single)
