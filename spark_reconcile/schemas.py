"""Explicit schemas of the three ledgers and of the job's outputs.

Owns: column names and types, the ledger table names, the upstream ledgers' state vocabularies and
the discrepancy classes. Every read and every output goes through these, so a renamed or retyped
column fails at the edge instead of silently producing nulls in a join. The compensation ledger's
kinds and states are the service's own (:mod:`ledger.kinds`, :mod:`ledger.states`), not defined here.

Must never: import a SparkSession or touch files; this module is pure data.
"""

from __future__ import annotations

import enum
from typing import Final

from pyspark.sql.types import (
    BooleanType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


class Ledger(enum.StrEnum):
    """Input tables (PostgreSQL) and Parquet export folders share these names."""

    PAYMENT = "payment_transfers"
    RED_PACKET = "red_packet_grants"
    COMPENSATION = "compensation_requests"


class DiscrepancyClass(enum.StrEnum):
    """One value per row-level break; order is the report's order."""

    MISSING_IN_PAYMENT = "missing_in_payment"
    MISSING_IN_RED_PACKET = "missing_in_red_packet"
    AMOUNT_MISMATCH = "amount_or_currency_mismatch"
    DUPLICATE_PAYOUT = "duplicate_payout"
    COMPENSATED_NOT_PAID = "compensated_not_in_payment"
    PENDING_PAST_SLA = "pending_past_sla"
    DEAD_LETTERED = "dead_lettered_unresolved"


class TransferStatus(enum.StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PENDING = "PENDING"
    REVERSED = "REVERSED"


class GrantState(enum.StrEnum):
    GRANTED = "GRANTED"
    CANCELLED = "CANCELLED"


PAYMENT_TRANSFERS: Final = StructType(
    [
        StructField("transfer_id", StringType(), False),
        StructField("business_id", StringType(), True),
        StructField("payer", StringType(), True),
        StructField("payee", StringType(), True),
        StructField("amount_minor", LongType(), False),
        StructField("currency", StringType(), False),
        StructField("status", StringType(), False),
        StructField("created_at", TimestampType(), False),
    ]
)

RED_PACKET_GRANTS: Final = StructType(
    [
        StructField("grant_id", StringType(), False),
        StructField("red_packet_id", StringType(), False),
        StructField("recipient", StringType(), False),
        StructField("amount_minor", LongType(), False),
        StructField("currency", StringType(), False),
        StructField("state", StringType(), False),
        StructField("granted_at", TimestampType(), False),
    ]
)

COMPENSATION_REQUESTS: Final = StructType(
    [
        StructField("request_id", StringType(), False),
        StructField("kind", StringType(), False),
        StructField("idempotency_key", StringType(), False),
        StructField("ref_key", StringType(), False),
        StructField("amount_minor", LongType(), True),
        StructField("currency", StringType(), True),
        StructField("state", StringType(), False),
        StructField("created_at", TimestampType(), False),
        StructField("finished_at", TimestampType(), True),
    ]
)

LEDGER_SCHEMAS: Final = {
    Ledger.PAYMENT: PAYMENT_TRANSFERS,
    Ledger.RED_PACKET: RED_PACKET_GRANTS,
    Ledger.COMPENSATION: COMPENSATION_REQUESTS,
}

# Columns the job actually reads: everything else stays in the source (column pruning).
NEEDED_COLUMNS: Final = {
    Ledger.PAYMENT: (
        "transfer_id",
        "business_id",
        "payee",
        "amount_minor",
        "currency",
        "status",
        "created_at",
    ),
    Ledger.RED_PACKET: ("grant_id", "recipient", "amount_minor", "currency", "state", "granted_at"),
    Ledger.COMPENSATION: (
        "request_id",
        "kind",
        "ref_key",
        "amount_minor",
        "currency",
        "state",
        "created_at",
        "finished_at",
    ),
}

# The time column each ledger is windowed and partitioned on.
TIME_COLUMN: Final = {
    Ledger.PAYMENT: "created_at",
    Ledger.RED_PACKET: "granted_at",
    Ledger.COMPENSATION: "created_at",
}

DISCREPANCIES: Final = StructType(
    [
        StructField("business_date", DateType(), False),
        StructField("discrepancy_class", StringType(), False),
        StructField("business_id", StringType(), True),
        StructField("transfer_id", StringType(), True),
        StructField("request_id", StringType(), True),
        StructField("recipient", StringType(), True),
        StructField("currency", StringType(), True),
        StructField("amount_minor", LongType(), True),  # the amount at stake, see docs/reconcile.md
        StructField("expected_amount_minor", LongType(), True),
        StructField("actual_amount_minor", LongType(), True),
        StructField("expected_currency", StringType(), True),
        StructField("actual_currency", StringType(), True),
        StructField("occurred_at", TimestampType(), True),
        StructField("fixable", BooleanType(), False),
    ]
)

LEDGER_TOTALS: Final = StructType(
    [
        StructField("ledger", StringType(), False),
        StructField("currency", StringType(), True),
        StructField("rows_read", LongType(), False),
        StructField("day_count", LongType(), False),
        StructField("day_amount_minor", LongType(), False),
    ]
)
