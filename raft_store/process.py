"""What every long-running process of this repository does the same way, written once: its logging,
its event loop, and SIGTERM/SIGINT to one stop event.

It sits at the bottom, in the log's package, because the log's own tool (`raft-store run`) and the
queue's sidecars (`python -m queues.maintenance`, `python -m queues.audit`) must not import the
composition root; the service's process shell (compensator/shell.py) builds on these same three
pieces, so a store node, a worker and an auditor log in one format and stop on the same signals.

Must never: know what a process does, or read configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from raft_store.log_context import GroupTag

LOG_FORMAT: Final = "%(asctime)s %(name)s %(levelname)s %(message)s"
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


def configure_logging(level: str, *, log_file: Path | None = None, quiet: Mapping[str, int] | None = None) -> None:
    """The process's logging, once, for every logger (the root logger's handlers are replaced): one
    format on stderr at `level`, or into `log_file` with errors still on stderr (a launcher whose
    terminal is a person's); `quiet` holds chatty loggers at a higher level."""
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = []
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    to_stderr = logging.StreamHandler(sys.stderr)
    if log_file is not None:
        to_stderr.setLevel(logging.ERROR)
    handlers.append(to_stderr)
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(GroupTag())  # a hosted replica's lines name its set (raft_store/log_context.py)
    logging.basicConfig(level=level.upper(), handlers=handlers, force=True)
    for name, held in (quiet or {}).items():
        logging.getLogger(name).setLevel(held)


def install_uvloop() -> None:
    """uvloop as the event loop of every `asyncio.run` after this; asyncio's own where it is missing."""
    try:
        import uvloop
    except ImportError:  # a platform without it runs on asyncio's own loop
        return
    uvloop.install()


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[asyncio.Event]:
    """SIGINT and SIGTERM set `stop` while the block runs (on the running loop); the work watching
    it decides how to end."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:  # the loop may outlive the block (a test's, an embedding command's)
            loop.remove_signal_handler(sig)
