"""The outbox relay process kind (``compensator outbox-relay``): one producer's outbox (outbox/)
sent to the compensation API, from the ``[outbox]`` section: the producer's database, the API's URL,
batch and backoff limits, a metrics port.

The bearer token comes from ``outbox.token_file`` or ``$COMPENSATOR_OUTBOX_TOKEN``, never from the
command line (``ps`` shows it) and never printed.

Must never: run anything at import, or print the token or the DSN (it may hold a password).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

import asyncpg

import outbox
from compensator.config import Config
from compensator.shell import ProcessError, Running, Shell
from compensator.wiring.parts import gc_policy, metrics_address

TOKEN_ENV: Final = "COMPENSATOR_OUTBOX_TOKEN"


def shell(config: Config, *, once: bool = False) -> Shell:
    """`once`: a run of a few seconds beside the long-running relay serves no metrics (its port is that one's)."""
    settings = config.outbox
    metrics = None if once else metrics_address(settings.metrics_host, settings.metrics_port)
    return Shell(name="outbox-relay", metrics=metrics, quiet={"httpx": logging.WARNING}, gc=gc_policy(config))


def read_token(config: Config, environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    if config.outbox.token_file:
        try:
            token = Path(config.outbox.token_file).read_text().strip()
        except OSError as error:
            raise ProcessError(f"outbox.token_file: cannot read it: {error.strerror or error}") from None
        if not token:
            raise ProcessError("outbox.token_file: the file is empty")
        return token
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ProcessError(f"no API token: set outbox.token_file, or ${TOKEN_ENV}")
    return token


def target(config: Config) -> outbox.ApiTarget:
    """Where the rows go, checked before anything starts (a missing DSN or token is one line)."""
    if not config.outbox.dsn:
        raise ProcessError(
            "outbox.dsn is empty: name the producer's PostgreSQL ([outbox] dsn, or COMPENSATOR_OUTBOX__DSN)"
        )
    try:
        return outbox.ApiTarget(url=config.outbox.api_url or config.api_url, token=read_token(config))
    except ValueError as error:
        raise ProcessError(str(error)) from None


@contextlib.asynccontextmanager
async def process(config: Config, api: outbox.ApiTarget, *, once: bool, install: bool) -> AsyncIterator[Running]:
    """Until SIGTERM, or with `once` what is due now and the outbox's counts; `install` creates the
    table when it is missing."""
    settings = config.outbox
    try:
        pool = await asyncpg.create_pool(settings.dsn, min_size=1, max_size=2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as error:
        raise ProcessError(f"cannot reach the producer's database: {type(error).__name__}: {error}") from None
    try:
        async with pool.acquire() as connection:
            if install:
                await outbox.install(connection, settings.table)
            elif not await outbox.schema.exists(connection, settings.table):
                raise ProcessError(
                    f"table {settings.table} is missing in the producer's database: create it (docs/outbox.md),"
                    " or run with --install-table"
                )
        async with outbox.Relay(pool, api, settings) as relay:

            async def run(stop: asyncio.Event) -> int:
                return await (_once(relay) if once else _until_stopped(relay, config, stop))

            yield Running(run, registry=relay.metrics.registry)
    finally:
        await pool.close()


async def _once(relay: outbox.Relay) -> int:
    result = await relay.drain()
    found = await relay.refresh_gauges()
    print(
        f"sent {result.sent}, rejected {result.rejected}; outbox: {found.pending} pending "
        f"(oldest {found.oldest_pending_age_s:.0f} s), {found.sent} sent, {found.rejected} rejected",
        flush=True,
    )
    if result.wait_s > 0:
        print("compensator outbox-relay: the API did not take every request; they stay pending", flush=True)
        return 1
    return 0


async def _until_stopped(relay: outbox.Relay, config: Config, stop: asyncio.Event) -> int:
    print(f"outbox relay running: table {config.outbox.table}; SIGTERM stops it", flush=True)
    total = await relay.run(stop)
    print(f"outbox relay stopped: sent {total.sent}, rejected {total.rejected}", flush=True)
    return 0
