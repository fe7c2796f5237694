"""Benchmark: the Spark reconciliation against the same reconciliation in DuckDB, on the same files.

``python -m bench.reconcile --rows 1000000 --json`` generates ledgers with known injected
discrepancies (0.1% of rows per class by default) into a temporary directory, runs the Spark job and
the DuckDB version on the same Parquet files, optionally the Spark job over JDBC from an embedded
PostgreSQL (``--jdbc``), and prints one JSON object. The run fails (exit 1) unless every engine finds
exactly the injected counts, and Spark and DuckDB list identical rows and ledger totals.

Timings: ``spark_s`` is the job in a started session (read, discrepancies written as Parquet, ledger
totals, class totals read back); ``spark_session_s`` is the JVM and session start, reported apart
because a cluster pays it once per application, not per job; ``duckdb_s`` is the same work in DuckDB
(discrepancies written as Parquet, ledger totals).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_reconcile import duckdb_oracle, job, session, synthetic
from spark_reconcile.params import ReconcileParams
from spark_reconcile.progress import Progress
from spark_reconcile.sources import JdbcConnection, JdbcSource, LedgerSource, ParquetSource

BUSINESS_DATE = dt.date(2026, 11, 20)
SORT_KEYS = [("discrepancy_class", "ascending"), ("business_id", "ascending"), ("request_id", "ascending")]


def _sorted_rows(path: Path) -> pa.Table:
    table = pq.read_table(path)
    return table.sort_by(SORT_KEYS).select([field.name for field in table.schema])


def _identical(left: pa.Table, right: pa.Table) -> bool:
    """Same columns, same types (amounts int64 in both), same rows; nullability flags aside."""
    types = [(f.name, f.type) for f in left.schema] == [(f.name, f.type) for f in right.schema]
    return types and left.to_pylist() == right.to_pylist()


def _spark_run(spark: Any, source: LedgerSource, params: ReconcileParams, out: Path) -> tuple[float, job.JobResult]:
    begun = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        result = job.run(spark, source, params, out, progress=Progress(quiet, spark=spark))
    return time.perf_counter() - begun, result


def _spark_totals(result: job.JobResult) -> list[tuple[str, str | None, int, int, int]]:
    return sorted((t.ledger, t.currency, t.rows_read, t.day_count, t.day_amount_minor) for t in result.ledger_totals)


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    params = ReconcileParams(business_date=BUSINESS_DATE)
    per_class = max(1, round(arguments.rows * arguments.rate))
    report: dict[str, Any] = {"rows": arguments.rows, "per_class": per_class}
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as folder:
        root = Path(folder)
        begun = time.perf_counter()
        ledgers = synthetic.generate(rows=arguments.rows, per_class=per_class, params=params, seed=arguments.seed)
        exports = root / "ledgers"
        synthetic.write_parquet(ledgers, exports)
        injection = ledgers.injection
        report["generate_s"] = round(time.perf_counter() - begun, 2)
        if not arguments.jdbc:
            del ledgers
            gc.collect()

        begun = time.perf_counter()
        spark = session.build(
            session.SessionConfig(
                app_name="bench-reconcile",
                shuffle_partitions=arguments.shuffle_partitions,
                driver_memory=arguments.driver_memory,
            )
        )
        report["spark_session_s"] = round(time.perf_counter() - begun, 2)
        spark_s, spark_result = _spark_run(spark, ParquetSource(root=str(exports)), params, root / "spark")
        report["spark_s"] = round(spark_s, 2)
        report["spark_stages_s"] = spark_result.timings_s

        begun = time.perf_counter()
        oracle = duckdb_oracle.reconcile(exports, params, output=root / "duckdb" / "discrepancies.parquet")
        report["duckdb_s"] = round(time.perf_counter() - begun, 2)
        report["ratio_spark_to_duckdb"] = round(spark_s / report["duckdb_s"], 2)

        found: dict[str, dict[str, int]] = {"spark": spark_result.counts, "duckdb": oracle.counts}
        if arguments.jdbc:
            found["spark_jdbc"] = _jdbc_run(spark, ledgers, params, root, report)
        report["expected"] = injection.counts
        report["found"] = found
        report["identical_rows"] = _identical(
            _sorted_rows(spark_result.discrepancies_path), _sorted_rows(root / "duckdb" / "discrepancies.parquet")
        )
        report["identical_totals"] = _spark_totals(spark_result) == oracle.ledger_totals
        spark.stop()
    report["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    report["ok"] = (
        all(counts == injection.counts for counts in found.values())
        and report["identical_rows"]
        and report["identical_totals"]
    )
    return report


def _jdbc_run(
    spark: Any, ledgers: synthetic.SyntheticLedgers, params: ReconcileParams, root: Path, report: dict[str, Any]
) -> dict[str, int]:
    from ledger import migrate, pg

    with pg.temporary_server(prefix="bench-reconcile-pg-") as server:
        pg.wait_until_accepting(server.address)
        begun = time.perf_counter()
        migrate.apply(server.dsn)
        synthetic.load_postgres(ledgers, server.dsn)
        report["postgres_load_s"] = round(time.perf_counter() - begun, 2)
        source = JdbcSource(connection=JdbcConnection.from_dsn(server.dsn), partitions=4, fetch_size=10_000)
        jdbc_s, result = _spark_run(spark, source, params, root / "spark-jdbc")
        report["spark_jdbc_s"] = round(jdbc_s, 2)
        return result.counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="red-packet grants of the day")
    parser.add_argument("--rate", type=float, default=0.001, help="injected fraction of rows per class")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jdbc", action="store_true", help="also run the Spark job over JDBC")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--json", action="store_true", help="print one JSON object (default: indented)")
    arguments = parser.parse_args(argv)
    if arguments.rows < 1_000 or not 0 < arguments.rate <= 0.01:
        parser.error("need --rows >= 1000 and 0 < --rate <= 0.01")
    report = run(arguments)
    print(json.dumps(report, sort_keys=True) if arguments.json else json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
