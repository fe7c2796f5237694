"""The stand-ins process kind (``compensator standins``): stand-ins of the payment system, the
red-packet service and a callback receiver in one process (handlers/standins/), from the
``[standins]`` section, for local runs, demos and manual tests.

The database: a DSN given on the command line, else ``$COMPENSATOR_PG_DSN``, else an embedded
PostgreSQL kept in `standins.pg_data`. The callback targets' secrets: `standins.secrets_file`, else
``$COMPENSATOR_CALLBACK_SECRETS``; never printed, only the targets' names are. The usual mistakes
(a port taken, a database that does not answer, a secrets file that does not parse) are one line,
checked before anything starts.

Why the composition root wires them although they import nothing of ours: only the root reads the
configuration, including where spans go: they trace to the process's global tracer provider,
installed here when an exporter is configured (with the default, none, their spans cost nothing).

Must never: run anything at import, or print a DSN or a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from compensator.config import Config
from compensator.shell import Running, Shell
from compensator.telemetry import tracer_provider
from compensator.wiring.parts import CALLBACK_SECRETS_ENV, callback_secrets, ledger_database
from handlers.signing import Secret, names
from handlers.standins.server import StandinsError, StandinsSettings, check_database, serve, taken_ports


def shell(config: Config) -> Shell:
    return Shell(name="standins", log_level=config.standins.log_level, expected=(StandinsError,))


def settings(config: Config) -> StandinsSettings:
    """What the stand-ins listen on and how they behave, checked (StandinsError: one line)."""
    standins = config.standins
    built = StandinsSettings(
        host=standins.host, payment_port=standins.payment_port, red_packet_port=standins.red_packet_port,
        callback_port=standins.callback_port, seed=None if standins.seed < 0 else standins.seed,
        exposed=standins.exposed, payment_dedup=standins.payment_dedup,
        payment_expiry=standins.payment_expiry == "enforce", callback_dedup=standins.callback_dedup,
    )  # fmt: skip
    problems = built.problems() + taken_ports(built)
    if problems:
        raise StandinsError(problems[0])
    return built


def secrets(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, Secret]:
    path = Path(config.standins.secrets_file) if config.standins.secrets_file else None
    found = callback_secrets(path, os.environ if environ is None else environ)
    if found is None:
        print(f"standins: no callback secrets ({CALLBACK_SECRETS_ENV} or --secrets-file): every callback is 404",
              file=sys.stderr)  # fmt: skip
        return {}
    return found


def _banner(listening: StandinsSettings, secrets_by_target: Mapping[str, Secret]) -> str:
    urls = ", ".join(f"{name} {url}" for name, url in listening.urls().items())
    modes = (f"payment dedup {'on' if listening.payment_dedup else 'off'}, expiry"
             f" {'enforced' if listening.payment_expiry else 'ignored'};"
             f" callback dedup {'on' if listening.callback_dedup else 'off'}")  # fmt: skip
    return f"standins: {urls}; {modes}; callback targets: {', '.join(names(secrets_by_target)) or 'none'}; Ctrl-C stops"


@contextlib.asynccontextmanager
async def process(config: Config, listening: StandinsSettings, secrets_by_target: Mapping[str, Secret], *,
                  dsn: str | None = None) -> AsyncIterator[Running]:  # fmt: skip
    """`compensator standins`: serves the three until stopped (`settings` and `secrets` first: their
    mistakes are one line before a database starts)."""
    if config.telemetry.exporter != "none":
        from opentelemetry import trace

        trace.set_tracer_provider(tracer_provider(config.telemetry, process="standins"))
    async with ledger_database(Path(config.standins.pg_data), dsn) as database:
        await check_database(database)

        async def run(stop: asyncio.Event) -> int:
            await serve(listening, dsn=database, secrets=secrets_by_target, stop=stop,
                        on_started=lambda: print(_banner(listening, secrets_by_target), flush=True),
                        log_level=config.standins.log_level)  # fmt: skip
            return 0

        yield Running(run)
