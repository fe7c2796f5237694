"""The process shell: what every long-running process of the service does the same way around its
own work, written once. The composition root (compensator/wiring/) builds a process's parts from
the configuration; this module runs them:

- logging: one format on stderr at the process's level (or into a file, with errors also on
  stderr: the local launcher, whose terminal is a person's), chatty libraries held down;
- uvloop as the event loop;
- SIGTERM and SIGINT set one stop event that the process's work watches, and the work decides how
  to end (a worker drains, a projector commits its batch, a node stops its log). Before the loop
  runs, SIGTERM unwinds like Ctrl-C, so a launcher that stops a process while it starts leaves
  nothing half-started behind;
- the Prometheus endpoint on the process's metrics address, when it has one (compensator/
  metrics_endpoint.py: ``GET /metrics`` on the loop), up while the work runs;
- the garbage collector's policy (compensator/gc_policy.py) applied once the process is built,
  before its work runs, and its collections' pauses among the process's metrics;
- an expected failure (a broker or database that does not answer, a gap in the log, unreadable
  secrets: the types the root names) ends the process with one line and exit status 1
  (`ProcessError`, which the command line prints), never a traceback.

The API is the one process kind this does not run: uvicorn starts its worker processes and owns
their loop and signals (compensator/commands/api.py configures it from the same configuration).

The logging, the loop and the signals are raft_store/process.py's, the one place that sets them
up, shared with the log's own tool and the queue's sidecars, which must not import this root.

Must never: know what a process does, or read the configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from compensator.gc_policy import GcPauses, GcPolicy
from compensator.gc_policy import apply as apply_gc_policy
from compensator.metrics_endpoint import MetricsServer
from raft_store.process import configure_logging, install_uvloop, stop_on_signals


class ProcessError(ValueError):
    """An expected failure of a process: one line, exit status 1."""


def _never_busy() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Running:
    """A process as the root built it: its work, run until `stop` is set (its exit status), and
    what its metrics endpoint serves (`busy`: a scrape waits while it is true)."""

    run: Callable[[asyncio.Event], Awaitable[int]]
    registry: CollectorRegistry | None = None
    busy: Callable[[], bool] = _never_busy


@dataclass(frozen=True, slots=True, kw_only=True)
class Shell:
    """How one process runs, as the root decides it from the configuration."""

    name: str
    """The process kind, as the command line names it (`worker`): in its one-line failures."""
    log_level: str = "info"
    log_file: Path | None = None
    """Log there instead of stderr; errors are still printed."""
    quiet: Mapping[str, int] = field(default_factory=dict)
    """Loggers held at a higher level than the process's (a client library's retries)."""
    metrics: tuple[str, int] | None = None
    """host, port of the Prometheus endpoint; None: no endpoint."""
    expected: tuple[type[BaseException], ...] = ()
    """Failures that end the process with their first line, not a traceback."""
    gc: GcPolicy | None = None
    """Applied once the process is built; None: CPython's defaults (a test's loop, the launcher)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Until the loop takes the signals over, SIGTERM unwinds like Ctrl-C (the command line
    answers it with 130)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.asynccontextmanager
async def metrics_endpoint(
    address: tuple[str, int] | None, registry: CollectorRegistry | None, busy: Callable[[], bool] = _never_busy
) -> AsyncIterator[None]:
    """The Prometheus endpoint for the block, when the process has an address and a registry."""
    if address is None or registry is None:
        yield
        return
    server = MetricsServer(registry, *address, busy=busy)
    try:
        await server.start()
    except OSError as error:
        raise ProcessError(f"metrics on {address[0]}:{address[1]}: {error.strerror or error}") from None
    try:
        yield
    finally:
        await server.stop()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for each in group.exceptions:
        found += _leaves(each) if isinstance(each, BaseExceptionGroup) else [each]
    return found


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


async def serve(shell: Shell, build: Callable[[], AbstractAsyncContextManager[Running]]) -> int:
    """Build the process, serve its metrics, run its work until the stop signal; on the running loop
    (a test's, or `run`'s)."""
    with stop_on_signals(asyncio.Event()) as stop:
        try:
            async with build() as running, contextlib.AsyncExitStack() as started:
                if shell.gc is not None:
                    pauses = started.enter_context(GcPauses())
                    if running.registry is not None:
                        running.registry.register(pauses)
                        started.callback(running.registry.unregister, pauses)
                    apply_gc_policy(shell.gc)
                await started.enter_async_context(metrics_endpoint(shell.metrics, running.registry, running.busy))
                return await running.run(stop)
        except ProcessError:
            raise
        except shell.expected as error:
            raise ProcessError(_first_line(error)) from None
        except BaseExceptionGroup as group:
            # A task group (the worker's lanes, ...) wraps what its tasks raised: an expected
            # failure inside one still ends the process with its one line, not a group traceback.
            expected: tuple[type[BaseException], ...] = (ProcessError, *shell.expected)
            if any(not isinstance(leaf, expected) for leaf in _leaves(group)):
                raise
            first = _leaves(group)[0]
            raise ProcessError(_first_line(first)) from None


def run(shell: Shell, build: Callable[[], AbstractAsyncContextManager[Running]]) -> int:
    """The whole life of one process: logging, uvloop, signals, `serve`; its exit status."""
    configure_logging(shell.log_level, log_file=shell.log_file, quiet=shell.quiet)
    with _sigterm_interrupts():
        install_uvloop()
        return asyncio.run(serve(shell, build))
