"""Extract edge: the three ledgers from Parquet exports or from PostgreSQL over JDBC.

Owns: turning a location into DataFrames with the explicit schemas, pruned to the needed columns and
filtered to the business date's read window at the source (Parquet row-group statistics, SQL
predicates that PostgreSQL evaluates with its indexes).

Must never: decide what a break is (that is :mod:`spark_reconcile.rules`). The rules re-apply every
window filter themselves, so a source that over-reads is slower, never wrong.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from typing import Final, Protocol
from urllib.parse import unquote, urlsplit

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ledger.states import LedgerState
from spark_reconcile.params import ReconcileParams
from spark_reconcile.rules import LedgerFrames, request_read_filter
from spark_reconcile.schemas import LEDGER_SCHEMAS, NEEDED_COLUMNS, TIME_COLUMN, Ledger

JDBC_DRIVER: Final = "org.postgresql.Driver"
JDBC_PARTITIONS_MAX: Final = 256


class LedgerSource(Protocol):
    """Where the ledgers come from; ``describe`` goes into the run summary."""

    def frames(self, spark: SparkSession, params: ReconcileParams) -> LedgerFrames: ...

    def describe(self) -> str: ...


def _window_filter(ledger: Ledger, params: ReconcileParams) -> Column:
    if ledger is Ledger.COMPENSATION:
        return request_read_filter(params)
    column = F.col(TIME_COLUMN[ledger])
    return (column >= F.lit(params.read_start)) & (column < F.lit(params.read_end))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ParquetSource:
    """Exports laid out as ``{root}/{ledger table name}/*.parquet`` (any filesystem Spark reads)."""

    root: str

    def read(self, spark: SparkSession, ledger: Ledger, params: ReconcileParams) -> DataFrame:
        frame = spark.read.schema(LEDGER_SCHEMAS[ledger]).parquet(f"{self.root.rstrip('/')}/{ledger.value}")
        return frame.select(*NEEDED_COLUMNS[ledger]).where(_window_filter(ledger, params))

    def frames(self, spark: SparkSession, params: ReconcileParams) -> LedgerFrames:
        return LedgerFrames(
            payment=self.read(spark, Ledger.PAYMENT, params),
            red_packet=self.read(spark, Ledger.RED_PACKET, params),
            compensation=self.read(spark, Ledger.COMPENSATION, params),
        )

    def describe(self) -> str:
        return f"parquet:{self.root}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JdbcConnection:
    url: str
    user: str
    password: str = ""

    @classmethod
    def from_dsn(cls, dsn: str) -> JdbcConnection:
        """``postgresql://user:pass@host:port/db`` -> JDBC URL plus credentials (never in the URL)."""
        parts = urlsplit(dsn)
        if parts.scheme not in {"postgresql", "postgres"} or not parts.hostname:
            raise ValueError("expected a TCP DSN like postgresql://user@host:port/db")
        database = parts.path.lstrip("/") or "postgres"
        port = parts.port or 5432
        return cls(
            url=f"jdbc:postgresql://{parts.hostname}:{port}/{database}",
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
        )


def _sql_instant(value: dt.datetime) -> str:
    return f"TIMESTAMPTZ '{value.astimezone(dt.UTC).isoformat(sep=' ')}'"


def time_slices(start: dt.datetime, end: dt.datetime, count: int) -> list[tuple[dt.datetime, dt.datetime]]:
    """``count`` contiguous half-open slices covering [start, end) exactly (last one absorbs rounding)."""
    if count < 1 or end <= start:
        raise ValueError("need at least one slice of a non-empty interval")
    step = (end - start) / count
    bounds = [start + step * index for index in range(count)] + [end]
    return list(itertools.pairwise(bounds))


def jdbc_predicates(ledger: Ledger, params: ReconcileParams, partitions: int) -> list[str]:
    """One SQL predicate per Spark partition; together they select exactly the read window.

    Why predicates rather than ``partitionColumn``/bounds: bounds only split, they do not filter, so
    the first and last partitions would scan the whole table outside the window.
    """
    column = TIME_COLUMN[ledger]
    slices = [
        f"{column} >= {_sql_instant(low)} AND {column} < {_sql_instant(high)}"
        for low, high in time_slices(params.read_start, params.read_end, partitions)
    ]
    if ledger is Ledger.COMPENSATION:
        # Older requests that still matter: open at the start of the day, or dead-lettered.
        slices.append(
            f"created_at < {_sql_instant(params.read_start)} AND (finished_at IS NULL"
            f" OR finished_at >= {_sql_instant(params.day_start)} OR state = '{LedgerState.DEAD_LETTERED.value}')"
        )
    return slices


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JdbcSource:
    """Partitioned reads from PostgreSQL (the driver jar must be on ``spark.jars``)."""

    connection: JdbcConnection
    partitions: int = 4
    fetch_size: int = 10_000
    schema_name: str = "public"

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= JDBC_PARTITIONS_MAX:
            raise ValueError(f"JDBC partitions must be within 1..{JDBC_PARTITIONS_MAX}")
        if self.fetch_size < 1:
            raise ValueError("fetch size must be positive")

    def read(self, spark: SparkSession, ledger: Ledger, params: ReconcileParams) -> DataFrame:
        properties = {"user": self.connection.user, "driver": JDBC_DRIVER, "fetchsize": str(self.fetch_size)}
        if self.connection.password:  # else the driver reads PGPASSFILE or ~/.pgpass, as libpq does
            properties["password"] = self.connection.password
        frame = spark.read.jdbc(
            self.connection.url,
            f"{self.schema_name}.{ledger.value}",
            predicates=jdbc_predicates(ledger, params, self.partitions),
            properties=properties,
        )
        # Explicit types at the edge: PostgreSQL's uuid arrives as a string, bigint as long.
        typed = [
            F.col(field.name).cast(field.dataType).alias(field.name)
            for field in LEDGER_SCHEMAS[ledger].fields
            if field.name in NEEDED_COLUMNS[ledger]
        ]
        return frame.select(*typed).where(_window_filter(ledger, params))

    def frames(self, spark: SparkSession, params: ReconcileParams) -> LedgerFrames:
        return LedgerFrames(
            payment=self.read(spark, Ledger.PAYMENT, params),
            red_packet=self.read(spark, Ledger.RED_PACKET, params),
            compensation=self.read(spark, Ledger.COMPENSATION, params),
        )

    def describe(self) -> str:
        return self.connection.url  # already "jdbc:postgresql://..."; credentials are never in it
