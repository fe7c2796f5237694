"""The reconciliation rules: pure DataFrame -> DataFrame transforms.

Owns: what counts as a break and how much money it puts at stake. Shape of the computation, chosen
for one machine as much as for a cluster: the three ledgers are projected to one narrow "event" shape,
unioned, and grouped once by business id (one shuffle of all inputs, no joins); every class is then
a condition on the grouped row, and the matching rows are exploded into the discrepancy schema in the
same pass. Nothing is cached and no input is scanned twice for the discrepancies.

Classes are exclusive by construction (precedence is documented in docs/reconcile.md):
* a granted red packet without a successful transfer is *missing in the payment ledger* only when no
  transfer request covers it; a covering request reports through its own state instead
  (compensated-but-unpaid, pending past SLA, dead-lettered) or, if open within its SLA, not at all;
* an unmatched transfer is *missing in the red-packet ledger*, never also a duplicate;
* a mismatch is judged on business ids paid exactly once; more payouts are *duplicate payouts*.

Must never: read or write anything, look at a clock, or depend on row order.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ledger.kinds import Kind
from ledger.states import LedgerState
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import DISCREPANCIES, LEDGER_TOTALS, DiscrepancyClass, GrantState, Ledger, TransferStatus

_GRANT: Final = 0
_TRANSFER: Final = 1
_REQUEST: Final = 2

# Flags a request carries into the grouping; each becomes (at most) one discrepancy.
_FLAG_DEAD_LETTERED: Final = "dead_lettered"
_FLAG_PENDING: Final = "pending_past_sla"
_FLAG_SUCCEEDED_IN_DAY: Final = "succeeded_in_day"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LedgerFrames:
    """The three inputs, with at least the columns in ``schemas.NEEDED_COLUMNS``."""

    payment: DataFrame
    red_packet: DataFrame
    compensation: DataFrame


def _between(column: Column, start: object, end: object) -> Column:
    """Half-open interval test; timestamps are instants, so the boundaries are exact."""
    return (column >= F.lit(start)) & (column < F.lit(end))


def _events(
    frame: DataFrame,
    *,
    source: int,
    key: Column,
    at: Column,
    event_id: Column,
    party: Column,
    flag: Column,
    covers: Column,
) -> DataFrame:
    return frame.select(
        key.alias("key"),
        F.lit(source).cast("tinyint").alias("source"),
        at.alias("at"),
        event_id.alias("event_id"),
        party.cast("string").alias("party"),
        F.col("amount_minor").cast("long").alias("amount_minor"),
        F.col("currency").alias("currency"),
        flag.cast("string").alias("flag"),
        covers.cast("boolean").alias("covers"),
    )


def grant_events(red_packet: DataFrame, params: ReconcileParams) -> DataFrame:
    """Granted red packets in the read window (cancelled grants owe nothing)."""
    kept = red_packet.where(
        (F.col("state") == GrantState.GRANTED.value) & _between(F.col("granted_at"), params.read_start, params.read_end)
    )
    nothing = F.lit(None)
    return _events(
        kept,
        source=_GRANT,
        key=F.col("grant_id"),
        at=F.col("granted_at"),
        event_id=F.col("grant_id"),
        party=F.col("recipient"),
        flag=nothing,
        covers=nothing,
    )


def transfer_events(payment: DataFrame, params: ReconcileParams) -> DataFrame:
    """Successful red-packet payouts in the read window; failed or reversed transfers paid nothing."""
    kept = payment.where(
        (F.col("status") == TransferStatus.SUCCEEDED.value)
        & F.col("business_id").isNotNull()
        & _between(F.col("created_at"), params.read_start, params.read_end)
    )
    nothing = F.lit(None)
    return _events(
        kept,
        source=_TRANSFER,
        key=F.col("business_id"),
        at=F.col("created_at"),
        event_id=F.col("transfer_id"),
        party=F.col("payee"),
        flag=nothing,
        covers=nothing,
    )


def request_read_filter(params: ReconcileParams) -> Column:
    """Requests that can matter for the day: created in the window, or still open / dead-lettered.

    Also used by the readers as a pushed-down predicate, so it must only use plain comparisons.
    """
    created = F.col("created_at")
    finished = F.col("finished_at")
    return (created < F.lit(params.read_end)) & (
        (created >= F.lit(params.read_start))
        | finished.isNull()
        | (finished >= F.lit(params.day_start))
        | (F.col("state") == LedgerState.DEAD_LETTERED.value)
    )


def request_events(compensation: DataFrame, params: ReconcileParams) -> DataFrame:
    """Compensation requests with the flag that decides their class, if any.

    Open-at-day-end is reconstructed from timestamps (created before the SLA deadline, not finished
    by day end), so rerunning an old date flags what was late then, not what is late now.
    """
    created = F.col("created_at")
    finished = F.col("finished_at")
    state = F.col("state")
    open_at_day_end = finished.isNull() | (finished >= F.lit(params.day_end))
    flag = (
        F.when(
            (state == LedgerState.DEAD_LETTERED.value) & (finished < F.lit(params.day_end)),
            _FLAG_DEAD_LETTERED,
        )
        .when((created < F.lit(params.sla_deadline)) & open_at_day_end, _FLAG_PENDING)
        .when(
            (F.col("kind") == Kind.TRANSFER.value)
            & (state == LedgerState.SUCCEEDED.value)
            & _between(finished, params.day_start, params.day_end),
            _FLAG_SUCCEEDED_IN_DAY,
        )
    )
    # Every transfer request covers its grant, a discarded one too: finance decided not to pay it,
    # and the reconciliation must never propose paying it again behind their back.
    covers = F.col("kind") == Kind.TRANSFER.value
    at = F.when(flag == _FLAG_PENDING, created).otherwise(F.coalesce(finished, created))
    kept = compensation.where(request_read_filter(params))
    return _events(
        kept,
        source=_REQUEST,
        key=F.col("ref_key"),
        at=at,
        event_id=F.col("request_id"),
        party=F.lit(None),
        flag=flag,
        covers=covers,
    ).where(F.col("flag").isNotNull() | F.col("covers"))


def per_business_id(events: DataFrame) -> DataFrame:
    """One row per business id: its grant, its first transfer and payout total, its flagged requests."""
    source = F.col("source")
    at = F.col("at")
    event = F.struct("at", "event_id", "party", "amount_minor", "currency")
    return events.groupBy("key").agg(
        F.max(F.when(source == _GRANT, event)).alias("grant"),
        F.count_if(source == _TRANSFER).alias("transfer_count"),
        F.min_by(event, F.when(source == _TRANSFER, F.struct(at, F.col("event_id")))).alias("first_transfer"),
        F.sum(F.when(source == _TRANSFER, F.col("amount_minor"))).alias("transfer_amount_total"),
        F.coalesce(F.max(F.when(source == _REQUEST, F.col("covers"))), F.lit(False)).alias("covered"),
        F.collect_list(
            F.when(
                (source == _REQUEST) & F.col("flag").isNotNull(),
                F.struct("flag", "at", "event_id", "amount_minor", "currency"),
            )
        ).alias("flagged_requests"),
    )


def _row(
    discrepancy_class: DiscrepancyClass,
    *,
    transfer_id: Column | None = None,
    request_id: Column | None = None,
    recipient: Column | None = None,
    currency: Column,
    amount: Column,
    expected_amount: Column | None = None,
    actual_amount: Column | None = None,
    expected_currency: Column | None = None,
    actual_currency: Column | None = None,
    occurred_at: Column,
    fixable: bool = False,
) -> Column:
    """One discrepancy as a struct whose fields follow ``schemas.DISCREPANCIES`` (after the date)."""

    def typed(value: Column | None, type_name: str) -> Column:
        return (value if value is not None else F.lit(None)).cast(type_name)

    return F.struct(
        F.lit(discrepancy_class.value).alias("discrepancy_class"),
        F.col("key").alias("business_id"),
        typed(transfer_id, "string").alias("transfer_id"),
        typed(request_id, "string").alias("request_id"),
        typed(recipient, "string").alias("recipient"),
        typed(currency, "string").alias("currency"),
        typed(amount, "long").alias("amount_minor"),
        typed(expected_amount, "long").alias("expected_amount_minor"),
        typed(actual_amount, "long").alias("actual_amount_minor"),
        typed(expected_currency, "string").alias("expected_currency"),
        typed(actual_currency, "string").alias("actual_currency"),
        typed(occurred_at, "timestamp").alias("occurred_at"),
        F.lit(fixable).alias("fixable"),
    )


def _business_id_rows(params: ReconcileParams) -> list[Column]:
    """The classes decided per business id: each a row when its condition holds, else null."""
    grant, first = F.col("grant"), F.col("first_transfer")
    count, total = F.col("transfer_count"), F.col("transfer_amount_total")
    grant_in_day = grant.isNotNull() & _between(grant["at"], params.day_start, params.day_end)
    first_in_day = _between(first["at"], params.day_start, params.day_end)
    same_currency = grant["currency"] == first["currency"]
    mismatch = (grant["amount_minor"] != first["amount_minor"]) | ~same_currency
    return [
        F.when(
            grant_in_day & (count == 0) & ~F.col("covered"),
            _row(
                DiscrepancyClass.MISSING_IN_PAYMENT,
                recipient=grant["party"],
                currency=grant["currency"],
                amount=grant["amount_minor"],
                expected_amount=grant["amount_minor"],
                expected_currency=grant["currency"],
                occurred_at=grant["at"],
                fixable=True,
            ),
        ),
        F.when(
            grant.isNull() & (count > 0) & first_in_day,
            _row(
                DiscrepancyClass.MISSING_IN_RED_PACKET,
                transfer_id=first["event_id"],
                recipient=first["party"],
                currency=first["currency"],
                amount=total,
                actual_amount=total,
                actual_currency=first["currency"],
                occurred_at=first["at"],
            ),
        ),
        F.when(
            grant_in_day & (count == 1) & mismatch,
            _row(
                DiscrepancyClass.AMOUNT_MISMATCH,
                transfer_id=first["event_id"],
                recipient=grant["party"],
                currency=grant["currency"],
                amount=F.when(same_currency, F.abs(first["amount_minor"] - grant["amount_minor"])).otherwise(
                    grant["amount_minor"]
                ),
                expected_amount=grant["amount_minor"],
                actual_amount=first["amount_minor"],
                expected_currency=grant["currency"],
                actual_currency=first["currency"],
                occurred_at=first["at"],
            ),
        ),
        F.when(
            grant.isNotNull() & (count > 1) & first_in_day,
            _row(
                DiscrepancyClass.DUPLICATE_PAYOUT,
                transfer_id=first["event_id"],
                recipient=grant["party"],
                currency=first["currency"],
                amount=total - first["amount_minor"],
                expected_amount=grant["amount_minor"],
                actual_amount=total,
                expected_currency=grant["currency"],
                actual_currency=first["currency"],
                occurred_at=first["at"],
            ),
        ),
    ]


def _request_row(request: Column) -> Column:
    """The class of one flagged request; a succeeded transfer request only breaks when nothing was paid."""
    grant = F.col("grant")

    def row(discrepancy_class: DiscrepancyClass) -> Column:
        return _row(
            discrepancy_class,
            request_id=request["event_id"],
            recipient=grant["party"],
            currency=request["currency"],
            amount=request["amount_minor"],
            expected_amount=request["amount_minor"],
            expected_currency=request["currency"],
            occurred_at=request["at"],
        )

    flag = request["flag"]
    return (
        F.when(flag == _FLAG_DEAD_LETTERED, row(DiscrepancyClass.DEAD_LETTERED))
        .when(flag == _FLAG_PENDING, row(DiscrepancyClass.PENDING_PAST_SLA))
        .when(
            (flag == _FLAG_SUCCEEDED_IN_DAY) & (F.col("transfer_count") == 0),
            row(DiscrepancyClass.COMPENSATED_NOT_PAID),
        )
    )


def classify(grouped: DataFrame, params: ReconcileParams) -> DataFrame:
    """Explode each grouped business id into its discrepancies (usually none)."""
    candidates = F.concat(F.array(*_business_id_rows(params)), F.transform("flagged_requests", _request_row))
    found = grouped.select(F.explode(F.filter(candidates, lambda row: row.isNotNull())).alias("d"))
    return found.select(
        F.lit(params.business_date).cast("date").alias("business_date"),
        *[F.col(f"d.{field.name}").alias(field.name) for field in DISCREPANCIES.fields[1:]],
    )


def all_events(frames: LedgerFrames, params: ReconcileParams) -> DataFrame:
    """The three ledgers in the one narrow event shape the grouping passes read."""
    return (
        grant_events(frames.red_packet, params)
        .unionByName(transfer_events(frames.payment, params))
        .unionByName(request_events(frames.compensation, params))
    )


def _currency_code(currency: Column) -> Column:
    """An exact, fixed-width stand-in for a short currency string; -1 means "compare exactly later".

    Up to 7 UTF-8 bytes fit a long exactly (the byte length is folded in, so leading zero bytes do
    not collide); anything longer or null gets the sentinel, which always makes a candidate.
    """
    size = F.octet_length(currency)
    return F.when(size <= 7, F.conv(F.hex(currency), 16, 10).cast("long") * 8 + size).otherwise(F.lit(-1))


def candidate_keys(events: DataFrame, params: ReconcileParams) -> DataFrame:
    """Business ids that *could* break: a conservative pre-filter for :func:`per_business_id`.

    Why: the exact grouping keeps strings and lists in its aggregation buffers, which forces a
    sort-based aggregation over every input row. This pass keeps only fixed-width buffers (counts,
    instants, amounts, currency codes), which Spark aggregates in a hash map, and passes on the ~1%
    of ids that fail a check; the exact rules then run on those alone.

    Invariant: a superset of the ids :func:`classify` reports. Every condition below is a relaxed copy
    of one in ``_business_id_rows`` or ``_request_row``: a change to a rule must be mirrored here.
    The rule tests run through this filter. A transfer request
    that succeeded today only matters when nothing was paid; that is every normal payout, so it must
    not make a candidate by itself.
    """
    source, at, amount = F.col("source"), F.col("at"), F.col("amount_minor")
    code = _currency_code(F.col("currency"))
    fixed = events.groupBy("key").agg(
        F.count_if(source == _GRANT).alias("grants"),
        F.max(F.when(source == _GRANT, at)).alias("grant_at"),
        F.max(F.when(source == _GRANT, amount)).alias("grant_amount"),
        F.max(F.when(source == _GRANT, code)).alias("grant_code"),
        F.count_if(source == _TRANSFER).alias("transfers"),
        F.min(F.when(source == _TRANSFER, at)).alias("first_at"),
        F.max(F.when(source == _TRANSFER, amount)).alias("paid_amount"),
        F.max(F.when(source == _TRANSFER, code)).alias("paid_code"),
        F.coalesce(F.max(F.when(source == _REQUEST, F.col("covers"))), F.lit(False)).alias("covered"),
        F.count_if((source == _REQUEST) & F.col("flag").isin(_FLAG_DEAD_LETTERED, _FLAG_PENDING)).alias("flagged"),
        F.count_if((source == _REQUEST) & (F.col("flag") == _FLAG_SUCCEEDED_IN_DAY)).alias("succeeded"),
    )
    grants, transfers = F.col("grants"), F.col("transfers")
    grant_in_day = (grants > 0) & _between(F.col("grant_at"), params.day_start, params.day_end)
    first_in_day = _between(F.col("first_at"), params.day_start, params.day_end)
    differs = (
        (F.col("paid_amount") != F.col("grant_amount"))
        | (F.col("paid_code") != F.col("grant_code"))
        | (F.col("grant_code") == -1)
        | (F.col("paid_code") == -1)
    )
    return fixed.where(
        (F.col("flagged") > 0)
        | ((F.col("succeeded") > 0) & (transfers == 0))
        | (grant_in_day & (transfers == 0) & ~F.col("covered"))
        | ((grants == 0) & (transfers > 0) & first_in_day)
        | (grant_in_day & (transfers == 1) & differs)
        | ((grants > 0) & (transfers > 1) & first_in_day)
    ).select("key")


def find_discrepancies(frames: LedgerFrames, params: ReconcileParams) -> DataFrame:
    """All row-level breaks of the business date, in ``schemas.DISCREPANCIES`` layout.

    Two passes over the events: the fixed-width :func:`candidate_keys`, then the exact rules on the
    candidates' events only (a broadcast semi-join; the candidates are a small fraction of ids).
    """
    events = all_events(frames, params)
    candidates = F.broadcast(candidate_keys(events, params))
    return classify(per_business_id(events.join(candidates, "key", "left_semi")), params)


def ledger_totals(frames: LedgerFrames, params: ReconcileParams) -> DataFrame:
    """Per ledger and currency: rows read, and count and amount of the business day's money movements.

    Red packets count when granted that day, payments when they succeeded that day, compensation
    when a transfer request succeeded that day. Every ledger by its own clock: a late payment counts on
    the day it happened, so the net difference also shows timing, which finance expects.
    """

    def totals(frame: DataFrame, ledger: Ledger, in_day: Column) -> DataFrame:
        return frame.groupBy("currency").agg(
            F.lit(ledger.value).alias("ledger"),
            F.count(F.lit(1)).alias("rows_read"),
            F.count_if(in_day).alias("day_count"),
            F.coalesce(F.sum(F.when(in_day, F.col("amount_minor"))), F.lit(0)).cast("long").alias("day_amount_minor"),
        )

    day = (params.day_start, params.day_end)
    parts = [
        totals(
            frames.red_packet,
            Ledger.RED_PACKET,
            (F.col("state") == GrantState.GRANTED.value) & _between(F.col("granted_at"), *day),
        ),
        totals(
            frames.payment,
            Ledger.PAYMENT,
            (F.col("status") == TransferStatus.SUCCEEDED.value) & _between(F.col("created_at"), *day),
        ),
        totals(
            frames.compensation,
            Ledger.COMPENSATION,
            (F.col("kind") == Kind.TRANSFER.value)
            & (F.col("state") == LedgerState.SUCCEEDED.value)
            & _between(F.col("finished_at"), *day),
        ),
    ]
    union = parts[0].unionByName(parts[1]).unionByName(parts[2])
    return union.select(*[F.col(field.name).cast(field.dataType) for field in LEDGER_TOTALS.fields])


def class_totals(discrepancies: DataFrame) -> DataFrame:
    """Counts and amounts per class and currency: the run summary's core."""
    return discrepancies.groupBy("discrepancy_class", "currency").agg(
        F.count(F.lit(1)).alias("discrepancy_count"),
        F.coalesce(F.sum("amount_minor"), F.lit(0)).cast("long").alias("amount_minor"),
    )


__all__ = [
    "LedgerFrames",
    "class_totals",
    "classify",
    "find_discrepancies",
    "ledger_totals",
    "per_business_id",
    "request_read_filter",
]
