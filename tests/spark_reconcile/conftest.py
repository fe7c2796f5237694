"""Fixtures for the reconciliation tests: one fast local SparkSession, one embedded PostgreSQL.

Both are session-scoped because they dominate the suite's run time (a JVM start, a server start);
isolation comes from a fresh database per test that needs one, created from the migrated template.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession

from ledger import migrate, pg
from spark_reconcile import session
from spark_reconcile.params import JDBC_JAR, ReconcileParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "web"))  # browser_support: `compensator run`, shared

BUSINESS_DATE = dt.date(2026, 11, 20)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs Java 17: apt-get install openjdk-17-jre-headless"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    spark_session = session.build(
        session.SessionConfig(
            app_name="reconcile-tests",
            master="local[2]",
            shuffle_partitions=2,
            driver_memory="1g",
            fast_start=True,
            extra=(
                ("spark.sql.adaptive.coalescePartitions.initialPartitionNum", "2"),
                ("spark.default.parallelism", "2"),
                ("spark.sql.files.maxPartitionBytes", str(64 * 1024 * 1024)),
            ),
        )
    )
    yield spark_session
    spark_session.stop()


@pytest.fixture(scope="session")
def jdbc_driver() -> str:
    """Debian's PostgreSQL JDBC driver, which every JDBC read loads into Spark's JVM: without it a
    read ends in a Java ClassNotFoundException trace, so a test that reads over JDBC asks for this
    first and fails saying which package it needs (a missing package is a set-up error, never a skip)."""
    if not Path(JDBC_JAR).is_file():
        pytest.fail(f"the PostgreSQL JDBC driver {JDBC_JAR} is missing: apt-get install libpostgresql-jdbc-java"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    return JDBC_JAR


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.EmbeddedPostgres]:
    with pg.temporary_server(prefix="reconcile-tests-pg-") as server:
        pg.wait_until_accepting(server.address)
        yield server


@pytest.fixture(scope="session")
def migrated_template(postgres: pg.EmbeddedPostgres) -> str:
    """A database with every migration applied, used as the template of per-test databases."""
    asyncio.run(_execute(postgres.dsn, "CREATE DATABASE reconcile_template"))
    template_dsn = postgres.dsn.rsplit("/", 1)[0] + "/reconcile_template"
    migrate.apply(template_dsn)
    return "reconcile_template"


@pytest.fixture()
def pg_dsn(postgres: pg.EmbeddedPostgres, migrated_template: str) -> str:
    """A fresh, migrated database for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_execute(postgres.dsn, f"CREATE DATABASE {name} TEMPLATE {migrated_template}"))
    return postgres.dsn.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture()
def params() -> ReconcileParams:
    return ReconcileParams(business_date=BUSINESS_DATE)


@pytest.fixture()
def output_root(tmp_path: Path) -> Path:
    return tmp_path / "reconcile"


async def _execute(dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
