"""One test per discrepancy class, each on a tiny in-code ledger compared whole with the expected rows.

Every test also carries look-alikes that must *not* be reported, because a rule that over-reports is
as wrong as one that misses: finance would chase breaks that are not there.
"""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual
from reconcile_ledgers import at, discrepancies, grant, ledgers, request, transfer

from ledger.kinds import Kind
from spark_reconcile import rules
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import LEDGER_TOTALS

pytestmark = pytest.mark.spark


def test_a_clean_day_has_no_discrepancies(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-1", 500, "CNY", at(10)),
            grant("g-late", 800, "CNY", at(23, 50)),  # paid after midnight, inside the late window
            grant("g-cancelled", 300, "CNY", at(11), state="CANCELLED"),  # owes nothing
        ],
        transfers=[
            transfer("t-1", "g-1", 500, "CNY", at(10, 1)),
            transfer("t-1-failed", "g-1", 500, "CNY", at(10), status="FAILED"),  # a failed try paid nothing
            transfer("t-late", "g-late", 800, "CNY", at(1, 30, days=1)),
            transfer("t-other", None, 999, "CNY", at(12)),  # not a red-packet payout
        ],
        requests=[request("r-1", "g-1", 500, "CNY", "SUCCEEDED", at(10), at(10, 1))],
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), discrepancies(spark))


def test_missing_in_payment_only_when_nothing_covers_the_grant(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-unpaid", 500, "CNY", at(10), recipient="u-7"),
            grant("g-in-flight", 600, "CNY", at(21)),  # an open request within its SLA covers it
            grant("g-yesterday", 700, "CNY", at(22, days=-1)),  # yesterday's break, not today's
        ],
        requests=[request("r-1", "g-in-flight", 600, "CNY", "IN_FLIGHT", at(21, 1))],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "missing_in_payment",
            "business_id": "g-unpaid",
            "recipient": "u-7",
            "currency": "CNY",
            "amount_minor": 500,
            "expected_amount_minor": 500,
            "expected_currency": "CNY",
            "occurred_at": at(10),
            "fixable": True,
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_missing_in_red_packet_is_a_payout_nobody_granted(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[grant("g-early", 100, "USD", at(20, days=-1))],  # granted last evening, inside the window
        transfers=[
            transfer("t-stray", "x-1", 300, "USD", at(9), payee="u-9"),
            transfer("t-early", "g-early", 100, "USD", at(0, 5)),
            transfer("t-failed", "x-2", 300, "USD", at(9), status="FAILED"),
            transfer("t-tomorrow", "x-3", 300, "USD", at(2, days=1)),  # tomorrow's break
        ],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "missing_in_red_packet",
            "business_id": "x-1",
            "transfer_id": "t-stray",
            "recipient": "u-9",
            "currency": "USD",
            "amount_minor": 300,
            "actual_amount_minor": 300,
            "actual_currency": "USD",
            "occurred_at": at(9),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_amount_or_currency_mismatch_puts_the_difference_or_the_grant_at_stake(
    spark: SparkSession, params: ReconcileParams
) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-short", 500, "CNY", at(10), recipient="u-2"),
            grant("g-wrong-currency", 700, "CNY", at(11), recipient="u-3"),
            grant("g-right", 900, "EUR", at(12)),
        ],
        transfers=[
            transfer("t-short", "g-short", 480, "CNY", at(10, 1)),
            transfer("t-wrong-currency", "g-wrong-currency", 700, "USD", at(11, 1)),
            transfer("t-right", "g-right", 900, "EUR", at(12, 1)),
        ],
        requests=[request("r-1", "g-short", 500, "CNY", "SUCCEEDED", at(10), at(10, 1))],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "amount_or_currency_mismatch",
            "business_id": "g-short",
            "transfer_id": "t-short",
            "recipient": "u-2",
            "currency": "CNY",
            "amount_minor": 20,
            "expected_amount_minor": 500,
            "actual_amount_minor": 480,
            "expected_currency": "CNY",
            "actual_currency": "CNY",
            "occurred_at": at(10, 1),
        },
        {
            "discrepancy_class": "amount_or_currency_mismatch",
            "business_id": "g-wrong-currency",
            "transfer_id": "t-wrong-currency",
            "recipient": "u-3",
            "currency": "CNY",
            "amount_minor": 700,
            "expected_amount_minor": 700,
            "actual_amount_minor": 700,
            "expected_currency": "CNY",
            "actual_currency": "USD",
            "occurred_at": at(11, 1),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_duplicate_payout_reports_the_extra_money(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[grant("g-twice", 500, "EUR", at(10), recipient="u-4"), grant("g-once", 200, "EUR", at(10))],
        transfers=[
            transfer("t-b", "g-twice", 500, "EUR", at(10, 10)),
            transfer("t-a", "g-twice", 500, "EUR", at(10, 1)),
            transfer("t-c", "g-twice", 500, "EUR", at(10, 20)),
            transfer("t-once", "g-once", 200, "EUR", at(10, 1)),
            transfer("t-once-failed", "g-once", 200, "EUR", at(10, 2), status="FAILED"),
        ],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "duplicate_payout",
            "business_id": "g-twice",
            "transfer_id": "t-a",
            "recipient": "u-4",
            "currency": "EUR",
            "amount_minor": 1000,
            "expected_amount_minor": 500,
            "actual_amount_minor": 1500,
            "expected_currency": "EUR",
            "actual_currency": "EUR",
            "occurred_at": at(10, 1),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_one_transfer_id_paid_twice_by_a_payment_system_without_dedup_is_a_duplicate_payout(
    spark: SparkSession, params: ReconcileParams
) -> None:
    """Two payments under one transfer id (two rows of payment_transfers, the payment system's own
    payment ids apart): what a re-send does to a payment system that does not deduplicate."""
    frames = ledgers(
        spark,
        grants=[grant("g-1", 300, "CNY", at(10), recipient="u-1")],
        transfers=[transfer("t-1", "g-1", 300, "CNY", at(10, 5)), transfer("t-1", "g-1", 300, "CNY", at(10, 6))],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "duplicate_payout", "business_id": "g-1", "transfer_id": "t-1", "recipient": "u-1",
            "currency": "CNY", "amount_minor": 300, "expected_amount_minor": 300, "actual_amount_minor": 600,
            "expected_currency": "CNY", "actual_currency": "CNY", "occurred_at": at(10, 5),
        },
    )  # fmt: skip
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_compensated_but_absent_from_the_payment_ledger(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[grant("g-ghost", 900, "SGD", at(9), recipient="u-5"), grant("g-paid", 400, "SGD", at(9))],
        transfers=[transfer("t-paid", "g-paid", 400, "SGD", at(12))],
        requests=[
            request("r-ghost", "g-ghost", 900, "SGD", "SUCCEEDED", at(9, 1), at(12)),
            request("r-paid", "g-paid", 400, "SGD", "SUCCEEDED", at(9, 1), at(12)),
        ],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "compensated_not_in_payment",
            "business_id": "g-ghost",
            "request_id": "r-ghost",
            "recipient": "u-5",
            "currency": "SGD",
            "amount_minor": 900,
            "expected_amount_minor": 900,
            "expected_currency": "SGD",
            "occurred_at": at(12),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_pending_past_sla_is_judged_at_the_end_of_the_business_day(
    spark: SparkSession, params: ReconcileParams
) -> None:
    assert params.pending_sla.total_seconds() == 4 * 3600  # deadline: 20:00 on the business day
    frames = ledgers(
        spark,
        grants=[grant("g-stuck", 300, "CNY", at(7), recipient="u-6"), grant("g-fresh", 300, "CNY", at(21))],
        requests=[
            request("r-stuck", "g-stuck", 300, "CNY", "PENDING", at(8)),
            request("r-fresh", "g-fresh", 300, "CNY", "PENDING", at(21)),  # within its SLA
            # Open at day end, finished the next morning: it was late *that* night.
            request("r-was-late", "g-stuck-2", 50, "CNY", "SUCCEEDED", at(19), at(3, days=1)),
            request("r-callback", "o-1", None, None, "IN_FLIGHT", at(6), kind=Kind.CALLBACK.value),  # no amount
        ],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "pending_past_sla",
            "business_id": "g-stuck",
            "request_id": "r-stuck",
            "recipient": "u-6",
            "currency": "CNY",
            "amount_minor": 300,
            "expected_amount_minor": 300,
            "expected_currency": "CNY",
            "occurred_at": at(8),
        },
        {
            "discrepancy_class": "pending_past_sla",
            "business_id": "g-stuck-2",
            "request_id": "r-was-late",
            "currency": "CNY",
            "amount_minor": 50,
            "expected_amount_minor": 50,
            "expected_currency": "CNY",
            "occurred_at": at(19),
        },
        {
            "discrepancy_class": "pending_past_sla",
            "business_id": "o-1",
            "request_id": "r-callback",
            "occurred_at": at(6),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_dead_lettered_until_redriven_or_discarded(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-dead", 250, "USD", at(9), recipient="u-8"),
            grant("g-redriven", 250, "USD", at(9)),
            grant("g-discarded", 250, "USD", at(9), state="CANCELLED"),  # the red packet was withdrawn
            grant("g-waived", 400, "USD", at(9)),  # still granted, but finance discarded its request
        ],
        transfers=[transfer("t-redriven", "g-redriven", 250, "USD", at(11))],
        requests=[
            request("r-dead", "g-dead", 250, "USD", "DEAD_LETTERED", at(9, 1), at(11)),
            request("r-old-dead", "g-old", 75, "USD", "DEAD_LETTERED", at(9, days=-3), at(10, days=-3)),
            # Finance resolved these dead letters: one redriven and paid, one discarded.
            request("r-redriven", "g-redriven", 250, "USD", "SUCCEEDED", at(9, 1), at(11)),
            request("r-discarded", "g-discarded", 250, "USD", "CANCELLED", at(9, 1), at(11)),
            request("r-waived", "g-waived", 400, "USD", "CANCELLED", at(9, 1), at(11)),  # never proposed again
        ],
    )
    expected = discrepancies(
        spark,
        {
            "discrepancy_class": "dead_lettered_unresolved",
            "business_id": "g-dead",
            "request_id": "r-dead",
            "recipient": "u-8",
            "currency": "USD",
            "amount_minor": 250,
            "expected_amount_minor": 250,
            "expected_currency": "USD",
            "occurred_at": at(11),
        },
        {
            "discrepancy_class": "dead_lettered_unresolved",
            "business_id": "g-old",
            "request_id": "r-old-dead",
            "currency": "USD",
            "amount_minor": 75,
            "expected_amount_minor": 75,
            "expected_currency": "USD",
            "occurred_at": at(10, days=-3),
        },
    )
    assertDataFrameEqual(rules.find_discrepancies(frames, params), expected)


def test_ledger_totals_count_each_ledger_by_its_own_clock(spark: SparkSession, params: ReconcileParams) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-1", 500, "CNY", at(10)),
            grant("g-2", 800, "CNY", at(23, 50)),
            grant("g-3", 300, "CNY", at(11), state="CANCELLED"),
            grant("g-4", 900, "USD", at(23, days=-1)),
        ],
        transfers=[
            transfer("t-1", "g-1", 500, "CNY", at(10, 1)),
            transfer("t-2", "g-2", 800, "CNY", at(0, 10, days=1)),
            transfer("t-4", "g-4", 900, "USD", at(0, 5)),
            transfer("t-5", "g-1", 500, "CNY", at(10), status="FAILED"),
        ],
        requests=[request("r-1", "g-1", 500, "CNY", "SUCCEEDED", at(10), at(10, 1))],
    )
    expected = spark.createDataFrame(
        [
            ("red_packet_grants", "CNY", 3, 2, 1300),
            ("red_packet_grants", "USD", 1, 0, 0),
            ("payment_transfers", "CNY", 3, 1, 500),
            ("payment_transfers", "USD", 1, 1, 900),
            ("compensation_requests", "CNY", 1, 1, 500),
        ],
        LEDGER_TOTALS,
    )
    assertDataFrameEqual(rules.ledger_totals(frames, params), expected)


def test_class_totals_sum_counts_and_amounts_per_currency(spark: SparkSession) -> None:
    found = discrepancies(
        spark,
        {"discrepancy_class": "duplicate_payout", "business_id": "a", "currency": "EUR", "amount_minor": 5},
        {"discrepancy_class": "duplicate_payout", "business_id": "b", "currency": "EUR", "amount_minor": 7},
        {"discrepancy_class": "duplicate_payout", "business_id": "c", "currency": "USD", "amount_minor": 1},
        {"discrepancy_class": "pending_past_sla", "business_id": "d"},
    )
    expected = spark.createDataFrame(
        [
            ("duplicate_payout", "EUR", 2, 12),
            ("duplicate_payout", "USD", 1, 1),
            ("pending_past_sla", None, 1, 0),
        ],
        "discrepancy_class string, currency string, discrepancy_count long, amount_minor long",
    )
    assertDataFrameEqual(rules.class_totals(found), expected)


def test_candidate_keys_keep_every_possible_break_and_drop_clean_ids(
    spark: SparkSession, params: ReconcileParams
) -> None:
    frames = ledgers(
        spark,
        grants=[
            grant("g-clean", 500, "CNY", at(10)),
            grant("g-currency", 500, "CNY", at(10)),  # same amount, other currency: codes must differ
            grant("g-long-code", 500, "XAU-GRAM", at(10)),  # too long for a code: compared exactly later
            grant("g-covered", 500, "CNY", at(21)),
            grant("g-unpaid", 500, "CNY", at(10)),
        ],
        transfers=[
            transfer("t-clean", "g-clean", 500, "CNY", at(10, 1)),
            transfer("t-currency", "g-currency", 500, "CNH", at(10, 1)),
            transfer("t-long-code", "g-long-code", 500, "XAU-GRAM", at(10, 1)),
        ],
        requests=[
            request("r-clean", "g-clean", 500, "CNY", "SUCCEEDED", at(10), at(10, 1)),
            request("r-covered", "g-covered", 500, "CNY", "PENDING", at(21)),
        ],
    )
    candidates = rules.candidate_keys(rules.all_events(frames, params), params)
    expected = spark.createDataFrame([("g-currency",), ("g-long-code",), ("g-unpaid",)], "key string")
    assertDataFrameEqual(candidates, expected)
