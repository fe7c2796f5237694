"""The same reconciliation in DuckDB: the single-machine alternative, and the test oracle.

Owns: one SQL formulation of the rules over the Parquet exports, written independently of
:mod:`spark_reconcile.rules` (per-class joins and anti-joins instead of one grouped pass), so an
agreement between the two is evidence, not a tautology. The precedence rules are the ones in
docs/reconcile.md.

Must never: import Spark.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final

import duckdb
import pyarrow as pa

from ledger.kinds import Kind
from ledger.states import LedgerState
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import Ledger


def _literal(value: str) -> str:
    """A vocabulary value as a SQL string literal; only plain words, so no quoting can go wrong."""
    assert re.fullmatch(r"[A-Za-z_]+", value), value
    return f"'{value}'"


# The compensation ledger's vocabulary comes from the enums the service writes it with, so the
# oracle cannot drift from the rules on a renamed kind or state.
_VOCABULARY: Final = {
    "transfer_kind": _literal(Kind.TRANSFER.value),
    "request_succeeded": _literal(LedgerState.SUCCEEDED.value),
    "request_dead_lettered": _literal(LedgerState.DEAD_LETTERED.value),
    "request_cancelled": _literal(LedgerState.CANCELLED.value),
}

_SQL: Final = """
WITH
grants AS (
    SELECT grant_id, recipient, amount_minor, currency, granted_at
    FROM read_parquet($red_packet)
    WHERE state = 'GRANTED' AND granted_at >= $read_start AND granted_at < $read_end),
paid AS (
    SELECT transfer_id, business_id, payee, amount_minor, currency, created_at
    FROM read_parquet($payment)
    WHERE status = 'SUCCEEDED' AND business_id IS NOT NULL
      AND created_at >= $read_start AND created_at < $read_end),
requests AS (
    SELECT request_id, kind, ref_key, amount_minor, currency, state, created_at, finished_at
    FROM read_parquet($compensation)
    WHERE created_at < $read_end AND (created_at >= $read_start OR finished_at IS NULL
          OR finished_at >= $day_start OR state = {request_dead_lettered})),
payouts AS (
    SELECT business_id, count(*) AS n, sum(amount_minor)::BIGINT AS total,
           arg_min(struct_pack(id := transfer_id, amount := amount_minor, currency := currency,
                               payee := payee, at := created_at), (created_at, transfer_id)) AS first
    FROM paid GROUP BY business_id),
grants_of_day AS (SELECT * FROM grants WHERE granted_at >= $day_start AND granted_at < $day_end),
covered AS (SELECT DISTINCT ref_key FROM requests WHERE kind = {transfer_kind}),
flagged AS (
    SELECT r.*, CASE
        WHEN state = {request_dead_lettered} AND finished_at < $day_end THEN 'dead_lettered_unresolved'
        WHEN created_at < $sla_deadline AND (finished_at IS NULL OR finished_at >= $day_end)
            THEN 'pending_past_sla'
        WHEN kind = {transfer_kind} AND state = {request_succeeded}
             AND finished_at >= $day_start AND finished_at < $day_end
            THEN 'compensated_not_in_payment'
        END AS class
    FROM requests r),
found AS (
    SELECT 'missing_in_payment' AS discrepancy_class, g.grant_id AS business_id, NULL AS transfer_id,
           NULL AS request_id, g.recipient, g.currency, g.amount_minor,
           g.amount_minor AS expected_amount_minor,
           NULL::BIGINT AS actual_amount_minor, g.currency AS expected_currency, NULL AS actual_currency,
           g.granted_at AS occurred_at, TRUE AS fixable
    FROM grants_of_day g
    WHERE g.grant_id NOT IN (SELECT business_id FROM payouts)
      AND g.grant_id NOT IN (SELECT ref_key FROM covered)
    UNION ALL
    SELECT 'missing_in_red_packet', p.business_id, p.first.id, NULL, p.first.payee, p.first.currency, p.total,
           NULL, p.total, NULL, p.first.currency, p.first.at, FALSE
    FROM payouts p
    WHERE p.first.at >= $day_start AND p.first.at < $day_end
      AND NOT EXISTS (SELECT 1 FROM grants g WHERE g.grant_id = p.business_id)
    UNION ALL
    SELECT 'amount_or_currency_mismatch', g.grant_id, p.first.id, NULL, g.recipient, g.currency,
           CASE WHEN g.currency = p.first.currency THEN abs(p.first.amount - g.amount_minor)
                ELSE g.amount_minor END,
           g.amount_minor, p.first.amount, g.currency, p.first.currency, p.first.at, FALSE
    FROM grants_of_day g JOIN payouts p ON p.business_id = g.grant_id
    WHERE p.n = 1 AND (p.first.amount <> g.amount_minor OR p.first.currency <> g.currency)
    UNION ALL
    SELECT 'duplicate_payout', g.grant_id, p.first.id, NULL, g.recipient, p.first.currency,
           p.total - p.first.amount, g.amount_minor, p.total, g.currency, p.first.currency, p.first.at, FALSE
    FROM grants g JOIN payouts p ON p.business_id = g.grant_id
    WHERE p.n > 1 AND p.first.at >= $day_start AND p.first.at < $day_end
    UNION ALL
    SELECT f.class, f.ref_key, NULL, f.request_id, g.recipient, f.currency, f.amount_minor, f.amount_minor,
           NULL, f.currency, NULL,
           CASE WHEN f.class = 'pending_past_sla' THEN f.created_at
                ELSE coalesce(f.finished_at, f.created_at) END,
           FALSE
    FROM flagged f LEFT JOIN grants g ON g.grant_id = f.ref_key
    WHERE f.class IN ('dead_lettered_unresolved', 'pending_past_sla')
       OR (f.class = 'compensated_not_in_payment' AND f.ref_key NOT IN (SELECT business_id FROM payouts))
)
SELECT $business_date::DATE AS business_date, discrepancy_class, business_id,
       transfer_id::VARCHAR AS transfer_id, request_id::VARCHAR AS request_id, recipient, currency,
       amount_minor::BIGINT AS amount_minor, expected_amount_minor::BIGINT AS expected_amount_minor,
       actual_amount_minor::BIGINT AS actual_amount_minor, expected_currency::VARCHAR AS expected_currency,
       actual_currency::VARCHAR AS actual_currency, occurred_at, fixable
FROM found
""".format(**_VOCABULARY)


_TOTALS_SQL: Final = """
SELECT 'red_packet_grants' AS ledger, currency, count(*) AS rows_read,
       count(*) FILTER (WHERE state = 'GRANTED' AND granted_at >= $day_start AND granted_at < $day_end) AS day_count,
       coalesce(sum(amount_minor) FILTER (WHERE state = 'GRANTED' AND granted_at >= $day_start
                                         AND granted_at < $day_end), 0) AS day_amount_minor
FROM read_parquet($red_packet) WHERE granted_at >= $read_start AND granted_at < $read_end GROUP BY currency
UNION ALL
SELECT 'payment_transfers', currency, count(*),
       count(*) FILTER (WHERE status = 'SUCCEEDED' AND created_at >= $day_start AND created_at < $day_end),
       coalesce(sum(amount_minor) FILTER (WHERE status = 'SUCCEEDED' AND created_at >= $day_start
                                         AND created_at < $day_end), 0)
FROM read_parquet($payment) WHERE created_at >= $read_start AND created_at < $read_end GROUP BY currency
UNION ALL
SELECT 'compensation_requests', currency, count(*),
       count(*) FILTER (WHERE kind = {transfer_kind} AND state = {request_succeeded}
                        AND finished_at >= $day_start AND finished_at < $day_end),
       coalesce(sum(amount_minor) FILTER (WHERE kind = {transfer_kind} AND state = {request_succeeded}
                                         AND finished_at >= $day_start AND finished_at < $day_end), 0)
FROM read_parquet($compensation)
WHERE created_at < $read_end AND (created_at >= $read_start OR finished_at IS NULL
      OR finished_at >= $day_start OR state = {request_dead_lettered})
GROUP BY currency
""".format(**_VOCABULARY)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OracleResult:
    discrepancies: pa.Table
    counts: dict[str, int]
    ledger_totals: list[tuple[str, str | None, int, int, int]]  # ledger, currency, rows, day n, day amount


def _parameters(root: Path, params: ReconcileParams) -> dict[str, object]:
    return {
        "red_packet": str(root / Ledger.RED_PACKET.value / "*.parquet"),
        "payment": str(root / Ledger.PAYMENT.value / "*.parquet"),
        "compensation": str(root / Ledger.COMPENSATION.value / "*.parquet"),
        "read_start": params.read_start,
        "read_end": params.read_end,
        "day_start": params.day_start,
        "day_end": params.day_end,
        "sla_deadline": params.sla_deadline,
        "business_date": params.business_date,
    }


def reconcile(root: Path, params: ReconcileParams, *, output: Path | None = None, threads: int = 0) -> OracleResult:
    """Find the discrepancies; with ``output``, also write them as Parquet (what a DuckDB job would do)."""
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        if threads:
            connection.execute(f"SET threads = {int(threads)}")
        connection.execute(f"CREATE TEMP TABLE found AS {_SQL}", _parameters(root, params))
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            connection.execute(f"COPY found TO '{output}' (FORMAT parquet)")
        relation = connection.sql("SELECT * FROM found").to_arrow_table()
        totals_parameters = {
            k: v for k, v in _parameters(root, params).items() if k not in {"business_date", "sla_deadline"}
        }
        totals = connection.execute(_TOTALS_SQL, totals_parameters).fetchall()
        return OracleResult(
            discrepancies=relation,
            counts=_count(relation),
            ledger_totals=sorted((str(ledger), c, int(r), int(n), int(a)) for ledger, c, r, n, a in totals),
        )
    finally:
        connection.close()


def _count(table: pa.Table) -> dict[str, int]:
    grouped = table.group_by("discrepancy_class").aggregate([("discrepancy_class", "count")])
    return {row["discrepancy_class"]: row["discrepancy_class_count"] for row in grouped.to_pylist()}
