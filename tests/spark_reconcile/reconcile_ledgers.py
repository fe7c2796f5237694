"""Tiny in-code ledgers for rule tests: builders with defaults so each test shows only what matters."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ledger.kinds import Kind
from spark_reconcile.rules import LedgerFrames
from spark_reconcile.schemas import COMPENSATION_REQUESTS, DISCREPANCIES, PAYMENT_TRANSFERS, RED_PACKET_GRANTS

DAY = dt.date(2026, 11, 20)


def at(hour: int, minute: int = 0, *, days: int = 0) -> dt.datetime:
    """An instant on the business day (``days`` shifts to neighbouring days), UTC."""
    return dt.datetime.combine(DAY, dt.time(0), tzinfo=dt.UTC) + dt.timedelta(days=days, hours=hour, minutes=minute)


def grant(
    grant_id: str,
    amount: int,
    currency: str,
    when: dt.datetime,
    *,
    recipient: str = "u-1",
    state: str = "GRANTED",
) -> tuple[Any, ...]:
    return (grant_id, f"rp-{grant_id}", recipient, amount, currency, state, when)


def transfer(
    transfer_id: str,
    business_id: str | None,
    amount: int,
    currency: str,
    when: dt.datetime,
    *,
    payee: str = "u-1",
    status: str = "SUCCEEDED",
) -> tuple[Any, ...]:
    return (transfer_id, business_id, "treasury", payee, amount, currency, status, when)


def request(
    request_id: str,
    ref_key: str,
    amount: int | None,
    currency: str | None,
    state: str,
    created: dt.datetime,
    finished: dt.datetime | None = None,
    *,
    kind: str = Kind.TRANSFER.value,
) -> tuple[Any, ...]:
    return (
        request_id,
        kind,
        f"{kind}:{ref_key}:{request_id}",
        ref_key,
        amount,
        currency,
        state,
        created,
        finished,
    )


def ledgers(
    spark: SparkSession,
    *,
    grants: list[tuple[Any, ...]] | None = None,
    transfers: list[tuple[Any, ...]] | None = None,
    requests: list[tuple[Any, ...]] | None = None,
) -> LedgerFrames:
    return LedgerFrames(
        red_packet=spark.createDataFrame(grants or [], RED_PACKET_GRANTS),
        payment=spark.createDataFrame(transfers or [], PAYMENT_TRANSFERS),
        compensation=spark.createDataFrame(requests or [], COMPENSATION_REQUESTS),
    )


def discrepancies(spark: SparkSession, *rows: dict[str, Any]) -> DataFrame:
    """Expected rows, written out field by field; unspecified fields are null, ``fixable`` false."""
    names = [field.name for field in DISCREPANCIES.fields]
    defaults: dict[str, Any] = {name: None for name in names} | {"business_date": DAY, "fixable": False}
    for row in rows:
        unknown = set(row) - set(names)
        assert not unknown, f"unknown discrepancy fields {unknown}"
    return spark.createDataFrame([tuple((defaults | row)[name] for name in names) for row in rows], DISCREPANCIES)
