"""The three stand-ins served together: one uvicorn server each, in one event loop.

Owns: the listening settings (loopback only: these are test doubles with fault switches anyone who
reaches them can flip) and checking them; building the apps and their uvicorn servers; starting all
three or none; stopping them when `stop` is set. Signals are the caller's: the servers install no
handlers, so several can share a process, and a test can run them in a thread.

Must never: listen on a non-loopback address unless told it is a demo network of its own, or configure the process's logging (uvicorn's
default log configuration is turned off; the command line configures logging).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import asyncpg
import uvicorn

from handlers.signing import Secret
from handlers.standins import callback_receiver, payment, red_packet
from handlers.standins.service import ConnectionDropped

PG_CONNECT_TIMEOUT_S: Final = 5.0
GRACEFUL_SHUTDOWN_S: Final = 2
"""A withheld answer is cut after this long on shutdown, not waited for."""
SERVICES: Final = (payment.SERVICE, red_packet.SERVICE, callback_receiver.SERVICE)


class StandinsError(ValueError):
    """The stand-ins cannot run as asked; one line for the operator."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StandinsSettings:
    host: str = "127.0.0.1"
    payment_port: int = 7201
    red_packet_port: int = 7202
    callback_port: int = 7203
    seed: int | None = None
    """Seeds each stand-in's fault generator (PUT /_faults with a seed reseeds one at runtime)."""
    exposed: bool = False
    """Allow a non-loopback address: a demo network of its own (compose's `demo` profile), where
    whoever reaches the stand-ins may flip their faults. Never next to real downstreams."""
    payment_dedup: bool = True
    """The payment system deduplicates on the transfer id (off: every POST is a new payment)."""
    payment_expiry: bool = False
    """The payment system refuses a request whose `expires_at` has passed on its clock."""
    callback_dedup: bool = True
    """The callback receiver answers a repeated key as a repeat (off: every delivery is new)."""

    def ports(self) -> dict[str, int]:
        return {payment.SERVICE: self.payment_port, red_packet.SERVICE: self.red_packet_port,
                callback_receiver.SERVICE: self.callback_port}  # fmt: skip

    def urls(self) -> dict[str, str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return {name: f"http://{host}:{port}" for name, port in self.ports().items()}

    def problems(self) -> list[str]:
        found: list[str] = []
        try:
            if not ipaddress.ip_address(self.host).is_loopback and not self.exposed:
                found.append(f"host {self.host} is not a loopback address (--exposed allows it on a demo network)")
        except ValueError:
            found.append(f"host {self.host!r} is not an IP address")
        for name, port in self.ports().items():
            if not 0 < port < 65536:
                found.append(f"{name} port {port} is not in 1..65535")
        if len(set(self.ports().values())) != len(self.ports()):
            found.append("the three ports must differ")
        return found


def taken_ports(settings: StandinsSettings) -> list[str]:
    """The stand-ins' ports something else already listens on, each named (checked before the
    database starts, so the usual mistake is one line, not a server's traceback)."""
    return [f"port {port} ({name}) is taken on {settings.host}" for name, port in settings.ports().items()
            if _port_taken(settings.host, port)]  # fmt: skip


def _port_taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


async def check_database(dsn: str) -> None:
    """StandinsError naming host:port (never the DSN: it may hold a password) when PostgreSQL does
    not answer."""
    parts = urlsplit(dsn)
    where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    try:
        connection = await asyncpg.connect(dsn, timeout=PG_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise StandinsError(f"cannot reach PostgreSQL at {where}: {type(error).__name__}") from None
    await connection.close()


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to whoever runs it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _QuietDrops(logging.Filter):
    """uvicorn logs every exception of an app; a dropped connection is a fault we asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionDropped))


_QUIET_DROPS: Final = _QuietDrops()


def build_servers(
    settings: StandinsSettings, *, dsn: str, secrets: Mapping[str, Secret], log_level: str = "warning"
) -> dict[str, uvicorn.Server]:
    seed = settings.seed
    apps = {
        payment.SERVICE: payment.create_app(dsn=dsn, seed=seed, modes=payment.PaymentModes(
            dedup=settings.payment_dedup, enforce_expiry=settings.payment_expiry)),
        red_packet.SERVICE: red_packet.create_app(dsn=dsn, seed=seed),
        callback_receiver.SERVICE: callback_receiver.create_app(dsn=dsn, secrets=secrets, seed=seed,
                                                                dedup=settings.callback_dedup),
    }
    ports = settings.ports()
    return {
        name: _Server(uvicorn.Config(
            app, host=settings.host, port=ports[name], http="httptools", lifespan="on", log_config=None,
            log_level=log_level, access_log=False, server_header=False, proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ))
        for name, app in apps.items()
    }  # fmt: skip


async def _serving(name: str, server: uvicorn.Server) -> None:
    """uvicorn exits the process (SystemExit) when it cannot start; here that is an error value."""
    try:
        await server.serve()
    except SystemExit:
        raise StandinsError(f"the {name} stand-in did not start (its error is logged above)") from None


async def serve(
    settings: StandinsSettings, *, dsn: str, secrets: Mapping[str, Secret], stop: asyncio.Event,
    on_started: Callable[[], None] = lambda: None, log_level: str = "warning",
) -> None:  # fmt: skip
    """Serve until `stop` is set; `on_started` runs once all three accept connections. Raises
    StandinsError if one cannot start (the others are stopped first)."""
    problems = settings.problems()
    if problems:
        raise StandinsError("; ".join(problems))
    servers = build_servers(settings, dsn=dsn, secrets=secrets, log_level=log_level)
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
    tasks = [asyncio.create_task(_serving(name, server), name=f"standin-{name}") for name, server in servers.items()]
    stopping = asyncio.create_task(stop.wait())
    try:
        while not all(server.started for server in servers.values()):
            if any(task.done() for task in tasks):
                break
            await asyncio.sleep(0.01)
        else:
            on_started()
            await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers.values():
            server.should_exit = True
        results = await asyncio.gather(*tasks, return_exceptions=True)
        stopping.cancel()
        logging.getLogger("uvicorn.error").removeFilter(_QUIET_DROPS)
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise failures[0]
