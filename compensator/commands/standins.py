"""``compensator standins``: the three stand-ins in one process, for local runs and manual tests.

    compensator standins [--config FILE] [--host 127.0.0.1] [--payment-port 7201] [--red-packet-port 7202]
                         [--callback-port 7203] [--pg-dsn DSN | --pg-data DIR]
                         [--secrets-file FILE] [--seed N] [--log-level warning]
                         [--payment-dedup on|off] [--payment-expiry enforce|ignore] [--callback-dedup on|off]

Every flag overrides the `[standins]` setting it names (docs/configuration.md). The payment
system's modes (handlers/standins/payment.py): ``--payment-dedup off``, every accepted POST is a
new payment (a transfer id paid twice is two rows); ``--payment-expiry enforce``, a POST whose
``expires_at`` has passed is refused and writes nothing. ``--callback-dedup off``: a merchant that
handles every callback delivery as new. The red-packet service has no switch: a list update
carries its version, which it applies only forward, whatever the key.

The database: ``--pg-dsn``, else ``COMPENSATOR_PG_DSN``, else an embedded PostgreSQL kept in
``--pg-data``. The callback targets' secrets: a JSON object ``{"<target>": "<secret>"}`` from
``--secrets-file``, else from ``COMPENSATOR_CALLBACK_SECRETS``; never from the command line (``ps``
shows it), never printed: only target names are.

The process is built by the composition root (compensator/wiring/standins.py) and run by the
process shell (compensator/shell.py); this module owns the flags.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from compensator.config_file import add_config_argument, config_path

FLAGS: tuple[tuple[str, str], ...] = (
    ("host", "host"), ("payment_port", "payment_port"), ("red_packet_port", "red_packet_port"),
    ("callback_port", "callback_port"), ("pg_data", "pg_data"), ("secrets_file", "secrets_file"), ("seed", "seed"),
    ("exposed", "exposed"), ("payment_expiry", "payment_expiry"), ("log_level", "log_level"),
)  # fmt: skip
"""argparse's name, and the `standins` field the flag overrides."""
SWITCHES: tuple[tuple[str, str], ...] = (("payment_dedup", "payment_dedup"), ("callback_dedup", "callback_dedup"))
"""on|off flags, and the boolean field each sets."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    standins = subparsers.add_parser(
        "standins", help="serve stand-ins of the payment system, the red-packet service and a callback receiver"
    )
    add_config_argument(standins)
    standins.add_argument("--host", help="a loopback address (standins.host, default 127.0.0.1)")
    standins.add_argument("--payment-port", type=int, help="standins.payment_port (default 7201)")
    standins.add_argument("--red-packet-port", type=int, help="standins.red_packet_port (default 7202)")
    standins.add_argument("--callback-port", type=int, help="standins.callback_port (default 7203)")
    standins.add_argument("--pg-dsn", help="PostgreSQL DSN (default $COMPENSATOR_PG_DSN, else an embedded server)")
    standins.add_argument("--pg-data", type=Path, help="the embedded server's data folder (standins.pg_data)")
    standins.add_argument("--secrets-file", type=Path,
                          help='JSON {"target": "secret"} for the callback receiver (standins.secrets_file,'
                               " default $COMPENSATOR_CALLBACK_SECRETS)")  # fmt: skip
    standins.add_argument("--seed", type=int, help="seed of the fault generators (standins.seed)")
    standins.add_argument("--exposed", action="store_true", default=None,
                          help="allow a non-loopback --host (a demo network of its own: anyone there can flip faults)")  # fmt: skip
    standins.add_argument("--payment-dedup", choices=("on", "off"),
                          help="on: one payment per transfer id (default); off: every accepted POST is a new payment")  # fmt: skip
    standins.add_argument("--payment-expiry", choices=("enforce", "ignore"),
                          help="enforce: refuse a POST whose expires_at has passed (it writes nothing); ignore (default)")  # fmt: skip
    standins.add_argument("--callback-dedup", choices=("on", "off"),
                          help="on: a repeated Idempotency-Key is answered as a repeat (default); off: every delivery is new")  # fmt: skip
    standins.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="standins.log_level")
    standins.set_defaults(handler=run)


def flags(args: argparse.Namespace) -> dict[tuple[str, str], tuple[Any, str]]:
    given: dict[tuple[str, str], tuple[Any, str]] = {}
    for name, field in FLAGS:
        value = getattr(args, name)
        if value is not None:
            given[("standins", field)] = (str(value) if isinstance(value, Path) else value, "--" + name.replace("_", "-"))
    for name, field in SWITCHES:
        value = getattr(args, name)
        if value is not None:
            given[("standins", field)] = (value == "on", "--" + name.replace("_", "-"))
    return given


def run(args: argparse.Namespace) -> int:
    from compensator import config as configuration
    from compensator import shell
    from compensator.wiring import standins

    config = configuration.load(config_path(args), flags=flags(args))
    listening = standins.settings(config)  # the usual mistakes: one line before a database starts
    found = standins.secrets(config)
    build = functools.partial(standins.process, config, listening, found, dsn=args.pg_dsn)
    return shell.run(standins.shell(config), build)
