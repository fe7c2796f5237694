"""``compensator standins`` as the composition root runs it: the stand-ins' own command
(handlers/standins/command.py) plus this configuration's telemetry.

Why here: the stand-ins are the other side of the wire and import nothing of ours, so they trace
to the process's global tracer provider; only the composition root reads the configuration that
says where spans go. With the exporter off (the default) nothing is installed and their spans cost
nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from compensator.api_server import add_config_argument, load
from handlers.standins import command as standins_command


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = standins_command.register(subparsers)
    add_config_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    if config.telemetry.exporter != "none":
        from opentelemetry import trace

        from compensator.telemetry import tracer_provider

        trace.set_tracer_provider(tracer_provider(config.telemetry, process="standins"))
    return standins_command.run(args)
