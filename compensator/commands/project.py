"""``compensator project``: write the compensation ledger (PostgreSQL) from every set's event log.

One process projects every set (``store.set_id``'s, or with ``store.control_addresses`` every set
of the control set's table), one transaction per round. Run more for standbys: each set's lock is
held by one process, the others take the set over when it stops or dies (docs/ledger.md). The database is ``$COMPENSATOR_PG_DSN``, else an embedded server in
``projector.pg_data`` (``--pg-data``), started if it is not running; the schema is migrated first.
SIGTERM or Ctrl-C stops it after the round being written commits. ``--rebuild`` empties one set's
(``--set``, default ``store.set_id``) ledger and writes it again from the log's first event, when the store still has it.

The process is built by the composition root (compensator/wiring/projector.py) and run by the
process shell (compensator/shell.py); this module owns the flags.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from compensator.config_file import add_config_argument, load_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    project = subparsers.add_parser("project", help="write the compensation ledger from the store's event log")
    add_config_argument(project)
    project.add_argument("--pg-data", type=Path, help="embedded PostgreSQL data folder (overrides projector.pg_data)")
    project.add_argument("--id", default="", help="this projector's name in the cursor row (default host:pid)")
    project.add_argument("--rebuild", action="store_true",
                         help="empty one set's ledger and project it again from the first event (see docs/ledger.md)")  # fmt: skip
    project.add_argument("--set", type=int, default=None, dest="rebuild_set", metavar="ID",
                         help="the set --rebuild empties (default store.set_id)")  # fmt: skip
    project.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from compensator import shell
    from compensator.wiring import projector

    config = load_for(args)
    build = functools.partial(projector.process, config, pg_data=args.pg_data, name=args.id, rebuild_ledger=args.rebuild,
                              rebuild_set=args.rebuild_set)  # fmt: skip
    return shell.run(projector.shell(config), build)
