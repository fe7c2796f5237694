"""What several process kinds build the same way: the wall clock, a process's name in leases and
cursors, the address of a section's metrics endpoint, the garbage collector's policy, the callback targets' secrets, the
ledgers' PostgreSQL, and every set's client (one set, or the control set's table).

Must never: read anything but the configuration it is given (and the host's name and pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Final

from compensator.config import Config
from compensator.gc_policy import GcPolicy
from compensator.shell import ProcessError
from compensator.store import open_sets, queue_client
from handlers.signing import Secret, secrets_from_json
from ledger import pg
from queues import ClientError, QueueClient, QueueError
from queues.sets.client import SetsClient
from queues.sets.table import TableError

log = logging.getLogger("compensator.sets")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def process_name() -> str:
    """host:pid, a worker's, a projector's or a publisher's name unless the command line gives one."""
    return f"{socket.gethostname()}:{os.getpid()}"


def gc_policy(config: Config) -> GcPolicy:
    """`[runtime]`: how the process's garbage collector runs once it started (compensator/gc_policy.py)."""
    return GcPolicy(freeze=config.runtime.gc_freeze, gen0_threshold=config.runtime.gc_gen0_threshold)


def metrics_address(host: str, port: int) -> tuple[str, int] | None:
    """A section's `metrics_host` and `metrics_port` as the shell serves them; port 0: none."""
    return (host, port) if port else None


CALLBACK_SECRETS_ENV: Final = "COMPENSATOR_CALLBACK_SECRETS"
SECRETS_FILE_BYTES_MAX: Final = 1024 * 1024


def callback_secrets(path: Path | None, environ: Mapping[str, str]) -> dict[str, Secret] | None:
    """The callback targets' secrets: a JSON file ``{"<target>": "<secret>"}`` if given, else
    ``$COMPENSATOR_CALLBACK_SECRETS``; None when neither is set. The stand-ins and the workers read
    them the same way, never from a command line (``ps`` shows it), and never print one."""
    if path is not None:
        try:
            with path.open("rb") as handle:
                document = handle.read(SECRETS_FILE_BYTES_MAX + 1)
        except OSError as error:
            raise ValueError(f"{path}: cannot read: {error.strerror or type(error).__name__}") from None
        if len(document) > SECRETS_FILE_BYTES_MAX:
            raise ValueError(f"{path}: larger than {SECRETS_FILE_BYTES_MAX} bytes")
        return secrets_from_json(document, origin=str(path))
    text = environ.get(CALLBACK_SECRETS_ENV, "").strip()
    return secrets_from_json(text.encode(), origin=CALLBACK_SECRETS_ENV) if text else None


@contextlib.asynccontextmanager
async def ledger_database(pg_data: Path, dsn: str | None = None) -> AsyncIterator[str]:
    """`dsn`, else $COMPENSATOR_PG_DSN, else the embedded server in `pg_data` for the block (started
    and stopped off the loop: pg_ctl waits; a stop signal meanwhile is acted on once it started, so
    it is never left half-started). A stop that fails with the server still running is the
    process's one line and exit 1 (or, when the block failed, a line on stderr before the block's)."""
    if dsn:
        yield dsn
        return
    stack = contextlib.ExitStack()
    try:
        found = await asyncio.to_thread(stack.enter_context, pg.database(pg_data))
    except (OSError, subprocess.SubprocessError) as error:
        raise ProcessError(f"cannot start an embedded PostgreSQL in {pg_data}: {type(error).__name__}") from None
    try:
        yield found
    except BaseException:
        await asyncio.to_thread(pg.stop_said, stack.close, work_failed=True)
        raise
    if (left_running := await asyncio.to_thread(pg.stop_said, stack.close, work_failed=False)) is not None:
        raise ProcessError(left_running)


def table_rereader(found: SetsClient) -> Callable[[], Awaitable[Mapping[int, QueueClient]]]:
    """A worker's or the projector's `discover`: the table re-read (the cached one when the control
    set is down)."""

    async def discover() -> Mapping[int, QueueClient]:
        await found.refresh()
        return found.clients

    return discover


SETS_WAIT_S = 60.0
"""How long a worker or projector of several sets waits for the control set's table at start (it
may start before its store, as `compensator run` starts it) before it exits with one line."""


async def every_set(config: Config) -> tuple[dict[int, QueueClient], SetsClient | None]:
    """Every set's client: one set (and no facade), or the sets of the control set's table as it is
    now with the facade that re-reads it (a set added later is found at the next re-read:
    `table_rereader`). The caller closes the facade (every set's client and the control set's), or
    the one set's client."""
    deadline = asyncio.get_running_loop().time() + SETS_WAIT_S
    while True:
        try:
            if not config.store.control_addresses:
                return {config.store.set_id: queue_client(config)}, None
            found = await open_sets(config)
            return dict(found.clients), found
        except (ClientError, QueueError, TableError) as error:
            if asyncio.get_running_loop().time() > deadline:
                raise ProcessError(f"cannot read the set table from the control set"
                                   f" ({','.join(config.store.control_addresses)}): {error}") from None  # fmt: skip
            log.warning("cannot read the set table yet: %s", error)
            await asyncio.sleep(1.0)
