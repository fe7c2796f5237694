"""The CLI on Parquet exports, checked row for row against the DuckDB formulation and the injection."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compensator import cli
from spark_reconcile import command, duckdb_oracle, fixes
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import DiscrepancyClass
from spark_reconcile.synthetic import generate, write_parquet

pytestmark = pytest.mark.spark

A_FILE = sys.executable  # any file that exists, for --jdbc-jar when the check under test comes later
ABSENT = "/nonexistent/compensator-test"
INJECTED = {cls.value: count for count, cls in zip((4, 1, 3, 2, 6, 5, 7), DiscrepancyClass, strict=True)}


def _rows(path: Path) -> list[dict[str, object]]:
    rows = pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda r: (r["discrepancy_class"], r["business_id"], r["request_id"] or ""))


def test_cli_parquet_run_agrees_with_duckdb_and_the_injection(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = ReconcileParams(business_date=dt.date(2026, 11, 20), late_window=dt.timedelta(hours=3))
    ledgers = generate(rows=3_000, per_class=INJECTED, params=params, seed=5)
    exports = tmp_path / "exports"
    write_parquet(ledgers, exports)
    argv = [
        "reconcile",
        "--date",
        "2026-11-20",
        "--source",
        "parquet",
        "--parquet-dir",
        str(exports),
        "--no-db",
        "--late-window-hours",
        "3",
        "--output-dir",
        str(tmp_path / "out"),
        "--shuffle-partitions",
        "2",
        "--payer-account",
        "treasury-7",
        "--json",
    ]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {name: c["count"] for name, c in printed["classes"].items()} == INJECTED

    oracle = duckdb_oracle.reconcile(exports, params, output=tmp_path / "duckdb.parquet")
    assert oracle.counts == INJECTED
    spark_path, duckdb_path = tmp_path / "out" / "date=2026-11-20" / "discrepancies", tmp_path / "duckdb.parquet"
    spark_rows = _rows(spark_path)
    assert spark_rows == _rows(duckdb_path)
    for path in (spark_path, duckdb_path):  # money stays integral in both engines' files
        schema = pq.read_schema(next(path.glob("*.parquet")) if path.is_dir() else path)
        assert {schema.field(name).type for name in ("amount_minor", "actual_amount_minor")} == {pa.int64()}
    assert {r["business_id"] for r in spark_rows if r["fixable"]} == ledgers.injection.business_ids[
        DiscrepancyClass.MISSING_IN_PAYMENT.value
    ]
    proposed = fixes.read_jsonl(tmp_path / "out" / "date=2026-11-20" / "fixes.jsonl")
    assert {f.ref_key for f in proposed} == ledgers.injection.business_ids[DiscrepancyClass.MISSING_IN_PAYMENT.value]
    assert {f.payload.payer for f in proposed} == {"treasury-7"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reconcile"], "the following arguments are required: --date"),
        (["reconcile", "--date", "2026-02-30"], "expected a date as YYYY-MM-DD"),
        (["reconcile", "--date", "2026-11-20", "--late-window-hours", "-1"], "must not be negative"),
        (["reconcile", "--date", "2026-11-20", "--source", "kafka"], "invalid choice"),
        (["reconcile", "--date", "2026-11-20", "--payer-account", "two words"], "an account id is"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert error.count("\n") == 1 and message in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["reconcile", "--date", "2026-11-20", "--source", "parquet"],
            "--source parquet needs --parquet-dir",
        ),
        (["reconcile", "--date", "2026-11-20", "--late-window-hours", "200"], "late window must be within"),
        (
            ["reconcile", "--date", "2026-11-20", "--enqueue", "--api-url", "http://api:8080", "--jdbc-jar", A_FILE],
            "needs $COMPENSATOR_API_TOKEN",
        ),
        (
            [
                "reconcile",
                "--date",
                "2026-11-20",
                "--source",
                "parquet",
                "--parquet-dir",
                ABSENT,
                "--no-db",
                "--enqueue",
            ],
            "--enqueue needs the database (the fixes go through its outbox): drop --no-db",
        ),
        (
            ["reconcile", "--date", "2026-11-20", "--source", "parquet", "--parquet-dir", ABSENT, "--no-db"],
            f"--parquet-dir {ABSENT}: no such directory",
        ),
        (
            ["reconcile", "--date", "2026-11-20", "--jdbc-jar", ABSENT + "/postgresql.jar"],
            "install it with `apt-get install libpostgresql-jdbc-java`, or name the jar with --jdbc-jar",
        ),
        (
            ["reconcile", "--date", "2026-11-20", "--jdbc-jar", A_FILE, "--pg-data", ABSENT],
            f"no database in {ABSENT}: load ledgers with `compensator seed-ledgers",
        ),
    ],
)
def test_invalid_combinations_give_one_line_and_exit_1(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COMPENSATOR_API_URL", raising=False)
    monkeypatch.delenv("COMPENSATOR_API_TOKEN", raising=False)
    monkeypatch.delenv("COMPENSATOR_PG_DSN", raising=False)
    assert cli.main(argv) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error


@pytest.mark.parametrize(
    "argv",
    [
        ["reconcile"],
        ["reconcile", "--date", "2026-02-30"],
        ["reconcile", "--date", "2026-11-20", "--source", "kafka"],
        ["reconcile", "--date", "2026-11-20", "--source", "parquet"],
        ["reconcile", "--date", "2026-11-20", "--late-window-hours", "200"],
        ["reconcile", "--date", "2026-11-20", "--enqueue", "--api-url", "http://api:8080", "--jdbc-jar", A_FILE],
        ["reconcile", "--date", "2026-11-20", "--source", "parquet", "--parquet-dir", ABSENT, "--no-db", "--enqueue"],
        ["reconcile", "--date", "2026-11-20", "--jdbc-jar", ABSENT + "/postgresql.jar"],
        ["reconcile", "--date", "2026-11-20", "--payer-account", "two words"],
    ],
)
def test_the_spark_submit_entry_answers_like_compensator_reconcile(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark_reconcile/submit.py runs command.main without the compensator package: same lines, same codes."""
    monkeypatch.delenv("COMPENSATOR_API_URL", raising=False)
    monkeypatch.delenv("COMPENSATOR_API_TOKEN", raising=False)

    def answer(entry: Callable[[list[str]], int], arguments: list[str]) -> tuple[int | str | None, str]:
        try:
            code: int | str | None = entry(arguments)
        except SystemExit as exit_info:
            code = exit_info.code
        return code, capsys.readouterr().err

    through_compensator = answer(cli.main, argv)
    through_submit = answer(command.main, argv[1:])
    assert through_submit == through_compensator
    assert through_submit[0] in {1, 2} and through_submit[1].count("\n") == 1
