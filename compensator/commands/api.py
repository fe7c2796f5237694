"""``compensator api``: serve the HTTP API with uvicorn (uvloop, httptools), N worker processes.

The configuration is validated here, once, before anything listens; the worker processes then
build their app from the same file and environment (COMPENSATOR_CONFIG, and the command line's
overrides passed on as environment variables), so every process runs the same validated model.

The API is the one process kind the process shell (compensator/shell.py) does not run: uvicorn
starts the worker processes and owns their event loop (uvloop), their signals and their logging
(`api.log_level`); its metrics are served on the API's own port (`GET /metrics`, operator token).
The app itself comes from the composition root (compensator/wiring/api.py).

Must never: start serving on a configuration that did not validate, or without the store's
cluster secret.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any

from compensator import config as configuration
from compensator.config_file import add_config_argument, load_for

FACTORY = "compensator.wiring.api:api_app_from_environment"
"""uvicorn starts worker processes from an import string; this one is fixed, not a choice."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    api = subparsers.add_parser("api", help="serve the HTTP API (uvicorn)")
    add_config_argument(api)
    api.add_argument("--host", help="overrides api.host")
    api.add_argument("--port", type=int, help="overrides api.port")
    api.add_argument("--workers", type=int, help="overrides api.workers")
    api.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    for flag, field in (("host", "HOST"), ("port", "PORT"), ("workers", "WORKERS")):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"{configuration.ENV_PREFIX}API__{field}"] = str(value)
    if args.config is not None:
        os.environ[configuration.CONFIG_PATH_ENV] = str(args.config.resolve())
    config = load_for(args)
    from compensator.store import store_auth

    store_auth(config)  # a missing or too open cluster secret is one line here, not a traceback per worker
    made = None
    if config.api.workers > 1 and not os.environ.get(configuration.METRICS_DIR_ENV):
        made = os.environ[configuration.METRICS_DIR_ENV] = tempfile.mkdtemp(prefix="compensator-metrics-")
    try:
        _run(config)
    finally:
        if made is not None:  # the workers' metric files die with them
            shutil.rmtree(made, ignore_errors=True)
    return 0


def _run(config: configuration.Config) -> None:
    import uvicorn

    uvicorn.run(
        FACTORY, factory=True, host=config.api.host, port=config.api.port, workers=config.api.workers,
        loop="uvloop", http="httptools", log_level=config.api.log_level, access_log=False, server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=10, backlog=4096,
    )  # fmt: skip
