"""One reconciliation run end to end: the composition of the job and its edges.

Owns: the order that makes a run all-or-nothing. Everything is written to a staging folder first
(discrepancy Parquet, summary JSON, HTML report, fixes JSONL); then, inside the PostgreSQL
transaction that replaces the date's run summary, the staged folder is published; the previous run
is deleted only after the commit. Any failure before that discards the staging folder and rolls the
transaction back, so a failed run leaves no partial results. Enqueueing fixes happens after the
commit, through the outbox: a delivery failure is reported, it does not undo the reconciliation.

Must never: read the environment (the CLI passes everything in).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession

from ledger import migrate
from spark_reconcile import delivery, job, report, summary
from spark_reconcile import fixes as fixes_module
from spark_reconcile.output import RunOutput
from spark_reconcile.params import ReconcileParams
from spark_reconcile.progress import Progress
from spark_reconcile.sources import LedgerSource


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PipelineConfig:
    params: ReconcileParams
    output_root: Path
    dsn: str | None  # None: no summary in PostgreSQL (Parquet-only runs, benchmarks)
    payer_account: str  # the account fixes pay from: which account pays is the caller's choice
    enqueue: bool = False
    api: delivery.ApiTarget | None = None  # with enqueue: also send the outbox once; else the relay does
    trend_runs: int = 30
    job: job.JobConfig = dataclasses.field(default_factory=job.JobConfig)

    def validate(self) -> None:
        if self.enqueue and self.dsn is None:
            raise ValueError("--enqueue needs the database: the fixes go through its outbox")
        if self.api is not None and not self.enqueue:
            raise ValueError("an API target only makes sense with --enqueue")
        fixes_module.check_account(self.payer_account)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PipelineResult:
    summary: summary.RunSummary
    run_dir: Path
    date_link: Path
    discrepancies: Path
    report: Path
    summary_json: Path
    fixes_jsonl: Path
    fixes_refused: tuple[fixes_module.Refusal, ...]
    enqueued: delivery.EnqueueResult | None  # None: dry run


def run(
    spark: SparkSession,
    source: LedgerSource,
    config: PipelineConfig,
    *,
    progress_stream: TextIO | None = None,
) -> PipelineResult:
    config.validate()
    started = dt.datetime.now(dt.UTC)
    run_id = str(uuid.uuid4())
    output = RunOutput(root=config.output_root.resolve(), business_date=config.params.business_date, run_id=run_id)
    progress = Progress(progress_stream, spark=spark)
    progress.emit(stage="run", state="start", run_id=run_id, date=config.params.business_date.isoformat())
    if config.dsn is not None:
        migrate.apply(config.dsn)
    staging = output.prepare()
    try:
        result = job.run(spark, source, config.params, staging, progress=progress, config=config.job)
        with progress.stage("outputs"):
            plan = fixes_module.build_fixes(result.fixable, payer_account=config.payer_account)
            fixes_module.write_jsonl(plan.proposed, staging / "fixes.jsonl")
            if plan.refused:
                progress.emit(stage="outputs", fixes_refused=len(plan.refused))
            run_summary = summary.RunSummary(
                run_id=run_id,
                business_date=config.params.business_date,
                started_at=started,
                finished_at=dt.datetime.now(dt.UTC),
                source=source.describe(),
                parameters=config.params.as_json(),
                class_totals=result.class_totals,
                ledger_totals=result.ledger_totals,
                output_uri=str(output.final),
                fixes_proposed=len(plan.proposed),
                fixes_refused=len(plan.refused),
                stage_timings_s=result.timings_s,
            )
            trend = _trend(config)
            (staging / "summary.json").write_text(json.dumps(run_summary.to_json(), indent=2, sort_keys=True))
            (staging / "report.html").write_text(
                report.render(
                    run_summary,
                    listing=result.listing,
                    trend=trend,
                    parquet_uri=str(output.link / job.DISCREPANCIES_FOLDER),
                ),
                encoding="utf-8",
            )
        with progress.stage("publish"):
            previous = _publish(config, output, run_summary)
    except BaseException:
        output.discard()
        raise
    output.retire(previous)
    enqueued: delivery.EnqueueResult | None = None
    if config.enqueue and config.dsn is not None:
        with progress.stage("enqueue"):
            enqueued = delivery.enqueue(config.dsn, list(plan.proposed), api=config.api)
    progress.emit(stage="run", state="done", discrepancies=sum(run_summary.counts().values()))
    return PipelineResult(
        summary=run_summary,
        run_dir=output.final,
        date_link=output.link,
        discrepancies=output.link / job.DISCREPANCIES_FOLDER,
        report=output.link / "report.html",
        summary_json=output.link / "summary.json",
        fixes_jsonl=output.link / "fixes.jsonl",
        fixes_refused=plan.refused,
        enqueued=enqueued,
    )


def _publish(config: PipelineConfig, output: RunOutput, run_summary: summary.RunSummary) -> Path | None:
    """Swap the files in inside the summary transaction; undo the swap if the commit fails."""
    if config.dsn is None:
        return output.publish()
    swapped: list[Path | None] = []

    def publish() -> Path | None:
        swapped.append(output.publish())
        return swapped[0]

    try:
        return summary.persist(config.dsn, run_summary, before_commit=publish)
    except BaseException:
        if swapped:
            output.restore(swapped[0])
        raise


def _trend(config: PipelineConfig) -> list[summary.TrendPoint]:
    if config.dsn is None:
        return []
    return summary.recent(config.dsn, before=config.params.business_date, limit=config.trend_runs)
