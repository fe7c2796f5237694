"""``compensator worker``: one compensation worker (run as many as you like, on any machine).

SIGTERM or Ctrl-C drains it: no more leases, running attempts get `worker.drain_grace_s` to
finish, the rest are handed back at once. With `worker.maintenance` it also runs the queue's
maintenance driver. Before it leases it checks the retry policies in the store against what each
downstream is declared to guarantee, and refuses to start on one that would break it.

The process is built by the composition root (compensator/wiring/worker.py) and run by the process
shell (compensator/shell.py); this module owns the flags.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from compensator.config_file import add_config_argument, load_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    worker = subparsers.add_parser("worker", help="run a compensation worker (leases, calls downstream, settles)")
    add_config_argument(worker)
    worker.add_argument("--id", default="", help="worker id in leases and events (default host:pid)")
    worker.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from compensator import shell
    from compensator.wiring import worker

    config = load_for(args)
    return shell.run(worker.shell(config), functools.partial(worker.process, config, name=args.id))
