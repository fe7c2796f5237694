"""``compensator reconcile`` and ``compensator seed-ledgers``: the job's own entry and wiring.

Owns: the two subcommands' arguments (:func:`add_reconcile_arguments`, :func:`add_seed_arguments`:
the ``compensator`` command line registers them, compensator/commands/reconcile.py, and fills what
the service's configuration knows, such as where the projector's ledger is), the spark-submit entry
(:func:`main`, the reconcile command alone, which runs without the compensator package), reading the environment
(``COMPENSATOR_PG_DSN``, ``COMPENSATOR_API_URL``, ``COMPENSATOR_API_TOKEN``, ``COMPENSATOR_PG_DATA``;
the token only from the environment, where ``ps`` cannot show it, and never printed), choosing the database
(configured DSN, else an embedded PostgreSQL in a dedicated data folder), building the session and
the source, and printing where the results are. An expected failure is a :class:`ReconcileError` (or
a ``ValueError`` from a parameter check): one line for the operator, exit status 1.

Must never: import compensator (it is the composition root that imports this module, and spark-submit
runs the job without it), or import Spark at module import time (``compensator --help`` must stay
instant).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from spark_reconcile.params import JDBC_JAR

DEFAULT_OUTPUT: Final = Path("var/reconcile")
DEFAULT_PG_DATA: Final = Path("var/pg/data")
API_URL_ENV: Final = "COMPENSATOR_API_URL"
API_TOKEN_ENV: Final = "COMPENSATOR_API_TOKEN"
DEFAULT_PAYER_ACCOUNT: Final = "red-packet-escrow"
"""The account fixes pay unpaid red packets from, unless ``--payer-account`` names another."""
PG_DATA_ENV: Final = "COMPENSATOR_PG_DATA"
PYSPARK_GATEWAY_ENV: Final = "PYSPARK_GATEWAY_PORT"
"""Set under spark-submit, whose --jars carries the driver."""
PARQUET_FOLDERS: Final = ("payment_transfers", "red_packet_grants", "compensation_requests")
"""One folder per ledger under --parquet-dir: spark_reconcile.schemas.Ledger's values."""
SUBMIT_PROG: Final = "compensator reconcile"
"""The spark-submit entry speaks as ``compensator reconcile`` does: an operator sees one command."""


class ReconcileError(Exception):
    """An expected failure with a one-line message for the operator (exit status 1)."""


_EXPECTED_ERRORS: Final[tuple[type[Exception], ...]] = (ReconcileError, ValueError)
"""What the handlers raise for an expected failure; ValueError is a parameter check refusing a value."""


def _date(text: str) -> dt.date:
    """YYYY-MM-DD, or `yesterday` (the UTC day before today): what a nightly scheduler passes."""
    if text == "yesterday":
        return dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date as YYYY-MM-DD or yesterday, got {text!r}") from None


def _hours(text: str) -> dt.timedelta:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of hours, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"hours must not be negative, got {text!r}")
    return dt.timedelta(hours=value)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _account(text: str) -> str:
    from spark_reconcile.fixes import check_account

    try:
        return check_account(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_seed_arguments(seed: argparse.ArgumentParser) -> None:
    """`compensator seed-ledgers`' arguments."""
    seed.add_argument("--date", type=_date, required=True)
    seed.add_argument("--rows", type=_positive, default=10_000)
    seed.add_argument("--per-class", type=int, help="injected breaks per class (default rows/1000, at least 1)")
    seed.add_argument("--seed", type=int, default=7)
    seed.add_argument("--parquet-dir", type=Path, help="write Parquet exports here instead of PostgreSQL")
    seed.add_argument("--pg-data", type=Path)


class _OneLineParser(argparse.ArgumentParser):
    """A bad argument is one line and exit status 2, as in the ``compensator`` CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.splitlines()[0]}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """The reconcile command alone, for ``spark_reconcile/submit.py``: the same arguments, one-line
    errors and exit statuses as ``compensator reconcile``, without the compensator package."""
    parser = _OneLineParser(prog=SUBMIT_PROG, description="Reconcile the payment, red-packet and compensation ledgers.")
    add_reconcile_arguments(parser)
    arguments = parser.parse_args(argv)
    try:
        return run_reconcile(arguments)
    except _EXPECTED_ERRORS as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"{SUBMIT_PROG}: error: {first_line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{SUBMIT_PROG}: interrupted", file=sys.stderr)
        return 130


def add_reconcile_arguments(reconcile: argparse.ArgumentParser) -> None:
    """`compensator reconcile`'s arguments (and spark-submit's, through `main`)."""
    reconcile.add_argument("--date", type=_date, required=True, help="business date, YYYY-MM-DD (UTC day), or yesterday")
    reconcile.add_argument("--source", choices=("jdbc", "parquet"), default="jdbc")
    reconcile.add_argument("--parquet-dir", type=Path, help="root of the Parquet exports (with --source parquet)")
    reconcile.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT)
    reconcile.add_argument("--master", help="Spark master URL (default local[*]; spark-submit's when submitted)")
    reconcile.add_argument("--late-window-hours", type=_hours, default=dt.timedelta(hours=6))
    reconcile.add_argument("--pending-sla-hours", type=_hours, default=dt.timedelta(hours=4))
    reconcile.add_argument("--jdbc-partitions", type=_positive, default=4)
    reconcile.add_argument("--fetch-size", type=_positive, default=10_000)
    reconcile.add_argument("--shuffle-partitions", type=_positive, default=8)
    reconcile.add_argument("--driver-memory", default="2g")
    reconcile.add_argument("--no-db", action="store_true", help="no run summary in PostgreSQL (Parquet source)")
    reconcile.add_argument("--enqueue", action="store_true", help="put fixes in the outbox (default: dry run)")
    reconcile.add_argument("--api-url", help=f"with --enqueue, also send the outbox once (default ${API_URL_ENV})")
    reconcile.add_argument(
        "--payer-account",
        type=_account,
        default=DEFAULT_PAYER_ACCOUNT,
        help=f"the account fixes pay from (default {DEFAULT_PAYER_ACCOUNT}; the API token is ${API_TOKEN_ENV})",
    )
    reconcile.add_argument("--pg-data", type=Path, help=f"embedded PostgreSQL data folder (${PG_DATA_ENV})")
    reconcile.add_argument(
        "--jdbc-jar", type=Path, default=Path(JDBC_JAR), help=f"the PostgreSQL JDBC driver (default {JDBC_JAR})"
    )
    reconcile.add_argument("--json", action="store_true", help="print the run summary as JSON on stdout")


def _pg_data(arguments: argparse.Namespace) -> Path:
    configured = arguments.pg_data or os.environ.get(PG_DATA_ENV)
    return Path(configured) if configured else DEFAULT_PG_DATA


def run_reconcile(arguments: argparse.Namespace) -> int:
    from spark_reconcile.params import ReconcileParams

    params = ReconcileParams(
        business_date=arguments.date,
        late_window=arguments.late_window_hours,
        pending_sla=arguments.pending_sla_hours,
    )
    _check_before_starting(arguments)
    api = _api_target(arguments) if arguments.enqueue else None
    if arguments.no_db:
        return _reconcile_with(arguments, params, dsn=None, api=api)
    with _database(arguments, create=False) as dsn:
        return _reconcile_with(arguments, params, dsn=dsn, api=api)


def _check_before_starting(arguments: argparse.Namespace) -> None:
    """What can be known wrong before a database or Spark starts, each in one line."""
    if arguments.source == "parquet" and arguments.parquet_dir is None:
        raise ReconcileError("--source parquet needs --parquet-dir")
    if arguments.source == "jdbc" and arguments.no_db:
        raise ReconcileError("--no-db only makes sense with --source parquet")
    if arguments.enqueue and arguments.no_db:
        raise ReconcileError("--enqueue needs the database (the fixes go through its outbox): drop --no-db")
    if arguments.source == "parquet":
        _check_parquet_dir(arguments.parquet_dir)
    elif PYSPARK_GATEWAY_ENV not in os.environ and not Path(arguments.jdbc_jar).is_file():
        raise ReconcileError(
            f"the PostgreSQL JDBC driver {arguments.jdbc_jar} is missing: install it with"
            " `apt-get install libpostgresql-jdbc-java`, or name the jar with --jdbc-jar"
        )


def _check_parquet_dir(root: Path) -> None:
    if not root.is_dir():
        raise ReconcileError(f"--parquet-dir {root}: no such directory")
    missing = [f"{name}/" for name in PARQUET_FOLDERS if not (root / name).is_dir()]
    if missing:
        raise ReconcileError(
            f"--parquet-dir {root} has no {', '.join(missing)} (exports go in one folder per ledger;"
            " `compensator seed-ledgers --parquet-dir` writes demo ones)"
        )


@contextlib.contextmanager
def _database(arguments: argparse.Namespace, *, create: bool) -> Iterator[str]:
    """The configured DSN, or the embedded server in ``--pg-data``; reconcile never creates one."""
    from ledger import pg

    configured = pg.dsn_from_env()
    if configured is not None:
        yield configured
        return
    data = _pg_data(arguments)
    if not create and not (data / "PG_VERSION").is_file():
        raise ReconcileError(
            f"no database in {data}: load ledgers with `compensator seed-ledgers --date ... --pg-data {data}`,"
            f" or point ${pg.DSN_ENV} at yours"
        )
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ReconcileError(f"--pg-data {data}: cannot create it: {error.strerror or error}") from None
    if not os.access(data, os.W_OK | os.X_OK):
        raise ReconcileError(f"--pg-data {data}: not writable")
    stack = contextlib.ExitStack()
    try:
        dsn = stack.enter_context(pg.database(data))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        first = (str(error).splitlines() or [type(error).__name__])[0]
        raise ReconcileError(f"cannot start the embedded PostgreSQL in {data}: {first} (see its server.log)") from None
    try:
        yield dsn
    except BaseException:
        pg.stop_said(stack.close, work_failed=True)
        raise
    if (left_running := pg.stop_said(stack.close, work_failed=False)) is not None:
        raise ReconcileError(left_running)


def _api_target(arguments: argparse.Namespace) -> Any:
    """Where this run sends the outbox once, if anywhere: without a URL the relay sends the fixes."""
    from spark_reconcile.delivery import ApiTarget

    url = arguments.api_url or os.environ.get(API_URL_ENV)
    if not url:
        return None
    token = os.environ.get(API_TOKEN_ENV, "").strip()
    if not token:
        raise ReconcileError(f"sending fixes to {url} needs ${API_TOKEN_ENV}, the compensation API's bearer token")
    return ApiTarget(url=url, token=token)


def _reconcile_with(arguments: argparse.Namespace, params: Any, *, dsn: str | None, api: Any) -> int:
    from spark_reconcile import pipeline, session
    from spark_reconcile.sources import JdbcConnection, JdbcSource, LedgerSource, ParquetSource

    source: LedgerSource
    if arguments.source == "parquet":
        source = ParquetSource(root=str(arguments.parquet_dir.resolve()))
    else:
        assert dsn is not None
        _require_upstream_tables(dsn)
        source = JdbcSource(
            connection=JdbcConnection.from_dsn(dsn),
            partitions=arguments.jdbc_partitions,
            fetch_size=arguments.fetch_size,
        )
    from pyspark.sql import SparkSession

    owns_session = SparkSession.getActiveSession() is None  # in-process callers (tests) keep theirs
    spark = session.build(
        session.SessionConfig(
            master=arguments.master,
            jars=(str(arguments.jdbc_jar),),
            shuffle_partitions=arguments.shuffle_partitions,
            driver_memory=arguments.driver_memory,
        )
    )
    config = pipeline.PipelineConfig(
        params=params,
        output_root=arguments.output_dir,
        dsn=dsn,
        enqueue=arguments.enqueue,
        api=api,
        payer_account=arguments.payer_account,
    )
    try:
        result = pipeline.run(spark, source, config)
    finally:
        if owns_session:
            spark.stop()
    _print_result(result, as_json=arguments.json, stored=dsn is not None)
    enqueued = result.enqueued
    if enqueued is not None and not enqueued.complete:
        print(f"enqueue: {_enqueue_problem(enqueued)}", file=sys.stderr)
        return 1
    return 0


def _enqueue_problem(enqueued: Any) -> str:
    if enqueued.conflicts:
        return (
            f"{len(enqueued.conflicts)} fixes are in the outbox with another body (another --payer-account?);"
            " they were not added again"
        )
    return (
        f"the API did not take every fix: {enqueued.after.pending} pending, {enqueued.after.rejected} rejected"
        " in compensator_outbox (`compensator outbox-relay` sends what is pending)"
    )


def _print_result(result: Any, *, as_json: bool, stored: bool) -> None:
    summary = result.summary
    if as_json:
        print(json.dumps(summary.to_json(), sort_keys=True))
        return
    counts = summary.counts()
    print(f"business date: {summary.business_date.isoformat()}  run: {summary.run_id}")
    print(f"discrepancies: {sum(counts.values())}  " + " ".join(f"{k}={v}" for k, v in counts.items()))
    where = f"PostgreSQL reconciliation_runs run_id={summary.run_id}" if stored else "not stored (--no-db)"
    print(f"run summary:   {where}")
    print(f"discrepancies: {result.discrepancies}")
    print(f"report:        {result.report}")
    print(f"summary json:  {result.summary_json}")
    mode = "dry run" if result.enqueued is None else _enqueue_line(result.enqueued)
    refused = f"{summary.fixes_refused} refused (no valid transfer), " if summary.fixes_refused else ""
    print(f"fixes:         {result.fixes_jsonl} ({summary.fixes_proposed} proposed, {refused}{mode})")


def _enqueue_line(enqueued: Any) -> str:
    line = f"{enqueued.added} new in the outbox, {enqueued.already} already there"
    if enqueued.relayed is None:
        return line + "; `compensator outbox-relay` sends them"
    return line + f"; sent {enqueued.relayed.sent}, {enqueued.after.pending} pending"


def _require_upstream_tables(dsn: str) -> None:
    import asyncio

    import asyncpg

    async def missing() -> list[str]:
        connection = await asyncpg.connect(dsn)
        try:
            rows = await connection.fetch(
                "SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NULL",
                ["payment_transfers", "red_packet_grants", "compensation_requests"],
            )
            return [row["t"] for row in rows]
        finally:
            await connection.close()

    from ledger import migrate

    migrate.apply(dsn)
    absent = asyncio.run(missing())
    if absent:
        raise ReconcileError(
            f"ledger tables missing: {', '.join(absent)} (load them, or try `compensator seed-ledgers --date ...`)"
        )


def run_seed(arguments: argparse.Namespace) -> int:
    from ledger import migrate, pg
    from spark_reconcile import synthetic
    from spark_reconcile.params import ReconcileParams

    params = ReconcileParams(business_date=arguments.date)
    per_class = arguments.per_class if arguments.per_class is not None else max(1, arguments.rows // 1000)
    ledgers = synthetic.generate(rows=arguments.rows, per_class=per_class, params=params, seed=arguments.seed)
    if arguments.parquet_dir is not None:
        try:
            synthetic.write_parquet(ledgers, arguments.parquet_dir)
        except OSError as error:
            raise ReconcileError(f"--parquet-dir {arguments.parquet_dir}: {error.strerror or error}") from None
        print(f"wrote Parquet exports to {arguments.parquet_dir}")
    else:
        with _database(arguments, create=True) as dsn:
            migrate.apply(dsn)
            synthetic.load_postgres(ledgers, dsn)
            print(f"loaded ledgers into {pg.redacted(dsn)}")
    print(json.dumps({"injected": ledgers.injection.counts}, sort_keys=True))
    return 0
