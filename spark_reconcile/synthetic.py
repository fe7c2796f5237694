"""Synthetic ledgers with known, injected discrepancies: the ground truth of tests and benchmarks.

Owns: generating the three ledgers for one business date from a seed, injecting every discrepancy
class at a chosen count, adding look-alikes that must *not* be reported (late payments inside the
window, open requests within their SLA, neighbouring days, cancelled grants, failed transfers), and
keeping its own books: which business ids it broke, and the per-day totals it wrote. Those books are
kept while generating, independently of the rules, so tests compare the job with the injection.

Must never: import Spark or call the rules; it writes Parquet files or loads PostgreSQL at the edges
(:func:`write_parquet`, :func:`load_postgres`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import asyncpg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from ledger.kinds import Kind
from ledger.states import OPEN_STATES, LedgerState
from ledger.upstream import UPSTREAM_DDL
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import DiscrepancyClass, Ledger

CURRENCIES: Final = ("CNY", "USD", "EUR", "SGD")
_CURRENCY_WEIGHTS: Final = (0.7, 0.15, 0.1, 0.05)
_US: Final = 1_000_000
_MINUTE: Final = 60 * _US
_HOUR: Final = 60 * _MINUTE
_DAY: Final = 24 * _HOUR
ROWS_MAX: Final = 50_000_000
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")

_UPSTREAM_INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS payment_transfers_created_at ON payment_transfers (created_at)",
    "CREATE INDEX IF NOT EXISTS red_packet_grants_granted_at ON red_packet_grants (granted_at)",
)
ATTEMPTS_TABLE: Final = "compensation_attempts"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    """What the generator broke on purpose, and the totals it wrote: the expected results."""

    counts: dict[str, int]
    amounts: dict[str, dict[str, int]]  # class -> currency -> minor units
    business_ids: dict[str, frozenset[str]]
    ledger_totals: dict[str, dict[str, tuple[int, int]]]  # ledger -> currency -> (count, amount)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticLedgers:
    grants: pa.Table
    transfers: pa.Table
    requests: pa.Table
    attempts: pa.Table
    injection: Injection
    tag: str = ""
    """The business date as YYYYMMDD: every key the generator makes starts with it, so the ledgers of
    several dates live side by side and loading a date again replaces exactly that date's rows."""

    def tables(self) -> dict[str, pa.Table]:
        return {
            Ledger.RED_PACKET.value: self.grants,
            Ledger.PAYMENT.value: self.transfers,
            Ledger.COMPENSATION.value: self.requests,
            ATTEMPTS_TABLE: self.attempts,
        }


def _ids(prefix: str, numbers: np.ndarray, width: int = 9) -> pa.Array:
    digits = pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), width, "0")
    return pc.binary_join_element_wise(prefix, digits, "")


def _times(micros: np.ndarray) -> pa.Array:
    return pa.array(micros.astype(np.int64), pa.int64()).cast(_TIMESTAMP)


@dataclasses.dataclass(slots=True)
class _Builder:
    """Column buffers for one table; appended in vectorised chunks, concatenated once."""

    columns: dict[str, list[pa.Array]] = dataclasses.field(default_factory=lambda: defaultdict(list))

    def add(self, **values: pa.Array) -> None:
        for name, array in values.items():
            self.columns[name].append(array)

    def table(self, schema: pa.Schema) -> pa.Table:
        columns = []
        for field in schema:
            chunks: list[pa.Array] = []
            for part in self.columns[field.name]:  # large inputs come back from compute as chunked
                typed = part.cast(field.type)
                chunks.extend(typed.chunks if isinstance(typed, pa.ChunkedArray) else [typed])
            columns.append(pa.chunked_array(chunks, field.type))
        return pa.Table.from_arrays(columns, schema=schema)


GRANTS_SCHEMA: Final = pa.schema(
    [
        ("grant_id", pa.string()),
        ("red_packet_id", pa.string()),
        ("recipient", pa.string()),
        ("amount_minor", pa.int64()),
        ("currency", pa.string()),
        ("state", pa.string()),
        ("granted_at", _TIMESTAMP),
    ]
)
TRANSFERS_SCHEMA: Final = pa.schema(
    [
        ("transfer_id", pa.string()),
        ("business_id", pa.string()),
        ("payer", pa.string()),
        ("payee", pa.string()),
        ("amount_minor", pa.int64()),
        ("currency", pa.string()),
        ("status", pa.string()),
        ("created_at", _TIMESTAMP),
    ]
)
REQUESTS_SCHEMA: Final = pa.schema(
    [
        ("request_id", pa.string()),
        ("kind", pa.string()),
        ("idempotency_key", pa.string()),
        ("ref_key", pa.string()),
        ("amount_minor", pa.int64()),
        ("currency", pa.string()),
        ("state", pa.string()),
        ("created_at", _TIMESTAMP),
        ("finished_at", _TIMESTAMP),
    ]
)
ATTEMPTS_SCHEMA: Final = pa.schema(
    [
        ("request_id", pa.string()),
        ("attempt_number", pa.int32()),
        ("started_at", _TIMESTAMP),
        ("ended_at", _TIMESTAMP),
        ("outcome", pa.string()),
        ("error_class", pa.string()),
        ("downstream_status", pa.int32()),
    ]
)


def _const(value: object, size: int, kind: pa.DataType) -> pa.Array:
    return pa.array([value] * size, kind) if size < 64 else pa.repeat(pa.scalar(value, kind), size)


class _Generator:
    """Holds the random state and the books while one set of ledgers is generated."""

    def __init__(self, *, rows: int, per_class: Mapping[str, int], params: ReconcileParams, seed: int) -> None:
        if not 1 <= rows <= ROWS_MAX:
            raise ValueError(f"rows must be within 1..{ROWS_MAX}")
        if set(per_class) != {c.value for c in DiscrepancyClass} or min(per_class.values()) < 0:
            raise ValueError("need a non-negative injection count for every discrepancy class")
        if sum(per_class.values()) + 3 * max(per_class.values()) > rows:
            raise ValueError("too many injected discrepancies for the number of rows")
        if params.pending_sla > dt.timedelta(hours=20) or params.late_window < dt.timedelta(minutes=10):
            raise ValueError("generator needs pending SLA <= 20h and late window >= 10min")
        self.rows, self.params = rows, params
        self.injected = dict(per_class)
        self.per_class = max(per_class.values())  # size of each look-alike group
        self.rng = np.random.default_rng(seed)
        self.day0 = int(params.day_start.timestamp()) * _US
        self.grants, self.transfers, self.requests, self.attempts = (
            _Builder(),
            _Builder(),
            _Builder(),
            _Builder(),
        )
        self.counts: dict[str, int] = {c.value: 0 for c in DiscrepancyClass}
        self.amounts: dict[str, dict[str, int]] = {c.value: defaultdict(int) for c in DiscrepancyClass}
        self.business_ids: dict[str, set[str]] = {c.value: set() for c in DiscrepancyClass}
        self.next_transfer = 0
        self.next_request = 0
        self.tag = params.business_date.strftime("%Y%m%d")

    def ids(self, prefix: str, numbers: np.ndarray, width: int = 9) -> pa.Array:
        """Keys unique across business dates (grants, transfers, requests): the date comes first."""
        return _ids(f"{self.tag}-{prefix}", numbers, width)

    # -- books ------------------------------------------------------------------------------
    def book(self, discrepancy: DiscrepancyClass, ids: pa.Array, currency: np.ndarray, amount: np.ndarray) -> None:
        self.counts[discrepancy.value] += len(ids)
        self.business_ids[discrepancy.value].update(ids.to_pylist())
        for code in CURRENCIES:
            self.amounts[discrepancy.value][code] += int(amount[currency == code].sum())

    # -- rows -------------------------------------------------------------------------------
    def uniform(self, low: int, high: int, size: int) -> np.ndarray:
        return self.rng.integers(low, high, size=size, dtype=np.int64)

    def currencies(self, size: int) -> np.ndarray:
        return self.rng.choice(np.array(CURRENCIES), size=size, p=_CURRENCY_WEIGHTS)

    def add_grants(self, ids: pa.Array, at: np.ndarray, amount: np.ndarray, currency: np.ndarray, state: str) -> None:
        size = len(ids)
        self.grants.add(
            grant_id=ids,
            red_packet_id=_ids("rp-", self.uniform(0, max(1, self.rows // 5), size)),
            recipient=_ids("u-", self.uniform(0, self.rows, size)),
            amount_minor=pa.array(amount),
            currency=pa.array(currency),
            state=_const(state, size, pa.string()),
            granted_at=_times(at),
        )

    def add_transfers(
        self,
        business_ids: pa.Array,
        at: np.ndarray,
        amount: np.ndarray,
        currency: np.ndarray,
        status: str = "SUCCEEDED",
    ) -> None:
        size = len(business_ids)
        numbers = np.arange(self.next_transfer, self.next_transfer + size)
        self.next_transfer += size
        self.transfers.add(
            transfer_id=self.ids("t-", numbers, 10),
            business_id=business_ids,
            payer=_const("treasury", size, pa.string()),
            payee=_ids("u-", self.uniform(0, self.rows, size)),
            amount_minor=pa.array(amount),
            currency=pa.array(currency),
            status=_const(status, size, pa.string()),
            created_at=_times(at),
        )

    def add_requests(
        self,
        ref_keys: pa.Array,
        created: np.ndarray,
        finished: np.ndarray | None,
        amount: np.ndarray,
        currency: np.ndarray,
        state: LedgerState,
    ) -> None:
        assert (finished is None) == (state in OPEN_STATES), "an open request has no finish time, others have one"
        size = len(ref_keys)
        numbers = np.arange(self.next_request, self.next_request + size)
        self.next_request += size
        request_ids = self.ids("r-", numbers, 12)
        finished_at = _times(finished) if finished is not None else pa.nulls(size, _TIMESTAMP)
        self.requests.add(
            request_id=request_ids,
            kind=_const(Kind.TRANSFER.value, size, pa.string()),
            idempotency_key=pc.binary_join_element_wise(f"{Kind.TRANSFER.value}:", ref_keys, ""),
            ref_key=ref_keys,
            amount_minor=pa.array(amount),
            currency=pa.array(currency),
            state=_const(state.value, size, pa.string()),
            created_at=_times(created),
            finished_at=finished_at,
        )
        outcome = {LedgerState.SUCCEEDED: "SUCCEEDED", LedgerState.DEAD_LETTERED: "FATAL_ERROR"}.get(
            state, "RETRYABLE_ERROR"
        )
        ended = finished if finished is not None else created + _MINUTE
        failed = outcome != "SUCCEEDED"
        self.attempts.add(
            request_id=request_ids,
            attempt_number=_const(1, size, pa.int32()),
            started_at=_times(created),
            ended_at=_times(ended),
            outcome=_const(outcome, size, pa.string()),
            error_class=_const("DownstreamUnavailable" if failed else None, size, pa.string()),
            downstream_status=_const(503 if failed else 200, size, pa.int32()),
        )


def _totals(tables: dict[str, pa.Table], params: ReconcileParams) -> dict[str, dict[str, tuple[int, int]]]:
    """The per-day totals the generator wrote, from its own arrays (each ledger by its own clock)."""
    start = pa.scalar(params.day_start, _TIMESTAMP)
    end = pa.scalar(params.day_end, _TIMESTAMP)

    def in_day(column: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.and_kleene(pc.greater_equal(column, start), pc.less(column, end))

    grants, transfers, requests = (tables[k] for k in (Ledger.RED_PACKET, Ledger.PAYMENT, Ledger.COMPENSATION))
    masks = {
        Ledger.RED_PACKET.value: (
            grants,
            pc.and_(pc.equal(grants["state"], "GRANTED"), in_day(grants["granted_at"])),
        ),
        Ledger.PAYMENT.value: (
            transfers,
            pc.and_(pc.equal(transfers["status"], "SUCCEEDED"), in_day(transfers["created_at"])),
        ),
        Ledger.COMPENSATION.value: (
            requests,
            pc.and_(
                pc.and_(
                    pc.equal(requests["kind"], Kind.TRANSFER.value),
                    pc.equal(requests["state"], LedgerState.SUCCEEDED.value),
                ),
                pc.fill_null(in_day(requests["finished_at"]), False),
            ),
        ),
    }
    result: dict[str, dict[str, tuple[int, int]]] = {}
    for ledger, (table, mask) in masks.items():
        kept = table.filter(mask)
        grouped = kept.group_by("currency").aggregate([("amount_minor", "sum"), ("amount_minor", "count")])
        result[ledger] = {
            row["currency"]: (row["amount_minor_count"], row["amount_minor_sum"]) for row in grouped.to_pylist()
        }
    return result


def generate(
    *, rows: int, per_class: int | Mapping[str, int], params: ReconcileParams, seed: int = 7
) -> SyntheticLedgers:
    """Ledgers for ``params.business_date`` with ``per_class`` injected breaks of every class.

    ``per_class`` is one count for all classes, or a count per class (different counts per class
    catch a rule that reports one class under another's name).
    """
    counts = per_class if isinstance(per_class, Mapping) else {c.value: per_class for c in DiscrepancyClass}
    g = _Generator(rows=rows, per_class=counts, params=params, seed=seed)
    _generate_day(g)
    schemas = {
        Ledger.RED_PACKET.value: (g.grants, GRANTS_SCHEMA),
        Ledger.PAYMENT.value: (g.transfers, TRANSFERS_SCHEMA),
        Ledger.COMPENSATION.value: (g.requests, REQUESTS_SCHEMA),
        ATTEMPTS_TABLE: (g.attempts, ATTEMPTS_SCHEMA),
    }
    tables = {name: builder.table(schema) for name, (builder, schema) in schemas.items()}
    injection = Injection(
        counts=dict(g.counts),
        amounts={name: {c: v for c, v in per.items() if v} for name, per in g.amounts.items()},
        business_ids={name: frozenset(ids) for name, ids in g.business_ids.items()},
        ledger_totals=_totals(tables, params),
    )
    return SyntheticLedgers(
        grants=tables[Ledger.RED_PACKET.value],
        transfers=tables[Ledger.PAYMENT.value],
        requests=tables[Ledger.COMPENSATION.value],
        attempts=tables[ATTEMPTS_TABLE],
        injection=injection,
        tag=g.tag,
    )


def _generate_day(g: _Generator) -> None:
    """Lay out the grants of the day in disjoint groups, one per behaviour."""
    c, n, k = g.per_class, g.rows, g.injected
    day0, day_end = g.day0, g.day0 + _DAY
    sla_deadline = int(g.params.sla_deadline.timestamp()) * _US
    late_us = int(g.params.late_window.total_seconds()) * _US
    order = g.rng.permutation(n)
    amount_all = g.uniform(100, 200_000, n)
    currency_all = g.currencies(n)
    sizes = {
        "missing_pay": k[DiscrepancyClass.MISSING_IN_PAYMENT],
        "mismatch": k[DiscrepancyClass.AMOUNT_MISMATCH],
        "duplicate": k[DiscrepancyClass.DUPLICATE_PAYOUT],
        "comp_unpaid": k[DiscrepancyClass.COMPENSATED_NOT_PAID],
        "pending": k[DiscrepancyClass.PENDING_PAST_SLA],
        "dead": k[DiscrepancyClass.DEAD_LETTERED],
        "pending_ok": c,
        "late": c,
    }
    bounds = np.cumsum([0, *sizes.values()])
    groups = {name: order[bounds[i] : bounds[i + 1]] for i, name in enumerate(sizes)}
    groups["normal"] = order[bounds[-1] :]
    early = (day0, day0 + 20 * _HOUR)
    windows = {
        "missing_pay": (day0, day_end - _US),
        "mismatch": early,
        "duplicate": early,
        "comp_unpaid": early,
        "pending": (day0, sla_deadline - _HOUR),
        "dead": early,
        "pending_ok": (sla_deadline + _MINUTE, day_end - _MINUTE),
        "late": (day_end - 30 * _MINUTE, day_end - _MINUTE),
        "normal": (day0, day_end - _US),
    }
    for name, members in groups.items():
        members.sort()
        ids = g.ids("g-", members)
        amount, currency = amount_all[members], currency_all[members]
        at = g.uniform(*windows[name], len(members))
        g.add_grants(ids, at, amount, currency, "GRANTED")
        _lay_out_group(g, name, ids, at, amount, currency, late_us)
    _add_outside_noise(g, day0, day_end, late_us)


def _lay_out_group(
    g: _Generator,
    name: str,
    ids: pa.Array,
    at: np.ndarray,
    amount: np.ndarray,
    currency: np.ndarray,
    late_us: int,
) -> None:
    size = len(ids)
    paid_at = at + g.uniform(1 * _US, 30 * _US, size)
    requested_at = at + _US
    day_end = g.day0 + _DAY
    if name == "missing_pay":
        g.book(DiscrepancyClass.MISSING_IN_PAYMENT, ids, currency, amount)
        return
    if name in {"comp_unpaid", "pending", "dead", "pending_ok"}:
        state, finished = {
            "comp_unpaid": (LedgerState.SUCCEEDED, requested_at + _MINUTE),
            "pending": (LedgerState.PENDING, None),
            "dead": (LedgerState.DEAD_LETTERED, requested_at + 30 * _MINUTE),
            "pending_ok": (LedgerState.IN_FLIGHT, None),
        }[name]
        g.add_requests(ids, requested_at, finished, amount, currency, state)
        booked = {
            "comp_unpaid": DiscrepancyClass.COMPENSATED_NOT_PAID,
            "pending": DiscrepancyClass.PENDING_PAST_SLA,
            "dead": DiscrepancyClass.DEAD_LETTERED,
        }
        if name in booked:
            g.book(booked[name], ids, currency, amount)
        return
    if name == "late":
        paid_at = day_end + g.uniform(_MINUTE, late_us - _MINUTE, size)
    paid_amount, paid_currency = amount, currency
    if name == "mismatch":
        paid_amount, paid_currency, at_stake = _mismatch(g, amount, currency)
        g.book(DiscrepancyClass.AMOUNT_MISMATCH, ids, currency, at_stake)
    g.add_transfers(ids, paid_at, paid_amount, paid_currency)
    g.add_requests(ids, requested_at, paid_at, amount, currency, LedgerState.SUCCEEDED)
    if name == "duplicate":
        g.add_transfers(ids, paid_at + 10 * _MINUTE, amount, currency)
        g.book(DiscrepancyClass.DUPLICATE_PAYOUT, ids, currency, amount)
    if name == "normal":
        failed = g.rng.choice(size, size=min(g.per_class, size), replace=False)
        g.add_transfers(ids.take(pa.array(failed)), paid_at[failed] - _US, amount[failed], currency[failed], "FAILED")


def _mismatch(g: _Generator, amount: np.ndarray, currency: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Even positions: wrong amount (at stake: the difference); odd: wrong currency (the grant)."""
    wrong_amount = np.arange(len(amount)) % 2 == 0
    delta = g.uniform(1, 500, len(amount)) * np.where(g.rng.random(len(amount)) < 0.5, -1, 1)
    paid_amount = np.where(wrong_amount, np.maximum(amount + delta, 1), amount)
    shift = np.array([CURRENCIES[(CURRENCIES.index(code) + 1) % len(CURRENCIES)] for code in currency[~wrong_amount]])
    paid_currency = currency.copy()
    paid_currency[~wrong_amount] = shift
    at_stake = np.where(wrong_amount, np.abs(paid_amount - amount), amount)
    return paid_amount, paid_currency, at_stake


def _add_outside_noise(g: _Generator, day0: int, day_end: int, late_us: int) -> None:
    """Breaks of other days and non-payments inside the read window: none may be reported today."""
    c, strays = g.per_class, g.injected[DiscrepancyClass.MISSING_IN_RED_PACKET]
    stray = g.ids("x-", np.arange(strays))
    stray_at = g.uniform(day0, day_end - _US, strays)
    stray_amount, stray_currency = g.uniform(100, 200_000, strays), g.currencies(strays)
    g.add_transfers(stray, stray_at, stray_amount, stray_currency)
    g.book(DiscrepancyClass.MISSING_IN_RED_PACKET, stray, stray_currency, stray_amount)
    previous = g.ids("p-", np.arange(c))  # unpaid grants of the previous evening: yesterday's break
    g.add_grants(previous, g.uniform(day0 - late_us, day0, c), g.uniform(100, 9_999, c), g.currencies(c), "GRANTED")
    tomorrow = g.ids("y-", np.arange(c))  # unmatched transfers of tomorrow morning: tomorrow's break
    g.add_transfers(tomorrow, g.uniform(day_end, day_end + late_us, c), g.uniform(100, 9_999, c), g.currencies(c))
    cancelled = g.ids("c-", np.arange(c))  # cancelled grants owe nothing
    g.add_grants(cancelled, g.uniform(day0, day_end, c), g.uniform(100, 9_999, c), g.currencies(c), "CANCELLED")


def write_parquet(ledgers: SyntheticLedgers, root: Path, *, row_group_rows: int = 1_000_000) -> None:
    """Exports laid out the way :class:`spark_reconcile.sources.ParquetSource` reads them."""
    for name, table in ledgers.tables().items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "part-00000.parquet", row_group_size=row_group_rows)


_KEYS: Final = {Ledger.RED_PACKET.value: "grant_id", Ledger.PAYMENT.value: "transfer_id",
                 Ledger.COMPENSATION.value: "request_id", ATTEMPTS_TABLE: "request_id"}  # fmt: skip
"""Each table's generated key column: a date's rows are the ones whose key starts with its tag."""


async def load_postgres_async(ledgers: SyntheticLedgers, dsn: str) -> None:
    """Create the upstream tables if needed and COPY all four tables in (compensation schema
    migrated), replacing the rows an earlier load of the same date wrote, in one transaction: a
    date loaded twice is that date once, and other dates are left as they are."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(UPSTREAM_DDL)
        with tempfile.TemporaryDirectory(prefix="ledgers-csv-") as folder:
            async with connection.transaction():
                if ledgers.tag:
                    for name in reversed(list(ledgers.tables())):  # attempts before their requests
                        await connection.execute(f"DELETE FROM {name} WHERE {_KEYS[name]} LIKE $1", f"{ledgers.tag}-%")
                for name, table in ledgers.tables().items():
                    path = Path(folder) / f"{name}.csv"
                    pa_csv.write_csv(table, path, pa_csv.WriteOptions(include_header=False))
                    await connection.copy_to_table(name, source=path, columns=table.column_names, format="csv")
        for statement in _UPSTREAM_INDEXES:
            await connection.execute(statement)
        await connection.execute("ANALYZE")
    finally:
        await connection.close()


def load_postgres(ledgers: SyntheticLedgers, dsn: str) -> None:
    asyncio.run(load_postgres_async(ledgers, dsn))
