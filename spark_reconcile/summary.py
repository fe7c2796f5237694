"""The run summary: one value, rendered as JSON and stored in PostgreSQL for the API and review page.

Owns: the summary's shape (counts and amounts per class and currency, ledger totals, the net
difference, input rows, duration) and its persistence: a rerun for a date deletes the date's previous
run and inserts the new one in the same transaction, so readers never see both or neither.

Must never: run Spark; it works on the small collected results of :mod:`spark_reconcile.job`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any, Final, TypeVar

import asyncpg

from spark_reconcile.job import ClassTotal, LedgerTotal
from spark_reconcile.schemas import DiscrepancyClass, Ledger

TREND_RUNS_MAX: Final = 90
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    run_id: str
    business_date: dt.date
    started_at: dt.datetime
    finished_at: dt.datetime
    source: str
    parameters: dict[str, Any]
    class_totals: tuple[ClassTotal, ...]
    ledger_totals: tuple[LedgerTotal, ...]
    output_uri: str
    fixes_proposed: int
    fixes_refused: int  # fixable breaks that make no valid transfer: listed, not sent
    stage_timings_s: dict[str, float]

    @property
    def duration_ms(self) -> int:
        return int((self.finished_at - self.started_at).total_seconds() * 1000)

    def counts(self) -> dict[str, int]:
        """Every class, zero included: an absent class reads as 'checked, nothing found'."""
        result = {c.value: 0 for c in DiscrepancyClass}
        for total in self.class_totals:
            result[total.discrepancy_class] += total.count
        return result

    def amounts(self) -> dict[str, dict[str, int]]:
        result: dict[str, dict[str, int]] = {c.value: {} for c in DiscrepancyClass}
        for total in self.class_totals:
            currency = total.currency or "?"
            per = result[total.discrepancy_class]
            per[currency] = per.get(currency, 0) + total.amount_minor
        return result

    def input_rows(self) -> dict[str, int]:
        result = {ledger.value: 0 for ledger in Ledger}
        for total in self.ledger_totals:
            result[total.ledger] += total.rows_read
        return result

    def day_totals(self) -> dict[str, dict[str, dict[str, int]]]:
        result: dict[str, dict[str, dict[str, int]]] = {ledger.value: {} for ledger in Ledger}
        for total in self.ledger_totals:
            if total.day_count:
                result[total.ledger][total.currency or "?"] = {
                    "count": total.day_count,
                    "amount_minor": total.day_amount_minor,
                }
        return result

    def net_difference(self) -> dict[str, int]:
        """Paid minus granted, per currency: positive means more left than was owed."""
        totals = self.day_totals()
        currencies = set(totals[Ledger.PAYMENT.value]) | set(totals[Ledger.RED_PACKET.value])
        return {
            currency: totals[Ledger.PAYMENT.value].get(currency, {}).get("amount_minor", 0)
            - totals[Ledger.RED_PACKET.value].get(currency, {}).get("amount_minor", 0)
            for currency in sorted(currencies)
        }

    def to_json(self) -> dict[str, Any]:
        counts, amounts = self.counts(), self.amounts()
        return {
            "run_id": self.run_id,
            "business_date": self.business_date.isoformat(),
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "duration_ms": self.duration_ms,
            "source": self.source,
            "parameters": self.parameters,
            "input_rows": self.input_rows(),
            "discrepancies": sum(counts.values()),
            "classes": {name: {"count": counts[name], "amount_minor": amounts[name]} for name in counts},
            "ledger_totals": self.day_totals(),
            "net_difference_minor": self.net_difference(),
            "fixes_proposed": self.fixes_proposed,
            "fixes_refused": self.fixes_refused,
            "output_uri": self.output_uri,
            "stage_timings_s": self.stage_timings_s,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrendPoint:
    business_date: dt.date
    counts: dict[str, int]


async def persist_async(dsn: str, summary: RunSummary, before_commit: Callable[[], T]) -> T:
    """Replace the date's run; ``before_commit`` (the file publish) runs inside the transaction."""
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            await connection.execute("DELETE FROM reconciliation_runs WHERE business_date = $1", summary.business_date)
            await connection.execute(
                """INSERT INTO reconciliation_runs (run_id, business_date, started_at, finished_at,
                       duration_ms, discrepancies, input_rows, output_uri, parameters)
                   VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9::jsonb)""",
                summary.run_id,
                summary.business_date,
                summary.started_at,
                summary.finished_at,
                summary.duration_ms,
                sum(summary.counts().values()),
                json.dumps(summary.input_rows()),
                summary.output_uri,
                json.dumps({**summary.parameters, "source": summary.source}),
            )
            await connection.executemany(
                """INSERT INTO reconciliation_class_totals
                       (run_id, discrepancy_class, currency, discrepancy_count, amount_minor)
                   VALUES ($1, $2, $3, $4, $5)""",
                [
                    (summary.run_id, t.discrepancy_class, t.currency or "?", t.count, t.amount_minor)
                    for t in summary.class_totals
                ],
            )
            await connection.executemany(
                """INSERT INTO reconciliation_ledger_totals
                       (run_id, ledger, currency, row_count, amount_minor)
                   VALUES ($1, $2, $3, $4, $5)""",
                [
                    (summary.run_id, t.ledger, t.currency or "?", t.day_count, t.day_amount_minor)
                    for t in summary.ledger_totals
                ],
            )
            return await asyncio.to_thread(before_commit)
    finally:
        await connection.close()


def persist(dsn: str, summary: RunSummary, before_commit: Callable[[], T]) -> T:
    return asyncio.run(persist_async(dsn, summary, before_commit))


async def recent_async(dsn: str, *, before: dt.date, limit: int = 30) -> list[TrendPoint]:
    """Per-class counts of the latest ``limit`` runs before ``before``, oldest first."""
    limit = max(0, min(limit, TREND_RUNS_MAX))
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            """SELECT r.business_date, c.discrepancy_class, sum(c.discrepancy_count)::bigint AS n
               FROM (SELECT run_id, business_date FROM reconciliation_runs WHERE business_date < $1
                     ORDER BY business_date DESC LIMIT $2) r
               LEFT JOIN reconciliation_class_totals c USING (run_id)
               GROUP BY r.business_date, c.discrepancy_class ORDER BY r.business_date""",
            before,
            limit,
        )
    finally:
        await connection.close()
    points: dict[dt.date, dict[str, int]] = {}
    for row in rows:
        counts = points.setdefault(row["business_date"], {c.value: 0 for c in DiscrepancyClass})
        if row["discrepancy_class"] is not None:
            counts[row["discrepancy_class"]] = int(row["n"])
    return [TrendPoint(business_date=day, counts=counts) for day, counts in points.items()]


def recent(dsn: str, *, before: dt.date, limit: int = 30) -> list[TrendPoint]:
    return asyncio.run(recent_async(dsn, before=before, limit=limit))
