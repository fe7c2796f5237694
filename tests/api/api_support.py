"""What the API tests share: a real store and the real app, in this process (fixtures in conftest.py).

The store is one Raft node running the queue machine (a real WAL, real fsyncs, the real client
protocol over loopback TCP), in a thread with its own event loop, so both async tests (httpx on
the ASGI app) and synchronous ones (schemathesis) can use it. One node is a full Raft set of one:
every answer the API gives is one it gives on three, except for the fault tests, which run on
processes (test_api_processes.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.tokens import new_token, token_hash
from compensator import config as configuration
from compensator.wiring import api_app
from queues import QueueClient, RaftClient, Role
from queues.replicated import DB_NAME, ReplicatedQueueMachine
from raft_store.node import Node, NodeConfig
from raft_store.testing.processes import free_ports

T = TypeVar("T")
ROLES = tuple(Role)


class StoreThread:
    """A one-node store on its own loop in a daemon thread."""

    def __init__(self, data_dir: Path) -> None:
        (port,) = free_ports(1)
        self.address = ("127.0.0.1", port)
        self._config = NodeConfig(
            node_id=1, data_dir=data_dir, listen=self.address, peers={1: self.address},
            initial_voters=frozenset({1}), tick_ms=10, election_ticks=5,
        )  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.node: Node | None = None

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def start(self) -> None:
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        self.node = Node(self._config, ReplicatedQueueMachine(str(self._config.data_dir / DB_NAME)))
        self.run(self.node.start())
        self.run(self._wait_leader())

    async def _wait_leader(self) -> None:
        client = RaftClient([self.address], attempt_timeout_s=0.5, deadline_s=10)
        try:
            for _ in range(200):
                if (await client.status(self.address)).get("role") == "leader":
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("the store elected no leader")
        finally:
            await client.close()

    def stop(self) -> None:
        if self.node is not None and not self.node.stopped.is_set():
            self.run(self.node.stop())
            self.node.machine.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def addresses(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


def settings(store: StoreThread, **overrides: str) -> configuration.Config:
    """The service's configuration for this store, with `section__field` overrides as the
    environment would give them (e.g. ``quota__rate_per_s="5"``)."""
    environ = {"COMPENSATOR_STORE__ADDRESSES": store.addresses, "COMPENSATOR_STORE__DEADLINE_S": "3",
               "COMPENSATOR_AUTH__REFRESH_INTERVAL_S": "0.2"}  # fmt: skip
    environ.update({f"COMPENSATOR_{name.upper()}": value for name, value in overrides.items()})
    return configuration.load(None, environ)


async def put_tokens(store: StoreThread, roles: tuple[Role, ...] = ROLES, prefix: str = "") -> dict[Role, str]:
    """A live token per role, named after it (``producer``, ``operator``, ...)."""
    queue = QueueClient(RaftClient([store.address], deadline_s=10))
    tokens: dict[Role, str] = {}
    try:
        for role in roles:
            token = new_token()
            await queue.put_token(prefix + role.value, role, token_hash(token), actor="tests")
            tokens[role] = token
    finally:
        await queue.raft.close()
    return tokens


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    tokens: dict[Role, str]
    spans: InMemorySpanExporter
    queue: QueueClient
    """A client of the same store, for the test to look behind the API."""

    def auth(self, role: Role = Role.PRODUCER) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


@asynccontextmanager
async def running_api(store: StoreThread, **overrides: str) -> AsyncIterator[Api]:
    tokens = await put_tokens(store)
    spans = InMemorySpanExporter()
    app = api_app(settings(store, **overrides), span_exporter=spans)
    queue = QueueClient(RaftClient([store.address], deadline_s=10))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            try:
                yield Api(app, client, tokens, spans, queue)
            finally:
                await queue.raft.close()


Body = Callable[..., dict[str, Any]]


def transfer(key_suffix: str = "1", *, amount_minor: int = 888, **extra: Any) -> dict[str, Any]:
    """A valid failed transfer, as the red-packet service would send it."""
    return {
        "kind": "transfer", "ref_key": f"rp-{key_suffix}",
        "payload": {"transfer_id": f"tr-{key_suffix}", "payer": "red-packet-escrow", "payee": "user-42",
                    "amount_minor": amount_minor, "currency": "CNY"},
        **extra,
    }  # fmt: skip
