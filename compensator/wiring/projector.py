"""The projector process kind (``compensator project``): the ledger projector (services/projector/)
of every set (one, or every set of the control set's table) writing the compensation ledger to
PostgreSQL in one transaction per round, with its store clients, its tracer and its metrics.

The database is ``$COMPENSATOR_PG_DSN``, else an embedded server in `projector.pg_data`, started
(off the loop: pg_ctl waits) if it is not running and stopped when the process ends; the schema is
migrated first. A stop signal while the server starts is acted on once it has started, so it is
never left half-started. ``rebuild`` empties one set's ledger and projects it again from the log's
first event, when the store still has it.

Must never: run anything at import, or leave a gap unreported (a gap, a ledger that disagrees with
the log, a database that is gone end the process in one line; with several sets a gap or a
disagreement stops that set's projection, loudly, and ends the process when no set is left).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import asyncpg
from opentelemetry.sdk.trace.export import SpanExporter

from compensator.config import Config
from compensator.shell import ProcessError, Running, Shell
from compensator.telemetry import tracer_provider
from compensator.wiring.parts import (
    every_set,
    gc_policy,
    ledger_database,
    metrics_address,
    process_name,
    table_rereader,
)
from ledger import migrate
from queues import ClientError, QueueError
from services.projector.ledger_writer import CursorMoved, LedgerMismatch
from services.projector.metrics import ProjectorMetrics
from services.projector.rows import ProjectionError
from services.projector.runner import (
    EveryLaneStopped,
    Projector,
    ProjectorGap,
    ProjectorSettings,
    RebuildRefused,
    rebuild,
)

T = TypeVar("T")
STOPS_THE_PROJECTOR = (
    ProjectorGap, ProjectionError, LedgerMismatch, CursorMoved, EveryLaneStopped, RebuildRefused, migrate.MigrationError,
)  # fmt: skip
"""What the projector stops on, in one line: it cannot go on without a person. With several sets,
one set's gap or mismatch stops that set only (runner.py); the process ends when none is left."""


def shell(config: Config) -> Shell:
    settings = config.projector
    return Shell(
        name="project", metrics=metrics_address(settings.metrics_host, settings.metrics_port), gc=gc_policy(config)
    )


@contextlib.asynccontextmanager
async def projector(config: Config, dsn: str, *, name: str = "",
                    span_exporter: SpanExporter | None = None) -> AsyncIterator[Projector]:  # fmt: skip
    """The ledger projector of every set writing to `dsn` (`store.set_id`'s alone, or with
    `store.control_addresses` every set of the control set's table, re-read every
    `store.sets_refresh_s`), with its store clients, closed on exit."""
    settings = config.projector
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="projector")
    sets, found = await every_set(config)
    built = Projector(
        sets, dsn,
        ProjectorSettings(owner=name or process_name(), batch_max=settings.batch_max,
                          idle_poll_s=settings.idle_poll_ms / 1000, standby_poll_s=settings.standby_poll_ms / 1000,
                          discover_every_s=config.store.sets_refresh_s, round_gather_s=settings.round_gather_ms / 1000),
        tracer=provider.get_tracer("compensator.projector"), metrics=ProjectorMetrics(),
        discover=None if found is None else table_rereader(found),
    )  # fmt: skip
    try:
        yield built
    finally:
        if found is not None:
            await found.close()  # every set's client, the ones found later too, and the control set's
        else:
            for queue in sets.values():
                await queue.raft.close()
        provider.shutdown()


async def _one_line(step: Callable[[], Awaitable[T]]) -> T:
    """The step's result; what stops the projector, as the one line the process ends with."""
    try:
        return await step()
    except STOPS_THE_PROJECTOR as error:
        raise ProcessError(str(error)) from None
    except (ClientError, QueueError) as error:  # only before projecting (a rebuild): the loop waits the store out
        raise ProcessError(f"the store did not answer: {error}") from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise ProcessError(f"PostgreSQL: {type(error).__name__}: {error}") from None


@contextlib.asynccontextmanager
async def process(config: Config, *, pg_data: Path | None = None, name: str = "",
                  rebuild_ledger: bool = False, rebuild_set: int | None = None) -> AsyncIterator[Running]:  # fmt: skip
    """`compensator project`: SIGTERM stops it after the round being written commits. `rebuild_set`
    (default `store.set_id`) is the set a rebuild empties."""
    async with ledger_database(pg_data or Path(config.projector.pg_data)) as dsn:
        await _one_line(lambda: migrate.apply_async(dsn))
        async with projector(config, dsn, name=name) as running:

            async def run(stop: asyncio.Event) -> int:
                if rebuild_ledger:
                    set_id = config.store.set_id if rebuild_set is None else rebuild_set
                    if set_id not in running.sets:
                        raise ProcessError(f"--set {set_id}: no such set (this projector has {_listed(running.sets)})")
                    deleted = await _one_line(lambda: rebuild(running.sets[set_id], dsn, set_id))
                    print(f"set {set_id}: ledger emptied ({deleted} requests); projecting from event 1", flush=True)
                print(f"projector for {_listed(running.sets)} running; SIGTERM stops it", flush=True)
                await _one_line(lambda: running.run(stop))
                cursors = running.cursors
                stopped = (f"at event {running.cursor}" if len(running.sets) == 1 else
                           "at " + (", ".join(f"set {k} event {c}" for k, c in cursors.items()) or "no set held"))  # fmt: skip
                halted = f" ({_listed(running.stopped)} stopped on an error, see above)" if running.stopped else ""
                print(f"projector stopped {stopped}: {running.projected} events projected{halted}", flush=True)
                return 0

            yield Running(run, registry=running.metrics.registry)


def _listed(sets: Mapping[int, object]) -> str:
    ids = sorted(sets)
    return ("set " if len(ids) == 1 else "sets ") + ",".join(map(str, ids))
