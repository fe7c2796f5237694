"""What the outbox tests share: a producer's database (a real embedded PostgreSQL), and the real
API served by uvicorn on a loopback port in this process, in front of an in-process store, which a
test can take down and bring back on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import uvicorn

import outbox
from api.tokens import new_token, token_hash
from compensator import config as configuration
from compensator.wiring.api import api_app
from ledger import pg
from queues import EventType, QueueClient, RaftClient, Role
from raft_store.testing.inprocess import StoreThread

PRODUCER = "outbox-producer"


async def empty_database(server: pg.EmbeddedPostgres) -> str:
    """A fresh database without the outbox table: its dsn."""
    name = f"producer_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


async def producer_database(server: pg.EmbeddedPostgres) -> str:
    """A fresh database with the outbox table, as a producer would have it."""
    dsn = await empty_database(server)
    connection = await asyncpg.connect(dsn)
    try:
        await outbox.install(connection)
    finally:
        await connection.close()
    return dsn


@dataclass
class ApiServer:
    """The real API on a fixed port; `down()` takes the port away, `up()` serves it again."""

    store: StoreThread
    port: int = field(default_factory=pg.free_tcp_port)
    overrides: dict[str, str] = field(default_factory=dict)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def up(self) -> None:
        environ = {
            **self.store.service_settings(), "COMPENSATOR_STORE__DEADLINE_S": "3",
            "COMPENSATOR_AUTH__REFRESH_INTERVAL_S": "0.2",
            **{f"COMPENSATOR_{name.upper()}": value for name, value in self.overrides.items()},
        }  # fmt: skip
        app = api_app(configuration.load(None, environ))
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._server, self._task = server, asyncio.create_task(server.serve())
        for _ in range(500):
            if server.started:
                return
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        raise AssertionError("the API did not start")

    async def down(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None


@contextlib.asynccontextmanager
async def producer_token(store: StoreThread) -> AsyncIterator[str]:
    token = new_token()
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        await queue.put_token(PRODUCER, Role.PRODUCER, token_hash(token), actor="tests")
        yield token
    finally:
        await queue.raft.close()


async def enqueued_keys(store: StoreThread) -> list[str]:
    """The idempotency key of every ENQUEUED event in the store's log, in order (duplicates kept)."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    keys: list[str] = []
    try:
        seq = 0
        while True:
            events = (await queue.events_after(seq, limit=1000)).value
            if not events:
                break
            seq = events[-1].seq
            ids = [e.message_id for e in events if e.type is EventType.ENQUEUED]
            for start in range(0, len(ids), 100):
                views = (await queue.get_many(ids[start : start + 100], with_history=False)).value
                keys += [view.idempotency_key for view in views]
        return keys
    finally:
        await queue.raft.close()


def transfer(number: int, **payload: Any) -> outbox.OutboxRequest:
    body = {"transfer_id": f"tr-{number}", "payer": "red-packet-escrow", "payee": f"user-{number}",
            "amount_minor": 100 + number, "currency": "CNY", **payload}  # fmt: skip
    return outbox.OutboxRequest.of(key=f"grant-{number}", kind="transfer", ref_key=f"rp-{number}", payload=body)


async def rows(dsn: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn)
    try:
        return list(await connection.fetch(f"SELECT * FROM {outbox.DEFAULT_TABLE} ORDER BY id"))
    finally:
        await connection.close()
