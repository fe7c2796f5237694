"""The stand-ins as the handler tests use them: served by uvicorn in a thread with its own event
loop (so a stand-in that withholds an answer never blocks the test's loop), on free loopback ports,
over a fresh PostgreSQL database per test; and helpers to flip their faults, read their counters
and query their ledgers.

Imported by name from the tests (a module named conftest is not unique across the suite).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg
import httpx

from handlers.contract import Attempt
from handlers.gateway import GatewaySettings
from handlers.lease_time import LeaseTime
from handlers.settings import CallbackSettings, CallbackTargetSettings, DownstreamSettings, HandlersSettings
from handlers.signing import Secret
from handlers.standins.server import StandinsSettings, serve
from ledger import pg
from ledger.kinds import CallbackPayload, Kind, ListUpdatePayload, Payload, TransferPayload
from raft_store.testing.processes import free_ports

START_TIMEOUT_S: Final = 20.0
SECRETS: Final = {
    "merchant-a": Secret(b"whsec-test-merchant-a-0123456789"),
    "merchant-b": Secret(b"whsec-test-merchant-b-9876543210"),
}
FAST: Final = GatewaySettings(
    connect_timeout_s=0.5, write_timeout_s=0.5, read_timeout_s=0.5, pool_timeout_s=0.2, attempt_timeout_s=3.0,
    connect_tries_max=3, connect_backoff_min_s=0.01, connect_backoff_max_s=0.05,
)  # fmt: skip
"""Short timeouts, so a withheld answer costs a test half a second; long enough for a busy machine."""
PATIENT: Final = GatewaySettings(read_timeout_s=10.0, pool_timeout_s=10.0, attempt_timeout_s=20.0)
"""For tests of concurrency, where a short timeout on a busy machine would be a flaky failure."""
WITHHOLD_MS: Final = 1000
"""Longer than FAST's read timeout: the answer comes after the client gave up."""


@dataclass(frozen=True, slots=True)
class Standins:
    urls: Mapping[str, str]
    dsn: str

    async def faults(self, service: str, **settings: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.urls[service]) as client:
            response = await client.put("/_faults", json=settings)
        assert response.status_code == 200, response.text
        document: dict[str, Any] = response.json()
        return document

    async def stats(self, service: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.urls[service]) as client:
            response = await client.get("/_stats")
        assert response.status_code == 200, response.text
        document: dict[str, Any] = response.json()
        return document

    async def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        connection = await asyncpg.connect(self.dsn)
        try:
            return [dict(row) for row in await connection.fetch(query, *args)]
        finally:
            await connection.close()


def fresh_database(server: pg.EmbeddedPostgres, name: str) -> str:
    """A new, empty database on `server`: once per session (CREATE DATABASE costs 0.2-0.4 s here)."""

    async def create() -> None:
        connection = await asyncpg.connect(server.dsn)
        try:
            await connection.execute(f"CREATE DATABASE {name}")
        finally:
            await connection.close()

    asyncio.run(create())
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


def emptied(dsn: str) -> str:
    """The database with every table gone (the stand-ins create theirs when they start): what a
    test starts from, in about 30 ms."""

    async def empty() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute("DROP SCHEMA IF EXISTS reconcile CASCADE; DROP SCHEMA public CASCADE;"
                                     " CREATE SCHEMA public")  # fmt: skip
        finally:
            await connection.close()

    asyncio.run(empty())
    return dsn


@contextmanager
def running_standins(dsn: str, *, seed: int | None = 7, **modes: bool) -> Iterator[Standins]:
    """`modes`: StandinsSettings' payment_dedup, payment_expiry, callback_dedup."""
    # Drawn together (each socket held until all three are bound): three separate draws may return
    # one port twice, and the stand-ins then refuse to start.
    payment, red_packet, callback = free_ports(3)
    settings = StandinsSettings(payment_port=payment, red_packet_port=red_packet, callback_port=callback,
                                seed=seed, **modes)  # fmt: skip
    started = threading.Event()
    failure: list[BaseException] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve(settings, dsn=dsn, secrets=SECRETS, stop=stop, on_started=started.set))
        except BaseException as error:  # reported to the test thread
            failure.append(error)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="standins", daemon=True)
    thread.start()
    while not started.wait(0.05):
        assert thread.is_alive(), f"the stand-ins did not start: {failure!r}"
    try:
        yield Standins(urls=settings.urls(), dsn=dsn)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(START_TIMEOUT_S)
    assert not failure, failure


@dataclass
class Recorder:
    """A minimal HTTP/1.1 server on loopback that answers every request the same way and records
    each request's head: for what the stand-ins cannot show (redirects, headers received, big bodies)."""

    url: str = ""
    heads: list[dict[str, str]] = field(default_factory=list)


@asynccontextmanager
async def recording_server(status: int, *, headers: Mapping[str, str] | None = None, body: bytes = b"") -> AsyncIterator[Recorder]:
    recorder = Recorder()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())

    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        fields = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in head[1:] if ":" in line}
        await reader.readexactly(int(fields.get("content-length", "0")))
        recorder.heads.append({"request-line": head[0], **fields})
        writer.write(f"HTTP/1.1 {status} X\r\n{extra}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve_one, "127.0.0.1", 0)
    recorder.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield recorder
    finally:
        server.close()
        await server.wait_closed()


def handler_settings(standins: Standins, *, gateway: GatewaySettings = FAST, **payment: Any) -> HandlersSettings:
    """Handlers pointed at the stand-ins, with the short timeouts; `payment`: the payment system's
    guarantee and its bounds (DownstreamSettings' fields)."""
    callback = standins.urls["callback"]
    return HandlersSettings(
        payment=DownstreamSettings(base_url=standins.urls["payment"], gateway=gateway, **payment),
        red_packet=DownstreamSettings(base_url=standins.urls["red_packet"], gateway=gateway),
        callback=CallbackSettings(gateway=gateway, targets=tuple(
            CallbackTargetSettings(name=name, url=f"{callback}/callbacks/{name}") for name in SECRETS)),
    )  # fmt: skip


def attempt_of(
    payload: Payload, *, number: int = 1, previous: str | None = None, ref_key: str = "grant-1", key: str = "k-1",
    in_doubt_ms: int | None = None, budget_attempt: int | None = None, lease: LeaseTime | None = None,
) -> Attempt:
    kind = {TransferPayload: Kind.TRANSFER, ListUpdatePayload: Kind.LIST_UPDATE, CallbackPayload: Kind.CALLBACK}
    return Attempt(message_id=1, kind=kind[type(payload)], ref_key=ref_key, idempotency_key=key, payload=payload,
                   attempt=number, previous_error_class=previous, in_doubt_ms=in_doubt_ms,
                   budget_attempt=number if budget_attempt is None else budget_attempt, lease=lease)  # fmt: skip
