"""``compensator reconcile`` and ``compensator seed-ledgers``: the nightly reconciliation of the
payment, red-packet and compensation ledgers (docs/reconcile.md), and its demo ledgers.

The job's arguments are its own (spark_reconcile/command.py: spark-submit runs it without this
package); the composition root fills in what the configuration knows (compensator/wiring/
reconcile.py: the projector's ledger is the one reconciled unless another is named).
"""

from __future__ import annotations

import argparse
from typing import Any

from compensator.config_file import add_config_argument, load_for
from spark_reconcile import command as job


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    reconcile = subparsers.add_parser("reconcile", help="reconcile the payment, red-packet and compensation ledgers")
    add_config_argument(reconcile)
    job.add_reconcile_arguments(reconcile)
    reconcile.set_defaults(handler=reconcile_ledgers)
    seed = subparsers.add_parser("seed-ledgers", help="load synthetic ledgers with known breaks (dev, demo)")
    add_config_argument(seed)
    job.add_seed_arguments(seed)
    seed.set_defaults(handler=seed_ledgers)


def reconcile_ledgers(args: argparse.Namespace) -> int:
    from compensator.wiring import reconcile

    return job.run_reconcile(reconcile.options(args, load_for(args)))


def seed_ledgers(args: argparse.Namespace) -> int:
    from compensator.wiring import reconcile

    return job.run_seed(reconcile.options(args, load_for(args)))
