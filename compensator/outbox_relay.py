"""``compensator outbox-relay``: send one producer's outbox to the compensation API.

    compensator outbox-relay --config producer.toml          # until SIGTERM
    compensator outbox-relay --config producer.toml --once   # what is due now, then exit (cron)

Settings are the ``[outbox]`` section (compensator/config.py): the producer's database, the API's
URL, batch and backoff limits, a metrics port. The bearer token comes from ``outbox.token_file`` or
``$COMPENSATOR_OUTBOX_TOKEN``, never from the command line (``ps`` shows it) and never printed.

Must never: print the token or the DSN (it may hold a password), or start on a configuration that
did not validate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any, Final

from compensator.api_server import add_config_argument, load
from compensator.config import Config

TOKEN_ENV: Final = "COMPENSATOR_OUTBOX_TOKEN"


class OutboxRelayError(ValueError):
    """Bad relay settings, or a producer database it cannot use: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    relay = subparsers.add_parser("outbox-relay", help="send a producer's outbox rows to the compensation API")
    add_config_argument(relay)
    relay.add_argument("--once", action="store_true", help="send what is due now, print the outbox's counts, exit")
    relay.add_argument(
        "--install-table", action="store_true", help="create the outbox table in the producer's database if missing"
    )
    relay.set_defaults(handler=serve)


def read_token(config: Config, environ: dict[str, str] | None = None) -> str:
    environ = dict(os.environ) if environ is None else environ
    if config.outbox.token_file:
        try:
            token = Path(config.outbox.token_file).read_text().strip()
        except OSError as error:
            raise OutboxRelayError(f"outbox.token_file: cannot read it: {error.strerror or error}") from None
        if not token:
            raise OutboxRelayError("outbox.token_file: the file is empty")
        return token
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise OutboxRelayError(f"no API token: set outbox.token_file, or ${TOKEN_ENV}")
    return token


def serve(args: argparse.Namespace) -> int:
    import outbox

    config = load(args)
    if not config.outbox.dsn:
        raise OutboxRelayError(
            "outbox.dsn is empty: name the producer's PostgreSQL ([outbox] dsn, or COMPENSATOR_OUTBOX__DSN)"
        )
    try:
        target = outbox.ApiTarget(url=config.outbox.api_url or config.api_url, token=read_token(config))
    except ValueError as error:
        raise OutboxRelayError(str(error)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(_run(config, target, once=args.once, install=args.install_table))


async def _run(config: Config, target: Any, *, once: bool, install: bool) -> int:
    import asyncpg

    import outbox

    settings = config.outbox
    try:
        pool = await asyncpg.create_pool(config.outbox.dsn, min_size=1, max_size=2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as error:
        raise OutboxRelayError(f"cannot reach the producer's database: {type(error).__name__}: {error}") from None
    try:
        async with pool.acquire() as connection:
            if install:
                await outbox.install(connection, settings.table)
            elif not await outbox.schema.exists(connection, settings.table):
                raise OutboxRelayError(
                    f"table {settings.table} is missing in the producer's database: create it (docs/outbox.md),"
                    " or run with --install-table"
                )
        async with outbox.Relay(pool, target, settings) as relay:
            if once:
                return await _once(relay)
            return await _forever(relay, config)
    finally:
        await pool.close()


async def _once(relay: Any) -> int:
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


async def _forever(relay: Any, config: Config) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = None
    if config.outbox.metrics_port:
        from prometheus_client import start_http_server

        server, _ = start_http_server(
            config.outbox.metrics_port, config.outbox.metrics_host, registry=relay.metrics.registry
        )
    try:
        print(f"outbox relay running: table {config.outbox.table}; SIGTERM stops it", flush=True)
        total = await relay.run(stop)
        print(f"outbox relay stopped: sent {total.sent}, rejected {total.rejected}", flush=True)
        return 0
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.shutdown()
