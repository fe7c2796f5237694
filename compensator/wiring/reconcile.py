"""The nightly reconciliation (``compensator reconcile``, ``compensator seed-ledgers``): the job's
options (spark_reconcile/command.py) with what the service's configuration knows filled in.

The job itself runs without this package too (spark-submit: spark_reconcile/submit.py), so it
takes every option on its command line; run as ``compensator reconcile``, the options it is not
given come from the one configuration: the ledger it reconciles is the one the projector writes
(`projector.pg_data`), unless ``--pg-data`` or ``$COMPENSATOR_PG_DATA`` names another (or
``$COMPENSATOR_PG_DSN`` a server).

It is a batch job, not a long-running process: the process shell does not run it (Spark brings
its own logging, it serves no metrics, and Ctrl-C ends it like any command: exit status 130).

Must never: run anything at import, or import Spark (the job does, when it runs).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from compensator.config import Config
from spark_reconcile.command import PG_DATA_ENV


def options(args: argparse.Namespace, config: Config) -> argparse.Namespace:
    """The job's arguments, the embedded ledger's folder defaulting to the projector's."""
    if args.pg_data is None and not os.environ.get(PG_DATA_ENV):
        args.pg_data = Path(config.projector.pg_data)
    return args
