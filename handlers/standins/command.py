"""``compensator standins``: the three stand-ins in one process, for local runs and manual tests.

    compensator standins [--host 127.0.0.1] [--payment-port 7201] [--red-packet-port 7202]
                         [--callback-port 7203] [--pg-dsn DSN | --pg-data DIR]
                         [--secrets-file FILE] [--seed N] [--log-level warning]
                         [--payment-dedup on|off] [--payment-expiry enforce|ignore] [--callback-dedup on|off]

The payment system's modes (handlers/standins/payment.py): ``--payment-dedup off``, every accepted
POST is a new payment (a transfer id paid twice is two rows); ``--payment-expiry enforce``, a POST
whose ``expires_at`` has passed is refused and writes nothing. ``--callback-dedup off``: a merchant
that handles every callback delivery as new. The red-packet service has no switch: a list update
carries its version, which it applies only forward, whatever the key.

The database: ``--pg-dsn``, else ``COMPENSATOR_PG_DSN``, else an embedded PostgreSQL kept in
``--pg-data`` (as ledger/pg.py's `database()` decides). The callback targets' secrets: a JSON object
``{"<target>": "<secret>"}`` from ``--secrets-file``, else from the ``COMPENSATOR_CALLBACK_SECRETS``
variable; never from the command line (``ps`` shows it), never printed: only target names are.

Owns: the arguments, reading the environment, the pre-flight checks that turn the usual mistakes
(a taken port, a database not answering, a secrets file that does not parse) into one line, and
stopping cleanly on SIGINT or SIGTERM. Must never: import the web stack before the command runs
(``compensator --help`` stays instant), or print a DSN or a secret.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from handlers.signing import Secret
    from handlers.standins.server import StandinsSettings

SECRETS_ENV: Final = "COMPENSATOR_CALLBACK_SECRETS"
DEFAULT_PG_DATA: Final = Path("var/standins/pg")
PG_CONNECT_TIMEOUT_S: Final = 5.0
SECRETS_FILE_BYTES_MAX: Final = 1024 * 1024


def register(subparsers: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    """The parser, for a composition root that adds its own options (its configuration file)."""
    standins: argparse.ArgumentParser = subparsers.add_parser(
        "standins", help="serve stand-ins of the payment system, the red-packet service and a callback receiver"
    )
    standins.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    standins.add_argument("--payment-port", type=int, default=7201)
    standins.add_argument("--red-packet-port", type=int, default=7202)
    standins.add_argument("--callback-port", type=int, default=7203)
    standins.add_argument("--pg-dsn", help="PostgreSQL DSN (default $COMPENSATOR_PG_DSN, else an embedded server)")
    standins.add_argument("--pg-data", type=Path, default=DEFAULT_PG_DATA, help="the embedded server's data folder")
    standins.add_argument("--secrets-file", type=Path,
                          help=f'JSON {{"target": "secret"}} for the callback receiver (default ${SECRETS_ENV})')  # fmt: skip
    standins.add_argument("--seed", type=int, help="seed of the fault generators")
    standins.add_argument("--exposed", action="store_true",
                          help="allow a non-loopback --host (a demo network of its own: anyone there can flip faults)")  # fmt: skip
    standins.add_argument("--payment-dedup", choices=("on", "off"), default="on",
                          help="on: one payment per transfer id (default); off: every accepted POST is a new payment")  # fmt: skip
    standins.add_argument("--payment-expiry", choices=("enforce", "ignore"), default="ignore",
                          help="enforce: refuse a POST whose expires_at has passed (it writes nothing); ignore (default)")  # fmt: skip
    standins.add_argument("--callback-dedup", choices=("on", "off"), default="on",
                          help="on: a repeated Idempotency-Key is answered as a repeat (default); off: every delivery is new")  # fmt: skip
    standins.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning")
    standins.set_defaults(handler=run)
    return standins


def run(args: argparse.Namespace) -> int:
    from handlers.standins.server import StandinsError, StandinsSettings

    settings = StandinsSettings(host=args.host, payment_port=args.payment_port, red_packet_port=args.red_packet_port,
                                callback_port=args.callback_port, seed=args.seed, exposed=args.exposed,
                                payment_dedup=args.payment_dedup == "on", payment_expiry=args.payment_expiry == "enforce",
                                callback_dedup=args.callback_dedup == "on")  # fmt: skip
    problems = settings.problems()
    if problems:
        raise StandinsError(problems[0])
    for name, port in settings.ports().items():
        if _port_taken(settings.host, port):
            raise StandinsError(f"port {port} ({name}) is taken on {settings.host}")
    secrets = _secrets(args.secrets_file, os.environ)
    if args.pg_dsn:
        return _serve(settings, args.pg_dsn, secrets, args.log_level)
    import contextlib
    import signal
    import subprocess

    from ledger import pg

    # Until the event loop takes SIGTERM over, it unwinds like Ctrl-C: a launcher that stops us while
    # the embedded server starts must not leave that server running with nobody to stop it.
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as stack:
        try:
            dsn = stack.enter_context(pg.database(args.pg_data))
        except (OSError, subprocess.SubprocessError) as error:
            raise StandinsError(
                f"cannot start an embedded PostgreSQL in {args.pg_data}: {type(error).__name__}"
            ) from None
        return _serve(settings, dsn, secrets, args.log_level)
    raise AssertionError("unreachable: the block returns or raises")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(settings: StandinsSettings, dsn: str, secrets: Mapping[str, Secret], log_level: str) -> int:
    import asyncio
    import logging
    import signal

    from handlers.signing import names
    from handlers.standins.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def started() -> None:
        urls = ", ".join(f"{name} {url}" for name, url in settings.urls().items())
        modes = (f"payment dedup {'on' if settings.payment_dedup else 'off'}, expiry"
                 f" {'enforced' if settings.payment_expiry else 'ignored'};"
                 f" callback dedup {'on' if settings.callback_dedup else 'off'}")  # fmt: skip
        print(f"standins: {urls}; {modes}; callback targets: {', '.join(names(secrets)) or 'none'}; Ctrl-C stops",
              flush=True)  # fmt: skip

    async def main() -> None:
        await _check_database(dsn)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, dsn=dsn, secrets=secrets, stop=stop, on_started=started, log_level=log_level)

    asyncio.run(main())
    return 0


def read_secrets(path: Path | None, environ: Mapping[str, str]) -> dict[str, Secret] | None:
    """The callback targets' secrets: a JSON file if given, else ``$COMPENSATOR_CALLBACK_SECRETS``;
    None when neither is set. The stand-ins and the workers read them the same way."""
    from handlers.signing import secrets_from_json

    if path is not None:
        try:
            with path.open("rb") as handle:
                document = handle.read(SECRETS_FILE_BYTES_MAX + 1)
        except OSError as error:
            raise ValueError(f"{path}: cannot read: {error.strerror or type(error).__name__}") from None
        if len(document) > SECRETS_FILE_BYTES_MAX:
            raise ValueError(f"{path}: larger than {SECRETS_FILE_BYTES_MAX} bytes")
        return secrets_from_json(document, origin=str(path))
    text = environ.get(SECRETS_ENV, "").strip()
    return secrets_from_json(text.encode(), origin=SECRETS_ENV) if text else None


def _secrets(path: Path | None, environ: Mapping[str, str]) -> dict[str, Secret]:
    found = read_secrets(path, environ)
    if found is None:
        print(f"standins: no callback secrets ({SECRETS_ENV} or --secrets-file): every callback is 404",
              file=sys.stderr)  # fmt: skip
        return {}
    return found


async def _check_database(dsn: str) -> None:
    import asyncpg

    parts = urlsplit(dsn)
    where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"  # never the DSN: it may hold a password
    try:
        connection = await asyncpg.connect(dsn, timeout=PG_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise ValueError(f"cannot reach PostgreSQL at {where}: {type(error).__name__}") from None
    await connection.close()


def _port_taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
