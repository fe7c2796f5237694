"""The dead-letter tier's amount index (queues/core/dead_amounts.py): a summary over an amount range
from bucket aggregates equals a scan of every matching letter, on random tiers that letters enter
and leave by every path (permanent failure, redrive, edit-redrive, discard, a redrive job), and the
index a store kept from its first letter is the index a rebuild makes from the tier alone.
"""

from __future__ import annotations

import json
import os
from typing import Any

import lmdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queue_node import Node

from queues.core import dead_amounts, dead_letters
from queues.core.canonical import store_digest
from queues.core.port import Table
from queues.model import (
    Code,
    DeadLetterFilter,
    Discard,
    EditRedrive,
    Enqueue,
    Fail,
    Lease,
    LeaseResult,
    Redrive,
    RedriveJob,
    StepJob,
)
from queues.stores.lmdb_store import LmdbStore

INT64 = (-(1 << 63), (1 << 63) - 1)
AMOUNTS = st.one_of(
    st.integers(0, 1200),
    st.integers(-1200, 1200),
    st.sampled_from([0, 99, 100, 109, 110, 999, 1000, 1099, 10**17, *INT64, INT64[0] + 1, INT64[1] - 1]),
    st.integers(*INT64),
    st.none(),  # no amount: a payload with a text amount
)
BOUNDS = st.one_of(st.none(), st.integers(0, 1300), st.sampled_from([0, 100, 109, 110, 1000, 10**17, INT64[1]]))


@given(st.integers(*INT64))
def test_a_bucket_holds_its_amount_and_is_two_significant_digits_wide(amount: int) -> None:
    low, high = dead_amounts.bucket_of(amount)
    assert INT64[0] <= low <= amount <= high <= INT64[1]
    assert dead_amounts.bucket_of(low) == (low, high) == dead_amounts.bucket_of(high)
    if high < INT64[1]:
        assert dead_amounts.bucket_of(high + 1)[0] == high + 1  # the buckets tile the integers
    assert high - low + 1 <= max(1, min(abs(low), abs(high)) // 10 + 1)


def _payload(amount: int | None, currency: str | None) -> bytes:
    return json.dumps({"transfer_id": "t", "amount_minor": "n/a" if amount is None else amount,
                       "currency": currency}).encode()  # fmt: skip


def _kill(node: Node, ids: list[int]) -> None:
    """Lease every waiting message and fail it permanently: into the tier."""
    while True:
        lease = node.apply(Lease(worker_id="w", count_max=100, lease_ms=30_000))
        assert isinstance(lease, LeaseResult)
        if not lease.grants:
            return
        for grant in lease.grants:
            error = "insufficient_funds" if grant.message_id % 3 else "account_frozen"
            node.apply(Fail(message_id=grant.message_id, token=grant.token, error_class=error, permanent=True))
        node.now_ms += 1000


LETTERS = st.lists(st.tuples(AMOUNTS, st.sampled_from(["CNY", "JPY", None]), st.sampled_from(["transfer", "callback"])),
                   min_size=1, max_size=40)  # fmt: skip
MOVES = st.lists(st.tuples(st.sampled_from(["redrive", "edit", "discard", "job", "stay"]), st.integers(0, 39), AMOUNTS),
                 max_size=25)  # fmt: skip


@settings(max_examples=int(os.environ.get("DEAD_AMOUNTS_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LETTERS, MOVES, st.lists(st.tuples(BOUNDS, BOUNDS, st.sampled_from([None, "transfer"]),
                                          st.sampled_from([None, "CNY", "JPY"])), min_size=1, max_size=12))  # fmt: skip
def test_an_amount_range_summary_equals_a_scan_as_letters_enter_and_leave(
    letters: list[tuple[int | None, str | None, str]], moves: list[tuple[str, int, int | None]],
    ranges: list[tuple[int | None, int | None, str | None, str | None]],
) -> None:  # fmt: skip
    node = Node()
    ids = [node.apply(Enqueue(kind=kind, idempotency_key=f"k{n}", ref_key="r", payload=_payload(amount, currency))).message_id  # type: ignore[union-attr]
           for n, (amount, currency, kind) in enumerate(letters)]  # fmt: skip
    _kill(node, ids)
    assert node.machine.view.count(Table.DEAD) == len(ids)
    for n, (move, pick, amount) in enumerate(moves):
        target = ids[pick % len(ids)]
        command: Any
        if move == "redrive":
            command = Redrive(actor="o", reason="r", ids=(target,))
        elif move == "edit":
            command = EditRedrive(message_id=target, payload=_payload(amount, "CNY"), actor="o", reason=f"e{n}")
        elif move == "discard":
            command = Discard(message_id=target, actor="o", reason="r")
        elif move == "job":
            created = node.apply(RedriveJob(actor="o", reason="r", ids=(target,), rate_per_s=100))
            command = None if created.code is not Code.OK else StepJob(job_id=created.job_id, limit=10)  # type: ignore[union-attr]
        else:
            command = None
        if command is not None:
            node.apply(command)
        node.now_ms += 1000
        if n % 4 == 3:
            _kill(node, ids)  # what was redriven dies again, edited versions among them
    view = node.machine.view
    for low, high, kind, currency in ranges:
        if low is not None and high is not None and low > high:
            low, high = high, low
        chosen = DeadLetterFilter(kind=kind, currency=currency, amount_min_minor=low, amount_max_minor=high)
        assert dead_letters.summary(view, chosen) == dead_letters.scanned_summary(view, chosen), chosen
    kept = store_digest(view)
    with node.machine.store.write() as tx:
        dead_letters.rebuild_amount_index(tx)
    assert store_digest(node.machine.view) == kept  # kept from the first letter == built from the tier alone
    assert dead_letters.amount_index_current(node.machine.view)


def test_a_store_of_an_earlier_version_gets_the_amount_index_on_open(tmp_path: Any) -> None:
    """A file written before the index existed has no such tables: a read-only open reads them as
    empty, and the machine's open creates and rebuilds them; the summary then answers an amount
    range as a scan does."""
    path = tmp_path / "queue.lmdb"
    node = Node(str(path))
    ids = [node.apply(Enqueue(kind="transfer", idempotency_key=f"k{n}", ref_key="r",
                              payload=_payload(100 + n * 7, "CNY"))).message_id for n in range(50)]  # type: ignore[union-attr]  # fmt: skip
    _kill(node, ids)
    before = node.machine.digest()
    node.machine.close()
    env = lmdb.open(str(path), subdir=False, max_dbs=64)
    with env.begin(write=True) as txn:  # as an earlier version wrote it
        for table in (Table.DEAD_AMOUNTS, Table.DEAD_BUCKETS):
            txn.drop(env.open_db(table.name.lower().encode(), txn=txn), delete=True)
    env.close()
    older = LmdbStore(path, readonly=True)
    assert older.read().count(Table.DEAD_AMOUNTS) == 0 and older.read().count(Table.DEAD) == 50
    assert not dead_letters.amount_index_current(older.read())
    older.close()
    reopened = Node(str(path))
    view = reopened.machine.view
    assert dead_letters.amount_index_current(view) and view.count(Table.DEAD_AMOUNTS) == 50
    assert reopened.machine.digest() == before  # derived state only: the canonical state is unchanged
    chosen = DeadLetterFilter(currency="CNY", amount_min_minor=150, amount_max_minor=301)
    summary = dead_letters.summary(view, chosen)
    assert summary == dead_letters.scanned_summary(view, chosen) and summary.count == 21  # 100 + 7n, n in 8..28
    reopened.machine.close()
