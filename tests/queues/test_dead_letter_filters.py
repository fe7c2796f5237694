"""Dead letters by money and attempts: the filter's amount, currency and attempt bounds, read from
the current payload by SQLite's JSON functions, in pages, in a filter redrive and in the summary.

In process, through `apply_batch` bytes (tests/queues/queue_node.py), and through the query codec.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from queue_node import Node

from queues import codec
from queues import query_codec as qc
from queues.core import reads as queries
from queues.core.answers import answer_query
from queues.model import (
    BatchResult,
    Code,
    DeadLetterFilter,
    DeadLetterSummary,
    Enqueue,
    ErrorResult,
    Fail,
    Lease,
    LeaseResult,
    Redrive,
)


def money(amount: object, currency: object = "EUR", **more: object) -> bytes:
    return json.dumps({"transfer_id": "t", "amount_minor": amount, "currency": currency, **more}).encode()


def dead_with(node: Node, *payloads: bytes, fails: int = 1) -> list[int]:
    """One dead letter per payload, in order, each after `fails` deliveries (the last permanent)."""
    first = node.index
    results = node.apply_many(
        [Enqueue(kind="transfer", idempotency_key=f"k{first}-{i}", ref_key="r", payload=p) for i, p in enumerate(payloads)]
    )
    ids = [r.message_id for r in results]  # type: ignore[union-attr]
    for attempt in range(fails):
        lease = node.apply(Lease(worker_id="w", count_max=len(ids), lease_ms=30_000))
        assert isinstance(lease, LeaseResult) and sorted(g.message_id for g in lease.grants) == sorted(ids)
        last = attempt == fails - 1
        node.apply_many([Fail(message_id=g.message_id, token=g.token, error_class="insufficient_funds", permanent=last,
                              not_before_ms=node.now_ms) for g in lease.grants])  # fmt: skip
        node.now_ms += 1000 if last else 86_400_000  # past the retry's due time
    return ids


def page_ids(node: Node, dead_filter: DeadLetterFilter, limit: int = 100) -> list[int]:
    """Every match, through pages of `limit` with their cursor."""
    found: list[int] = []
    cursor = None
    while True:
        page = queries.dead_letters(node.machine.view, dead_filter, now_ms=node.now_ms, cursor=cursor, limit=limit)
        found.extend(m.message_id for m in page.items)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def test_amount_currency_and_attempt_bounds_select_from_the_current_payload() -> None:
    node = Node()
    eur_100, eur_900, usd_500 = dead_with(node, money(100), money(900), money(500, "USD"))
    text_amount, no_json, no_currency = dead_with(node, money("100"), b"not json {", money(300, None))
    array, float_amount = dead_with(node, b"[1, 2]", money(1.5))
    (twice,) = dead_with(node, money(700), fails=2)
    (edited,) = dead_with(node, money(50))
    assert node.apply(Redrive(actor="o", reason="fix", ids=(edited,), payload=money(5000, "GBP"))).code is Code.OK
    lease = node.apply(Lease(worker_id="w", count_max=1, lease_ms=30_000))
    assert isinstance(lease, LeaseResult)
    node.apply(Fail(message_id=edited, token=lease.grants[0].token, error_class="insufficient_funds", permanent=True))

    def ids(**bounds: object) -> list[int]:
        return page_ids(node, DeadLetterFilter(**bounds), limit=2)  # type: ignore[arg-type]

    everything = [eur_100, eur_900, usd_500, text_amount, no_json, no_currency, array, float_amount, twice, edited]
    assert ids() == everything
    assert ids(currency="EUR") == [eur_100, eur_900, text_amount, float_amount, twice]
    assert ids(currency="GBP") == [edited]  # the edited payload's, not the original's
    assert ids(amount_min_minor=100, amount_max_minor=500) == [eur_100, usd_500, no_currency]
    assert ids(amount_min_minor=0) == [eur_100, eur_900, usd_500, no_currency, twice, edited]  # integers only
    assert ids(amount_max_minor=50) == []  # 50 was the original's amount
    assert ids(currency="EUR", amount_min_minor=500) == [eur_900, twice]
    assert ids(attempts_min=2) == [twice, edited] and ids(attempts_max=1, currency="USD") == [usd_500]
    assert ids(attempts_min=2, attempts_max=2, amount_min_minor=1000) == [edited]
    redrive = node.apply(Redrive(actor="o", reason="topped up", filter=DeadLetterFilter(currency="EUR",
                                                                                           amount_min_minor=500)))
    assert isinstance(redrive, BatchResult) and redrive.ids == (eur_900, twice)
    assert ids(currency="EUR") == [eur_100, text_amount, float_amount]


def test_pages_with_a_money_filter_keep_their_order_and_cursor_under_new_traffic() -> None:
    node = Node()
    expected: list[int] = []
    for round_ in range(4):
        expected += [i for n, i in enumerate(dead_with(node, *(money(10 * n, "EUR" if n % 3 else "USD")
                                                                 for n in range(12)))) if n % 3]  # fmt: skip
        node.now_ms += round_  # several letters share a dead_ms: the id orders them
    dead_filter = DeadLetterFilter(currency="EUR")
    seen: list[int] = []
    cursor = None
    while True:
        page = queries.dead_letters(node.machine.view, dead_filter, now_ms=node.now_ms, cursor=cursor, limit=5)
        seen.extend(m.message_id for m in page.items)
        assert [(m.dead_ms, m.message_id) for m in page.items] == sorted((m.dead_ms, m.message_id) for m in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        dead_with(node, money(1, "EUR"))  # a later letter sorts after every cursor handed out
    assert seen[: len(expected)] == expected and seen == sorted(seen)
    assert queries.dead_letter_ids(node.machine.view, dead_filter, limit=7) == expected[:7]


def test_the_summary_counts_sums_per_currency_and_names_the_oldest() -> None:
    node = Node()
    conn = node.machine.view
    assert queries.dead_letter_summary(conn, DeadLetterFilter()) == DeadLetterSummary()
    node.now_ms += 5
    first = dead_with(node, money(300, "USD"), money(200), b"plain", money(100), money("9", "EUR"))
    big = 4 * 10**18  # three of them overflow a 64-bit sum
    later = dead_with(node, money(big, "CNY"), money(big, "CNY"), money(big, "CNY"))
    summary = queries.dead_letter_summary(conn, DeadLetterFilter())
    assert summary == DeadLetterSummary(
        count=8, by_currency=(("CNY", 3, 3 * big), ("EUR", 2, 300), ("USD", 1, 300)), without_amount=2,
        oldest_dead_ms=node.now_ms - 2000, oldest_id=first[0],
    )  # fmt: skip
    eur = queries.dead_letter_summary(conn, DeadLetterFilter(currency="EUR", amount_max_minor=250))
    assert (eur.count, eur.by_currency, eur.without_amount, eur.oldest_id) == (2, (("EUR", 2, 300),), 0, first[1])
    assert queries.dead_letter_summary(conn, DeadLetterFilter(dead_from_ms=node.now_ms - 1000)).oldest_id == later[0]
    none = queries.dead_letter_summary(conn, DeadLetterFilter(kind="callback"))
    assert none == DeadLetterSummary(count=0, oldest_dead_ms=None, oldest_id=None)
    answer = answer_query(conn, qc.DeadLetterSummary(filter=DeadLetterFilter(currency="EUR")), node.now_ms)
    wire = qc.decode_answer(qc.encode_answer(answer))
    assert isinstance(wire, qc.DeadLetterSummaryAnswer) and wire.summary.count == 3


def test_a_currency_with_no_utf8_is_no_currency_and_never_stops_the_apply() -> None:
    """A lone surrogate in the JSON (`"\\ud800"`) is text no key or record can hold: a payload
    that spells its currency so must enter the tier as one without a currency, not fail the entry
    on every replica."""
    node = Node()
    (dead,) = dead_with(node, b'{"amount_minor": 5, "currency": "\\ud800"}')
    summary = queries.dead_letter_summary(node.machine.view, DeadLetterFilter())
    assert (summary.count, summary.by_currency, summary.without_amount, summary.oldest_id) == (1, (), 1, dead)


def test_old_encodings_decode_the_same_and_empty_ranges_are_refused_at_decode() -> None:
    old = {"t": "redrive", "actor": "o", "reason": "r", "filter": {"kind": "transfer", "ref_key": None}, "limit": 10}
    decoded = codec.decode_command(bytes([codec.CODEC_VERSION]) + msgspec.msgpack.encode(old))
    assert isinstance(decoded, Redrive) and decoded.filter == DeadLetterFilter(kind="transfer")
    # A filter using none of the new fields encodes as one from before them (older nodes read it).
    assert msgspec.msgpack.encode(DeadLetterFilter(kind="transfer")) == msgspec.msgpack.encode({"kind": "transfer"})
    for bad in ({"amount_min_minor": 5, "amount_max_minor": 4}, {"attempts_min": 3, "attempts_max": 2},
                {"currency": "eur"}, {"amount_min_minor": -1}, {"colour": "red"}):  # fmt: skip
        command = {**old, "filter": bad}
        refused = codec.decode_command(bytes([codec.CODEC_VERSION]) + msgspec.msgpack.encode(command))
        assert isinstance(refused, ErrorResult) and refused.code is Code.INVALID, bad
        query = {"q": "dead_summary", "filter": bad}
        answer = qc.decode_query(bytes([qc.QUERY_CODEC_VERSION]) + msgspec.msgpack.encode(query))
        assert isinstance(answer, qc.QueryError) and answer.code is qc.QueryErrorCode.INVALID, bad
    with pytest.raises(ValueError, match="amount range is empty"):
        DeadLetterFilter(amount_min_minor=2, amount_max_minor=1)
    same = DeadLetterFilter(dead_from_ms=5, dead_to_ms=1)  # as before: an empty time range matches nothing
    assert codec.decode_command(codec.encode_command(Redrive(actor="o", reason="r", filter=same))) == Redrive(
        actor="o", reason="r", filter=same
    )
