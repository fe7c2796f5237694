"""The Spark part of a run: read, find discrepancies, write them, compute the totals.

Owns: the order of Spark actions and what each one materialises. The discrepancies are written once
to Parquet and everything downstream (class totals, fixable rows, the report's listing) reads that
small file back, instead of recomputing or caching the big grouped pass. Ledger totals are a second,
column-pruned aggregation over the sources.

Must never: talk to PostgreSQL for results or publish files (that is :mod:`spark_reconcile.pipeline`);
the benchmark calls this module alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_reconcile import rules
from spark_reconcile.params import ReconcileParams
from spark_reconcile.progress import Progress
from spark_reconcile.schemas import DISCREPANCIES, Ledger
from spark_reconcile.sources import LedgerSource

FIXES_MAX: Final = 100_000
LISTING_ROWS_MAX: Final = 5_000
DISCREPANCIES_FOLDER: Final = "discrepancies"

# The grouping key is (nearly) unique per row, so a pre-shuffle partial aggregation reduces nothing and
# costs a hash map that falls back to sorting after a few hundred keys; one sort-based aggregation
# after the shuffle is about twice as fast. Only for that action: the totals query, with a handful of
# groups, profits from partial aggregation.
HIGH_CARDINALITY_AGGREGATION: Final = {
    "spark.sql.execution.bypassPartialAggregation": "true",
    "spark.sql.execution.useObjectHashAggregateExec": "false",
}


@contextlib.contextmanager
def sql_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Runtime SQL settings for the actions inside the block, restored afterwards."""
    previous: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClassTotal:
    discrepancy_class: str
    currency: str | None
    count: int
    amount_minor: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LedgerTotal:
    ledger: str
    currency: str | None
    rows_read: int
    day_count: int
    day_amount_minor: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    discrepancies_path: Path
    class_totals: tuple[ClassTotal, ...]
    ledger_totals: tuple[LedgerTotal, ...]
    fixable: tuple[dict[str, Any], ...]  # rows of DISCREPANCIES, at most FIXES_MAX
    listing: tuple[dict[str, Any], ...]  # the report's rows, biggest amounts first
    timings_s: dict[str, float]

    @property
    def counts(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for total in self.class_totals:
            result[total.discrepancy_class] = result.get(total.discrepancy_class, 0) + total.count
        return result

    @property
    def input_rows(self) -> dict[str, int]:
        result = {ledger.value: 0 for ledger in Ledger}
        for total in self.ledger_totals:
            result[total.ledger] += total.rows_read
        return result


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    output_files: int = 1
    fixes_max: int = FIXES_MAX
    listing_rows_max: int = LISTING_ROWS_MAX

    def validate(self) -> None:
        if not 1 <= self.output_files <= 10_000:
            raise ValueError("output files must be within 1..10000")
        if not 0 <= self.fixes_max <= FIXES_MAX or not 0 <= self.listing_rows_max <= LISTING_ROWS_MAX:
            raise ValueError("fixes and listing limits out of range")


def write_discrepancies(discrepancies: DataFrame, path: Path, output_files: int) -> None:
    """Sorted within files so a rerun with equal inputs writes equal files (easy to diff)."""
    (
        discrepancies.repartition(output_files)
        .sortWithinPartitions("discrepancy_class", "business_id", "request_id", "transfer_id")
        .write.mode("errorifexists")
        .parquet(str(path))
    )


def run(
    spark: SparkSession,
    source: LedgerSource,
    params: ReconcileParams,
    staging: Path,
    *,
    progress: Progress,
    config: JobConfig | None = None,
) -> JobResult:
    config = config or JobConfig()
    config.validate()
    frames = source.frames(spark, params)
    path = staging / DISCREPANCIES_FOLDER
    with progress.spark_tasks():
        with progress.stage("ledger_totals"):
            ledger_totals = tuple(LedgerTotal(**row.asDict()) for row in rules.ledger_totals(frames, params).collect())
        counts = {ledger: sum(t.rows_read for t in ledger_totals if t.ledger == ledger) for ledger in Ledger}
        progress.rows("read", **{ledger.name.lower(): count for ledger, count in counts.items()})
        with progress.stage("discrepancies"), sql_conf(spark, HIGH_CARDINALITY_AGGREGATION):
            write_discrepancies(rules.find_discrepancies(frames, params), path, config.output_files)
    with progress.stage("summarise"):
        written = spark.read.schema(DISCREPANCIES).parquet(str(path))
        class_totals = tuple(
            ClassTotal(
                discrepancy_class=row["discrepancy_class"],
                currency=row["currency"],
                count=row["discrepancy_count"],
                amount_minor=row["amount_minor"],
            )
            for row in rules.class_totals(written).collect()
        )
        fixable = _rows(written.where(F.col("fixable")), config.fixes_max)
        listing = _rows(written, config.listing_rows_max, biggest_first=True)
    progress.rows("discrepancies", found=sum(t.count for t in class_totals))
    return JobResult(
        discrepancies_path=path,
        class_totals=class_totals,
        ledger_totals=ledger_totals,
        fixable=fixable,
        listing=listing,
        timings_s=dict(progress.timings_s),
    )


def _rows(frame: DataFrame, limit: int, *, biggest_first: bool = False) -> tuple[dict[str, Any], ...]:
    if limit == 0:
        return ()
    order = [F.col("amount_minor").desc_nulls_last()] if biggest_first else []
    ordered = frame.orderBy(*order, "discrepancy_class", "business_id", "request_id")
    return tuple(row.asDict() for row in ordered.limit(limit).collect())
