"""Which configuration a command reads: the TOML file its ``--config`` names, else the one
``$COMPENSATOR_CONFIG`` names, else none (every field's default), each overlaid with the
``COMPENSATOR_<SECTION>__<FIELD>`` variables and validated whole (compensator/config.py).

Every command that reads the configuration takes it this way, so a deployment sets it once for
all of them (compose.yaml sets variables; a file works the same).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from compensator import config as configuration


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, help=f"TOML configuration file (default ${configuration.CONFIG_PATH_ENV}, else defaults)"
    )


def config_path(args: argparse.Namespace) -> Path | None:
    named = os.environ.get(configuration.CONFIG_PATH_ENV, "").strip()
    path: Path | None = args.config or (Path(named) if named else None)
    return path


def load_for(args: argparse.Namespace) -> configuration.Config:
    """The configuration in force for a command's arguments (raises ConfigError: one line per problem)."""
    return configuration.load(config_path(args))
