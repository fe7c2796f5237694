"""``compensator outbox-relay``: send one producer's outbox to the compensation API.

    compensator outbox-relay --config producer.toml          # until SIGTERM
    compensator outbox-relay --config producer.toml --once   # what is due now, then exit (cron)

Settings are the ``[outbox]`` section (compensator/config.py); the token comes from
``outbox.token_file`` or ``$COMPENSATOR_OUTBOX_TOKEN``. The process is built by the composition
root (compensator/wiring/outbox.py) and run by the process shell (compensator/shell.py); this
module owns the flags.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from compensator.config_file import add_config_argument, load_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    relay = subparsers.add_parser("outbox-relay", help="send a producer's outbox rows to the compensation API")
    add_config_argument(relay)
    relay.add_argument("--once", action="store_true", help="send what is due now, print the outbox's counts, exit")
    relay.add_argument(
        "--install-table", action="store_true", help="create the outbox table in the producer's database if missing"
    )
    relay.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from compensator import shell
    from compensator.wiring import outbox

    config = load_for(args)
    api = outbox.target(config)  # a missing DSN or token: one line before anything starts
    build = functools.partial(outbox.process, config, api, once=args.once, install=args.install_table)
    return shell.run(outbox.shell(config, once=args.once), build)
