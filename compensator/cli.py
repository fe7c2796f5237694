"""The ``compensator`` command: one argparse parser, one subcommand per capability.

Owns: argument parsing and the exit-code contract. A bad argument prints one line
(``compensator: error: ...``) and exits 2; a failed command prints one line and exits 1. And what
reaches the terminal: standard output and error go through `compensator.terminal.visible` for
the whole command, so a control or format character from anyone's input is shown escaped.

To add a subcommand, write ``register(subparsers)`` in a command module of this package (see
compensator/commands/worker.py): it owns the flags, turns them into overrides of the configuration,
and hands the configuration to the composition root (compensator/wiring/), whose process the
process shell runs (compensator/shell.py). Add it to ``_REGISTRARS``, and its expected-failure
error types to ``_EXPECTED_ERRORS`` unless they are ValueErrors. Registrars must keep heavy imports
(Spark, database drivers, the web framework) inside their handlers so ``compensator --help`` stays
instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from compensator.commands import (
    api,
    audit,
    config,
    demo,
    kafka,
    node,
    operator,
    outbox_relay,
    project,
    reconcile,
    run,
    sets,
    standins,
    status,
    token,
    user,
    worker,
)
from compensator.config import ConfigError
from compensator.terminal import VisibleStream
from spark_reconcile.command import ReconcileError

Registrar = Callable[["argparse._SubParsersAction[Any]"], None]
_REGISTRARS: tuple[Registrar, ...] = (
    run.register,
    demo.register,
    api.register,
    node.register,
    worker.register,
    token.register,
    user.register,
    project.register,
    reconcile.register,
    outbox_relay.register,
    kafka.register,
    status.register,
    sets.register,
    config.register,
    operator.register,
    standins.register,
    audit.register,
)
_EXPECTED_ERRORS: tuple[type[Exception], ...] = (ValueError, ConfigError, ReconcileError)
"""ValueError is a parameter check refusing a value, in any capability; each capability's own
error (TokenCommandError, NodeCommandError, StandinsError) is one, and so is the process shell's
ProcessError (an expected failure of a long-running process)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.splitlines()[0]}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="compensator", description="Reliable compensation and retry service.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for register in _REGISTRARS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = VisibleStream(sys.stdout), VisibleStream(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = arguments.handler
    try:
        return handler(arguments)
    except _EXPECTED_ERRORS as error:
        lines = str(error).splitlines() or [type(error).__name__]
        if isinstance(error, ConfigError):  # one line per problem, each naming its file or variable and field
            for line in lines:
                print(f"compensator {arguments.command}: {line}", file=sys.stderr)
            return 1
        print(f"compensator {arguments.command}: error: {lines[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"compensator {arguments.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
