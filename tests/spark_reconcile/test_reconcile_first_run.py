"""What a new user met running the README's reconciliation commands on a fresh machine: each is one
line before any database or Spark starts, and changes nothing (no Spark in these tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from compensator import cli

DATE = "2026-11-20"


@pytest.fixture(autouse=True)
def _no_configured_database(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COMPENSATOR_PG_DSN", "COMPENSATOR_PG_DATA", "COMPENSATOR_API_URL", "COMPENSATOR_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


def test_reconcile_never_creates_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "pg" / "data"
    error = one_line(["reconcile", "--date", DATE, "--jdbc-jar", sys.executable, "--pg-data", str(data)], capsys)
    assert f"no database in {data}" in error and "seed-ledgers" in error
    assert not (tmp_path / "pg").exists()


def test_a_missing_jdbc_driver_is_named_with_how_to_get_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jar = tmp_path / "postgresql.jar"
    error = one_line(["reconcile", "--date", DATE, "--jdbc-jar", str(jar), "--pg-data", str(tmp_path / "d")], capsys)
    assert f"the PostgreSQL JDBC driver {jar} is missing" in error
    assert "apt-get install libpostgresql-jdbc-java" in error
    assert not (tmp_path / "d").exists()


def test_parquet_exports_without_a_ledger_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "payment_transfers").mkdir()
    argv = ["reconcile", "--date", DATE, "--source", "parquet", "--parquet-dir", str(tmp_path), "--no-db"]
    error = one_line(argv, capsys)
    assert f"--parquet-dir {tmp_path} has no red_packet_grants/, compensation_requests/" in error


def test_an_unusable_pg_data_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    error = one_line(["seed-ledgers", "--date", DATE, "--rows", "100", "--pg-data", str(blocker / "data")], capsys)
    assert f"--pg-data {blocker / 'data'}: cannot create it" in error


def test_an_unwritable_parquet_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    error = one_line(["seed-ledgers", "--date", DATE, "--rows", "100", "--parquet-dir", str(blocker / "out")], capsys)
    assert f"--parquet-dir {blocker / 'out'}" in error


def test_seed_ledgers_runs_twice_and_for_a_second_date(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A date seeded again replaces that date's rows; another date is added beside it."""
    import asyncio

    import asyncpg

    from ledger import pg

    data = tmp_path / "pg" / "data"
    seed = ["seed-ledgers", "--rows", "2000", "--pg-data", str(data)]
    for date in ("2026-11-20", "2026-11-20", "2026-11-21"):
        assert cli.main([*seed, "--date", date]) == 0, capsys.readouterr().err
    capsys.readouterr()

    async def counts(dsn: str) -> dict[tuple[str, str], int]:
        connection = await asyncpg.connect(dsn)
        try:
            found = {}
            for table, key in (("red_packet_grants", "grant_id"), ("payment_transfers", "transfer_id"),
                               ("compensation_requests", "request_id")):  # fmt: skip
                for tag in ("20261120", "20261121"):
                    found[(table, tag)] = await connection.fetchval(
                        f"SELECT count(*) FROM {table} WHERE {key} LIKE $1", f"{tag}-%")  # fmt: skip
                found[(table, "all")] = await connection.fetchval(f"SELECT count(*) FROM {table}")
            return found
        finally:
            await connection.close()

    with pg.database(data) as dsn:
        found = asyncio.run(counts(dsn))
    for table in ("red_packet_grants", "payment_transfers", "compensation_requests"):
        assert found[(table, "20261120")] == found[(table, "20261121")] > 0, found  # same rows, seed and size
        assert found[(table, "all")] == 2 * found[(table, "20261120")], found  # nothing twice, nothing else
