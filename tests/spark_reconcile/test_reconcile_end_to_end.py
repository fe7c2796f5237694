"""End to end over JDBC: generated ledgers in a real PostgreSQL, every class injected at its own count.

Expected values come only from the generator's books (what it injected, the totals it wrote). The
module runs the pipeline three times on one database: a dry run, a rerun that enqueues through the
outbox (one send failing), and a rerun that must add nothing new and sends only what waited; plus
runs that fail at chosen points and must leave nothing behind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow.parquet as pq
import pytest
from conftest import BUSINESS_DATE  # this folder's: imported while it is collected, not later
from pyspark.sql import SparkSession
from reconcile_http import recording_api

from ledger import pg
from ledger.kinds import Kind, TransferPayload, decode_payload
from spark_reconcile import delivery, fixes, pipeline, summary
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import DiscrepancyClass
from spark_reconcile.sources import JdbcConnection, JdbcSource
from spark_reconcile.synthetic import SyntheticLedgers, generate, load_postgres

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("jdbc_driver")]

# Distinct counts per class: a rule reporting one class under another's name cannot pass.
INJECTED = {cls.value: count for count, cls in enumerate(DiscrepancyClass, start=2)}
PAYER = "red-packet-escrow"


@pytest.fixture(scope="module")
def database(postgres: pg.EmbeddedPostgres, migrated_template: str) -> str:
    dsn = postgres.dsn.rsplit("/", 1)[0] + "/reconcile_e2e"
    asyncio.run(_execute(postgres.dsn, f"CREATE DATABASE reconcile_e2e TEMPLATE {migrated_template}"))
    return dsn


@pytest.fixture(scope="module")
def business_params() -> ReconcileParams:
    return ReconcileParams(business_date=BUSINESS_DATE)


@pytest.fixture(scope="module")
def ledgers(database: str, business_params: ReconcileParams) -> SyntheticLedgers:
    generated = generate(rows=4_000, per_class=INJECTED, params=business_params, seed=11)
    load_postgres(generated, database)
    return generated


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e") / "out"


@pytest.fixture(scope="module")
def first_run(
    spark: SparkSession,
    database: str,
    ledgers: SyntheticLedgers,
    business_params: ReconcileParams,
    output_dir: Path,
) -> pipeline.PipelineResult:
    return _run(spark, database, business_params, output_dir)


def _run(
    spark: SparkSession, dsn: str, params: ReconcileParams, out: Path, *, api: delivery.ApiTarget | None = None
) -> pipeline.PipelineResult:
    source = JdbcSource(connection=JdbcConnection.from_dsn(dsn), partitions=2, fetch_size=1_000)
    config = pipeline.PipelineConfig(
        params=params, output_root=out, dsn=dsn, enqueue=api is not None, api=api, payer_account=PAYER
    )
    return pipeline.run(spark, source, config)


def test_counts_and_amounts_equal_the_injection(first_run: pipeline.PipelineResult, ledgers: SyntheticLedgers) -> None:
    assert first_run.summary.counts() == ledgers.injection.counts
    assert {k: v for k, v in first_run.summary.amounts().items() if v} == {
        k: v for k, v in ledgers.injection.amounts.items() if v
    }


def test_every_injected_break_is_listed_by_business_id(
    first_run: pipeline.PipelineResult, ledgers: SyntheticLedgers
) -> None:
    table = pq.read_table(first_run.discrepancies)
    listed: dict[str, set[str]] = {cls.value: set() for cls in DiscrepancyClass}
    for row in table.select(["discrepancy_class", "business_id"]).to_pylist():
        listed[row["discrepancy_class"]].add(row["business_id"])
    assert listed == {name: set(ids) for name, ids in ledgers.injection.business_ids.items()}
    assert table.num_rows == sum(ledgers.injection.counts.values())


def test_ledger_totals_and_net_difference_equal_what_was_written(
    first_run: pipeline.PipelineResult, ledgers: SyntheticLedgers
) -> None:
    written = {
        ledger: {currency: {"count": n, "amount_minor": amount} for currency, (n, amount) in per.items()}
        for ledger, per in ledgers.injection.ledger_totals.items()
    }
    assert first_run.summary.day_totals() == written
    paid, granted = written["payment_transfers"], written["red_packet_grants"]
    assert first_run.summary.net_difference() == {
        c: paid.get(c, {}).get("amount_minor", 0) - granted.get(c, {}).get("amount_minor", 0)
        for c in sorted(set(paid) | set(granted))
    }


def test_run_summary_is_in_postgres_and_json(
    first_run: pipeline.PipelineResult, database: str, ledgers: SyntheticLedgers
) -> None:
    runs, classes = asyncio.run(_fetch_summary(database))
    assert [(r["run_id"], r["discrepancies"]) for r in runs] == [
        (first_run.summary.run_id, sum(ledgers.injection.counts.values()))
    ]
    assert json.loads(runs[0]["input_rows"]) == {
        "payment_transfers": ledgers.transfers.num_rows,
        "red_packet_grants": ledgers.grants.num_rows,
        "compensation_requests": ledgers.requests.num_rows,
    }
    assert {name: sum(r["n"] for r in classes if r["discrepancy_class"] == name) for name in INJECTED} == INJECTED
    on_disk = json.loads(first_run.summary_json.read_text())
    duplicates = on_disk["classes"][DiscrepancyClass.DUPLICATE_PAYOUT.value]
    assert duplicates["count"] == INJECTED["duplicate_payout"]
    assert on_disk == json.loads(json.dumps(first_run.summary.to_json()))


def test_every_proposed_fix_is_a_valid_transfer_paying_an_unpaid_grant(first_run: pipeline.PipelineResult) -> None:
    """Read as the API would read them: strict JSON validation of each line's payload."""
    lines = [json.loads(line) for line in first_run.fixes_jsonl.read_text().splitlines()]
    unpaid = [
        row
        for row in pq.read_table(first_run.discrepancies).to_pylist()
        if row["discrepancy_class"] == DiscrepancyClass.MISSING_IN_PAYMENT.value
    ]
    assert len(lines) == len(unpaid) > 0 and first_run.fixes_refused == ()
    proposed = set()
    for line in lines:
        assert set(line) == {"idempotency_key", "kind", "ref_key", "payload"} and line["kind"] == Kind.TRANSFER.value
        payload = decode_payload(Kind.TRANSFER, json.dumps(line["payload"]).encode())
        assert isinstance(payload, TransferPayload)
        assert (payload.transfer_id, payload.payer, payload.memo) == (
            line["idempotency_key"],
            PAYER,
            "reconciliation: missing_in_payment",
        )
        proposed.add((line["ref_key"], payload.payee, payload.amount_minor, payload.currency))
    assert proposed == {(r["business_id"], r["recipient"], r["amount_minor"], r["currency"]) for r in unpaid}


def test_report_is_self_contained_html_with_charts(first_run: pipeline.PipelineResult) -> None:
    page = first_run.report.read_text(encoding="utf-8")
    assert page.count("<svg") >= 2
    for fetched in ("<script", "<link", " src=", "url(", "https://"):
        assert fetched not in page
    for row in pq.read_table(first_run.discrepancies).select(["business_id"]).to_pylist():
        assert row["business_id"] in page  # small run: every break is listed


def test_rerun_replaces_the_date_and_enqueues_each_fix_once(
    spark: SparkSession,
    first_run: pipeline.PipelineResult,
    database: str,
    business_params: ReconcileParams,
    output_dir: Path,
    ledgers: SyntheticLedgers,
) -> None:
    dry_run_keys = [f.idempotency_key for f in fixes.read_jsonl(first_run.fixes_jsonl)]
    assert len(dry_run_keys) == ledgers.injection.counts[DiscrepancyClass.MISSING_IN_PAYMENT.value]
    with recording_api() as api:
        target = delivery.ApiTarget(url=api.url, token=api.token)
        api.fail_next = 1  # one send is answered 503: it, and what was not sent yet, waits in the outbox
        second = _run(spark, database, business_params, output_dir, api=target)
        assert second.enqueued is not None and second.enqueued.added == len(dry_run_keys)
        waiting = second.enqueued.after.pending
        assert waiting >= 1 and len(api.keys) == len(dry_run_keys) - waiting
        third = _run(spark, database, business_params, output_dir, api=target)
        assert sorted(api.keys) == sorted(dry_run_keys)  # each fix delivered exactly once overall
    assert [f.idempotency_key for f in fixes.read_jsonl(third.fixes_jsonl)] == dry_run_keys
    assert third.enqueued is not None and (third.enqueued.added, third.enqueued.already) == (0, len(dry_run_keys))
    assert third.enqueued.complete and third.enqueued.relayed is not None
    assert third.enqueued.relayed.sent == waiting
    runs, _ = asyncio.run(_fetch_summary(database))
    assert [r["run_id"] for r in runs] == [third.summary.run_id]
    assert output_dir.joinpath(f"date={business_params.business_date}").resolve() == third.run_dir
    assert sorted(p.name for p in (output_dir / "runs").iterdir()) == [third.summary.run_id]
    delivered = asyncio.run(_fetch(database, "SELECT count(*) AS n FROM compensator_outbox WHERE state = 'sent'"))
    assert delivered[0]["n"] == len(dry_run_keys)


@pytest.fixture()
def failing_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def install(target: Any, name: str) -> None:
        original = getattr(target, name)

        def fail(*args: Any, **kwargs: Any) -> Any:
            if name == "persist":  # publish the files, then fail the commit
                kwargs["before_commit"]()
            elif name == "render":
                original(*args, **kwargs)
            raise RuntimeError(f"injected failure in {name}")

        monkeypatch.setattr(target, name, fail)

    yield install


@pytest.mark.parametrize("failure", ["render", "persist"])
def test_a_failed_run_leaves_no_partial_results(
    spark: SparkSession,
    first_run: pipeline.PipelineResult,
    database: str,
    business_params: ReconcileParams,
    output_dir: Path,
    failing_at: Any,
    failure: str,
) -> None:
    from spark_reconcile import report

    before_runs, before_classes = asyncio.run(_fetch_summary(database))
    before_files = sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*"))
    link_before = output_dir.joinpath(f"date={business_params.business_date}").resolve()
    failing_at(report if failure == "render" else summary, failure)
    with pytest.raises(RuntimeError, match="injected failure"):
        _run(spark, database, business_params, output_dir)
    assert asyncio.run(_fetch_summary(database)) == (before_runs, before_classes)
    assert sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*")) == before_files
    assert output_dir.joinpath(f"date={business_params.business_date}").resolve() == link_before


async def _fetch_summary(dsn: str) -> tuple[list[Any], list[Any]]:
    runs = await _fetch(dsn, "SELECT run_id::text, discrepancies, input_rows::text FROM reconciliation_runs")
    classes = await _fetch(
        dsn,
        "SELECT discrepancy_class, currency, discrepancy_count AS n, amount_minor"
        " FROM reconciliation_class_totals ORDER BY 1, 2",
    )
    return [dict(r) for r in runs], [dict(r) for r in classes]


async def _fetch(dsn: str, query: str) -> list[Any]:
    connection = await asyncpg.connect(dsn)
    try:
        return list(await connection.fetch(query))
    finally:
        await connection.close()


async def _execute(dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
