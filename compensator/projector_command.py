"""``compensator project``: write the compensation ledger (PostgreSQL) from the set's event log.

Run one per set, or more: the others stand by and take over when the active one stops or dies
(docs/ledger.md). The database is ``$COMPENSATOR_PG_DSN``, else an embedded server in
``projector.pg_data`` (``--pg-data``), started if it is not running; the schema is migrated first.
SIGTERM or Ctrl-C stops it after the batch being written commits. ``--rebuild`` empties the set's
ledger and writes it again from the log's first event, when the store still has it.

Must never: start on a configuration that did not validate, or leave a gap unreported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

from compensator.api_server import add_config_argument, load
from compensator.config import Config


class ProjectorCommandError(ValueError):
    """The projector had to stop (a gap, a ledger that disagrees with the log, no database): one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    project = subparsers.add_parser("project", help="write the compensation ledger from the store's event log")
    add_config_argument(project)
    project.add_argument("--pg-data", type=Path, help="embedded PostgreSQL data folder (overrides projector.pg_data)")
    project.add_argument("--id", default="", help="this projector's name in the cursor row (default host:pid)")
    project.add_argument("--rebuild", action="store_true",
                         help="empty this set's ledger and project it again from the first event (see docs/ledger.md)")  # fmt: skip
    project.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    config = load(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from ledger import pg

    # Until the event loop takes SIGTERM over, it unwinds like Ctrl-C: a launcher that stops us
    # while the embedded server starts must not leave a half-started server behind.
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as stack:
        pg_data = args.pg_data or Path(config.projector.pg_data)
        try:
            dsn = stack.enter_context(pg.database(pg_data))
        except (OSError, subprocess.SubprocessError) as error:
            raise ProjectorCommandError(f"cannot start an embedded PostgreSQL in {pg_data}: {error}") from None
        return asyncio.run(_run(config, dsn, name=args.id, rebuild=args.rebuild))
    raise AssertionError("unreachable: the block returns or raises")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _run(config: Config, dsn: str, *, name: str, rebuild: bool) -> int:
    import asyncpg

    from compensator.projector.ledger_writer import CursorMoved, LedgerMismatch
    from compensator.projector.rows import ProjectionError
    from compensator.projector.runner import ProjectorGap, RebuildRefused
    from ledger import migrate
    from queues import ClientError, QueueError

    try:
        await migrate.apply_async(dsn)
        return await _project(config, dsn, name=name, rebuild=rebuild)
    except (
        ProjectorGap,
        ProjectionError,
        LedgerMismatch,
        CursorMoved,
        RebuildRefused,
        migrate.MigrationError,
    ) as error:
        raise ProjectorCommandError(str(error)) from None
    except (ClientError, QueueError) as error:  # only before projecting (a rebuild): the loop waits the store out
        raise ProjectorCommandError(f"the store did not answer: {error}") from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise ProjectorCommandError(f"PostgreSQL: {type(error).__name__}: {error}") from None


async def _project(config: Config, dsn: str, *, name: str, rebuild: bool) -> int:
    from compensator.projector.runner import rebuild as rebuild_ledger
    from compensator.wiring import projector

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with projector(config, dsn, name=name) as running:
        if rebuild:
            deleted = await rebuild_ledger(running.queue, dsn, config.store.set_id)
            print(
                f"set {config.store.set_id}: ledger emptied ({deleted} requests); projecting from event 1", flush=True
            )
        server = None
        if config.projector.metrics_port:
            from prometheus_client import start_http_server

            server, _ = start_http_server(config.projector.metrics_port, config.projector.metrics_host,
                                          registry=running.metrics.registry)  # fmt: skip
        try:
            print(f"projector for set {config.store.set_id} running; SIGTERM stops it", flush=True)
            await running.run(stop)
        finally:
            if server is not None:
                server.shutdown()
        print(f"projector stopped at event {running.cursor}: {running.projected} events projected", flush=True)
    return 0
