"""The storage port's conformance suite: what every store under the queue core must do.

Each test runs on every store (River's driver test suite is the model: one suite, every driver):
the port's ordered byte tables (get, put, delete, forward and reverse scans with bounds, count,
appends), one entry's writes being atomic, group commit, a view of the applied state, pinned
copies that later writes do not touch, and restores. The LMDB store's own durability (unsynced
commits, checkpoints, the rollback after an unclean stop) is tested below the suite.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from queues.core.keys import after, pair, text, u64
from queues.core.port import KvRead, Table
from queues.stores import Store, StoreError
from queues.stores import lmdb_checkpoint as ckpt
from queues.stores.lmdb_store import LmdbStore
from queues.stores.sqlite_store import SqliteStore

STORES = ("lmdb", "sqlite-file", "sqlite-memory")


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made = _make(request.param, tmp_path / "store")
    yield made
    made.close()


def _make(kind: str, path: Path) -> Store:
    if kind == "lmdb":
        return LmdbStore(path)
    return SqliteStore(path if kind == "sqlite-file" else ":memory:")


def _put(store: Store, table: Table, *items: tuple[bytes, bytes]) -> None:
    with store.write() as tx:
        for key, value in items:
            tx.put(table, key, value)


# ---- the ordered byte tables --------------------------------------------------------------------------
def test_get_put_replace_delete_and_count(store: Store) -> None:
    _put(store, Table.KINDS, (b"a", b"1"), (b"b", b"2"))
    view = store.read()
    assert (view.get(Table.KINDS, b"a"), view.get(Table.KINDS, b"c"), view.count(Table.KINDS)) == (b"1", None, 2)
    _put(store, Table.KINDS, (b"a", b"one"))
    with store.write() as tx:
        assert tx.delete(Table.KINDS, b"b") and not tx.delete(Table.KINDS, b"zz")
        assert tx.get(Table.KINDS, b"b") is None  # an entry reads its own writes
    view = store.read()
    assert (view.get(Table.KINDS, b"a"), view.get(Table.KINDS, b"b"), view.count(Table.KINDS)) == (b"one", None, 1)


def test_tables_are_apart(store: Store) -> None:
    _put(store, Table.KINDS, (b"k", b"kinds"))
    _put(store, Table.SETTINGS, (b"k", b"settings"))
    view = store.read()
    assert (view.get(Table.KINDS, b"k"), view.get(Table.SETTINGS, b"k"), view.get(Table.PAUSES, b"k")) == (
        b"kinds", b"settings", None,
    )  # fmt: skip
    assert [len(list(view.scan(table))) for table in (Table.KINDS, Table.SETTINGS, Table.PAUSES)] == [1, 1, 0]


def test_scans_are_in_byte_order_with_bounds_both_ways(store: Store) -> None:
    rng = random.Random(3)
    keys = sorted({rng.randbytes(rng.randint(1, 6)) for _ in range(300)} | {b"\x00", b"\xff", b"\xff\xff", b"ab", b"a"})
    items = [(key, key[::-1] + b"v") for key in keys]
    shuffled = items[:]
    rng.shuffle(shuffled)
    _put(store, Table.EVENTS, *shuffled)
    view = store.read()
    assert list(view.scan(Table.EVENTS)) == items  # memcmp order, shorter first on a common prefix
    assert list(view.scan(Table.EVENTS, reverse=True)) == items[::-1]
    for _ in range(100):
        start, stop = sorted(rng.randbytes(rng.randint(0, 3)) for _ in range(2))
        inside = [(k, v) for k, v in items if start <= k < stop]
        assert list(view.scan(Table.EVENTS, start, stop)) == inside
        assert list(view.scan(Table.EVENTS, start, stop, reverse=True)) == inside[::-1]
        assert list(view.scan(Table.EVENTS, start)) == [(k, v) for k, v in items if k >= start]
    assert list(view.scan(Table.EVENTS, b"\xff\xff\xff")) == []
    assert list(view.scan(Table.EVENTS, b"b", b"a")) == []


def test_a_scan_is_lazy(store: Store) -> None:
    _put(store, Table.EVENTS, *((u64(n), b"x") for n in range(5000)))
    scan = store.read().scan(Table.EVENTS)
    assert [next(scan)[0] for _ in range(3)] == [u64(0), u64(1), u64(2)]


def test_the_key_encodings_group_and_order_as_the_rules_need(store: Store) -> None:
    strings = ["a", "a\x00", "a\x00b", "ab", "b", "", "\x00", "é"]
    _put(store, Table.AUDIT_ACTORS, *((text(s) + u64(n), b"") for n, s in enumerate(strings)))
    view = store.read()
    for n, s in enumerate(strings):  # a prefix scan of one string never reaches another
        prefix = text(s)
        assert [key for key, _ in view.scan(Table.AUDIT_ACTORS, prefix, after(prefix))] == [prefix + u64(n)]
    order = [key for key, _ in view.scan(Table.AUDIT_ACTORS)]
    assert order == sorted(order) and [strings[int.from_bytes(k[-8:], "big")] for k in order] == sorted(strings, key=str.encode)
    assert after(b"ab\xff") == b"ac" and after(b"\xff\xff") is None
    assert sorted(pair(a, b) for a, b in ((2, 1), (1, 9), (1, 3))) == [pair(1, 3), pair(1, 9), pair(2, 1)]


def test_a_claim_inserts_only_an_absent_key_and_answers_the_present_value(store: Store) -> None:
    with store.write() as tx:
        assert tx.claim(Table.KEYS, b"k", b"1") is None
        assert tx.claim(Table.KEYS, b"k", b"2") == b"1"  # there already: unchanged
        assert tx.get(Table.KEYS, b"k") == b"1"
        assert tx.claim(Table.KEYS, b"empty", b"") is None and tx.claim(Table.KEYS, b"empty", b"x") == b""
    view = store.read()
    assert list(view.scan(Table.KEYS)) == [(b"empty", b""), (b"k", b"1")]
    with pytest.raises(RuntimeError), store.write() as tx:
        assert tx.claim(Table.KEYS, b"new", b"3") is None
        raise RuntimeError("the rule failed")
    assert store.read().get(Table.KEYS, b"new") is None  # a claim is undone with its entry


def test_an_append_is_refused_unless_above_every_key(store: Store) -> None:
    with store.write() as tx:
        tx.put(Table.EVENTS, u64(5), b"e5", append=True)
        tx.put(Table.EVENTS, u64(6), b"e6", append=True)
        with pytest.raises(StoreError, match="not above"):
            tx.put(Table.EVENTS, u64(6), b"again", append=True)
        with pytest.raises(StoreError, match="not above"):
            tx.put(Table.EVENTS, u64(1), b"below", append=True)
    assert list(store.read().scan(Table.EVENTS)) == [(u64(5), b"e5"), (u64(6), b"e6")]


def test_large_values_and_empty_ones(store: Store) -> None:
    big = random.Random(1).randbytes(300_000)
    _put(store, Table.BODIES, (u64(1), big), (u64(2), b""))
    view = store.read()
    assert (view.get(Table.BODIES, u64(1)), view.get(Table.BODIES, u64(2))) == (big, b"")


# ---- atomicity and groups ------------------------------------------------------------------------------
def test_an_entry_that_raises_is_undone_alone(store: Store) -> None:
    _put(store, Table.KINDS, (b"first", b"1"))
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.put(Table.KINDS, b"second", b"2")
        tx.delete(Table.KINDS, b"first")
        raise RuntimeError("the rule failed")
    _put(store, Table.KINDS, (b"third", b"3"))
    assert list(store.read().scan(Table.KINDS)) == [(b"first", b"1"), (b"third", b"3")]


def test_an_entry_that_raises_leaves_every_table_as_it_was(store: Store) -> None:
    """Appends, replaces (one key twice), deletes and a scan between them, in several tables: all
    undone, and the entries before it in the group kept."""
    _put(store, Table.EVENTS, (u64(1), b"e1"), (u64(2), b"e2"))
    _put(store, Table.KEYS, (b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3"))
    before = {table: list(store.read().scan(table)) for table in (Table.EVENTS, Table.KEYS, Table.DUE)}
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.put(Table.EVENTS, u64(3), b"e3", append=True)
        tx.put(Table.KEYS, b"k1", b"one")
        tx.put(Table.KEYS, b"k1", b"uno")
        tx.put(Table.KEYS, b"k0", b"0")
        assert tx.delete(Table.KEYS, b"k2") and not tx.delete(Table.KEYS, b"k9")
        tx.put(Table.DUE, b"d", b"")
        assert [key for key, _ in tx.scan(Table.KEYS)] == [b"k0", b"k1", b"k3"]
        assert tx.delete(Table.EVENTS, u64(3)) and tx.delete(Table.EVENTS, u64(1))
        tx.put(Table.EVENTS, u64(4), b"e4", append=True)
        raise RuntimeError("the rule failed")
    assert {table: list(store.read().scan(table)) for table in before} == before
    with store.write() as tx:  # the store goes on as before
        tx.put(Table.EVENTS, u64(3), b"e3", append=True)
    assert [key for key, _ in store.read().scan(Table.EVENTS)] == [u64(1), u64(2), u64(3)]


def test_writes_are_grouped_until_a_commit(store: Store) -> None:
    assert not store.uncommitted
    _put(store, Table.KINDS, (b"a", b"1"))
    assert store.uncommitted and store.read().get(Table.KINDS, b"a") == b"1"  # visible before the commit
    store.commit()
    assert not store.uncommitted and store.read().get(Table.KINDS, b"a") == b"1"
    store.commit()  # nothing to commit: nothing happens


def test_call_commits_a_group_grown_large_enough(tmp_path: Path) -> None:
    for made in (LmdbStore(tmp_path / "l", commit_every=10), SqliteStore(tmp_path / "s", commit_every=10)):
        made.call(lambda s=made: _put(s, Table.EVENTS, *((u64(n), b"") for n in range(9))))
        assert made.uncommitted
        made.call(lambda s=made: _put(s, Table.EVENTS, (u64(9), b"")))
        made.read()  # a commit handed to another thread is waited for by the next use
        assert not made.uncommitted
        made.close()


# ---- copies and restores ---------------------------------------------------------------------------------
def test_a_pinned_state_is_what_later_writes_do_not_change(store: Store, tmp_path: Path) -> None:
    _put(store, Table.MESSAGES, *((u64(n), b"old") for n in range(200)))
    pinned = store.pin()
    if pinned is None:  # an in-memory store: copied between writes instead
        store.copy_to(tmp_path / "copy")
    else:
        for n in range(50):  # churn: replaced, deleted and new keys, several groups
            with store.write() as tx:
                tx.put(Table.MESSAGES, u64(n), b"new" * 100)
                tx.delete(Table.MESSAGES, u64(100 + n))
                tx.put(Table.MESSAGES, u64(1000 + n), b"added" * 500)
            store.commit()
        assert list(pinned.read().scan(Table.MESSAGES)) == [(u64(n), b"old") for n in range(200)]
        done = threading.Event()

        def write_elsewhere() -> None:
            pinned.write(tmp_path / "copy")
            done.set()

        threading.Thread(target=write_elsewhere).start()
        assert done.wait(30)
        pinned.close()
    kind = "lmdb" if isinstance(store, LmdbStore) else "sqlite-file" if store.durable else "sqlite-memory"
    other = _make(kind, tmp_path / "other")
    try:
        _put(other, Table.KINDS, (b"gone", b"after the restore"))
        other.restore(tmp_path / "copy")
        assert list(other.read().scan(Table.MESSAGES)) == [(u64(n), b"old") for n in range(200)]
        assert other.read().get(Table.KINDS, b"gone") is None
        _put(other, Table.KINDS, (b"after", b"1"))  # and it goes on from there
        assert other.read().get(Table.KINDS, b"after") == b"1"
    finally:
        other.close()


def test_a_durable_store_keeps_what_it_held_across_a_clean_close(tmp_path: Path) -> None:
    for kind in ("lmdb", "sqlite-file"):
        path = tmp_path / kind
        made = _make(kind, path)
        _put(made, Table.KINDS, (b"kept", b"yes"))
        assert made.sync() is True
        made.close()
        reopened = _make(kind, path)
        assert reopened.read().get(Table.KINDS, b"kept") == b"yes"
        reopened.close()
    memory = SqliteStore()
    assert memory.sync() is False  # nothing in memory survives the process
    memory.close()


# ---- the LMDB store's durability ----------------------------------------------------------------------
def _states(store: LmdbStore) -> dict[int, bytes]:
    return {int.from_bytes(key, "big"): value for key, value in store.read().scan(Table.MESSAGES)}


def test_an_unclean_stop_rolls_back_to_the_last_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "queue.lmdb"
    store = LmdbStore(path)
    _put(store, Table.MESSAGES, *((u64(n), b"checkpointed") for n in range(100)))
    assert store.checkpoint(lambda view: 7) == 7  # the first checkpoint waits for its fsync
    durable = _states(store)
    for round_ in range(40):  # churn past the checkpoint: the pages it freed must not be reused
        with store.write() as tx:
            for n in range(100):
                tx.put(Table.MESSAGES, u64(n), f"later {round_}".encode() * 20)
            tx.put(Table.MESSAGES, u64(1000 + round_), b"new" * 300)
        store.commit()
    store.abandon()  # a kill -9: no clean stop, no further checkpoint
    reopened = LmdbStore(path)
    assert _states(reopened) == durable
    reopened.close()


def test_the_rollback_does_not_read_what_was_written_after_the_checkpoint(tmp_path: Path) -> None:
    """A power cut may leave pages written after the checkpoint torn, and meta pages naming them:
    garbage in every page past the checkpoint's last one, and in both meta slots, changes nothing."""
    path = tmp_path / "queue.lmdb"
    store = LmdbStore(path)
    _put(store, Table.MESSAGES, *((u64(n), b"v" * 200) for n in range(300)))
    store.checkpoint(lambda view: 1)
    durable = _states(store)
    saved = ckpt.load(str(path))
    assert saved is not None
    last_page = int.from_bytes(saved.page[136:144], "little")
    for round_ in range(20):
        _put(store, Table.MESSAGES, *((u64(5000 + round_ * 100 + n), b"w" * 500) for n in range(100)))
        store.commit()
    store.abandon()
    size = len(saved.page)
    with open(path, "r+b") as file:
        file.seek(0, 2)
        pages = file.tell() // size
        rng = random.Random(5)
        for page in range(last_page + 1, pages):
            file.seek(page * size)
            file.write(rng.randbytes(size))
        for slot in (0, 1):  # meta pages of a "newer" transaction that never finished
            file.seek(slot * size + 144)
            file.write((saved.txnid + 50).to_bytes(8, "little"))
    reopened = LmdbStore(path)
    assert _states(reopened) == durable
    _put(reopened, Table.KINDS, (b"goes", b"on"))  # and the store is usable: new pages, new commits
    reopened.commit()
    assert reopened.read().get(Table.KINDS, b"goes") == b"on"
    reopened.close()


def test_a_clean_stop_keeps_everything_and_checkpoints_are_answered_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "queue.lmdb"
    store = LmdbStore(path, threaded=True)
    _put(store, Table.KINDS, (b"a", b"1"))
    assert store.checkpoint(lambda view: 1) == 1
    _put(store, Table.KINDS, (b"b", b"2"))
    store.commit()
    answered = store.checkpoint(lambda view: 2)  # answers the newest durable state, syncs the next
    assert answered in (1, 2)
    store.close()
    reopened = LmdbStore(path)
    assert list(reopened.read().scan(Table.KINDS)) == [(b"a", b"1"), (b"b", b"2")]
    reopened.close()


def _sync_cycle(store: LmdbStore) -> None:
    """One round of the syncer, now: its fsync, and what follows it."""
    store._syncer.kick()
    store._syncer.wait_idle()


def test_a_store_that_knows_its_index_moves_its_checkpoint_on_its_own(tmp_path: Path) -> None:
    """With `index_of`, each fsync of the syncer makes the last committed state the one an
    unclean stop rolls back to: nobody calls `checkpoint`, and the rollback loses at most a
    second or two of commits (the log has them)."""
    path = tmp_path / "queue.lmdb"
    store = LmdbStore(path, index_of=lambda view: len(_states_of(view)))
    _put(store, Table.MESSAGES, *((u64(n), b"first") for n in range(10)))
    store.commit()
    _sync_cycle(store)  # pins the committed state as the candidate
    _sync_cycle(store)  # its fsync makes it durable
    _put(store, Table.MESSAGES, (u64(99), b"not committed"))
    assert store.checkpoint(lambda view: -1) == 10  # answers the durable state's own index
    store.abandon()
    reopened = LmdbStore(path)
    assert sorted(_states(reopened)) == list(range(10))
    reopened.close()


def test_the_pages_a_checkpoint_frees_are_reused_once_it_moves_on(tmp_path: Path) -> None:
    """Churn (every value rewritten, commit after commit) does not grow the file while the
    checkpoint moves: the pages the old checkpoint pinned are free again. Without `index_of`,
    and no `checkpoint` call, it would grow by the churn."""
    sizes = {}
    for moving in (True, False):
        path = tmp_path / f"queue-{moving}.lmdb"
        store = LmdbStore(path, index_of=(lambda view: 1) if moving else None)
        for round_ in range(60):
            _put(store, Table.MESSAGES, *((u64(n), f"{round_}".encode() * 400) for n in range(200)))
            store.commit()
            _sync_cycle(store)
        sizes[moving] = path.stat().st_size
        store.close()
    assert sizes[True] * 4 < sizes[False], sizes


def _states_of(view: KvRead) -> dict[int, bytes]:
    return {int.from_bytes(key, "big"): value for key, value in view.scan(Table.MESSAGES)}


def test_a_write_from_another_thread_is_refused_not_deadlocked(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "queue.lmdb")
    _put(store, Table.KINDS, (b"a", b"1"))
    failure: list[BaseException] = []

    def elsewhere() -> None:
        try:
            store.commit()
        except StoreError as error:
            failure.append(error)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and failure and "threaded=True" in str(failure[0])
    store.close()
    threaded = LmdbStore(tmp_path / "threaded.lmdb", threaded=True)
    _put(threaded, Table.KINDS, (b"a", b"1"))
    thread = threading.Thread(target=threaded.commit)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and not threaded.uncommitted
    threaded.close()


def test_a_file_that_is_not_an_lmdb_store_is_refused_in_one_line(tmp_path: Path) -> None:
    legacy = tmp_path / "queue.sqlite"
    legacy.write_bytes(b"SQLite format 3\x00" + bytes(4080))
    with pytest.raises(StoreError, match=r"queues\.migrate"):
        LmdbStore(legacy)
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    with pytest.raises(StoreError, match="not an LMDB queue store"):
        LmdbStore(other)
    corrupt = tmp_path / "corrupt.lmdb"
    store = LmdbStore(corrupt)
    store.abandon()
    side = Path(ckpt.side_path(str(corrupt)))
    side.write_bytes(side.read_bytes()[:-1] + b"\x00")
    with pytest.raises(StoreError, match="corrupt"):
        LmdbStore(corrupt)


# ---- after a storage failure ------------------------------------------------------------------------
def test_discard_undoes_the_uncommitted_group_and_nothing_before_it(store: Store) -> None:
    _put(store, Table.KINDS, (b"committed", b"1"))
    store.commit()
    _put(store, Table.KINDS, (b"uncommitted", b"2"))
    store.discard()
    assert dict(store.read().scan(Table.KINDS)) == {b"committed": b"1"}
    assert not store.uncommitted


def test_a_machine_rolled_back_after_a_failure_closes_as_a_crash_would(tmp_path: Path) -> None:
    """What run_node does after a storage failure (rollback, then close): nothing after the
    failure is committed or recorded as a clean stop, so the next start rolls back to the last
    checkpoint and the log replays the rest; and the machine says the time its state reached."""
    from queues import codec
    from queues.machine import QueueMachine
    from queues.model import Enqueue
    from raft_store.state_machine import Command

    def enqueue(machine: QueueMachine, index: int, now_ms: int) -> None:
        command = Enqueue(kind="transfer", idempotency_key=f"k{index}", ref_key="r", payload=b"p")
        machine.apply_batch(index, now_ms, [Command(0, 0, codec.encode_command(command))])

    path = tmp_path / "queue.lmdb"
    machine = QueueMachine(path)
    assert machine.log_time_ms() == 0
    enqueue(machine, 1, 1_000)
    assert machine.checkpoint() == 1  # the first checkpoint waits for its fsync
    enqueue(machine, 2, 2_000)
    machine.commit()
    enqueue(machine, 3, 3_000)
    assert (machine.applied_index(), machine.log_time_ms()) == (3, 3_000)
    machine.rollback()
    assert (machine.applied_index(), machine.log_time_ms()) == (2, 2_000)
    machine.close()
    assert not Path(ckpt.clean_path(str(path))).exists()
    reopened = QueueMachine(path)
    # The last checkpoint: the first one, or the commit of entry 2 if the syncer's fsync moved it there.
    assert (reopened.applied_index(), reopened.log_time_ms()) in ((1, 1_000), (2, 2_000))
    reopened.close()
