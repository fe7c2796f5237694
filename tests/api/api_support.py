"""What the API tests share: a real store and the real app, in this process (fixtures in conftest.py).

The store is one Raft node running the queue machine on a thread of its own
(raft_store/testing/inprocess.py): every answer the API gives is one it gives on three, except
for the fault tests, which run on processes (test_api_processes.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.tokens import new_token, token_hash
from compensator import config as configuration
from compensator.wiring.api import api_app
from queues import QueueClient, RaftClient, Role
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread

ROLES = tuple(Role)
CALLBACK_TARGET = "merchant-demo"
"""The callback target the tests' API has registered (handlers.callback.targets): a callback naming
another is refused at intake."""


def queue_store(data_dir: Path) -> StoreThread:
    return StoreThread(data_dir, machine_factory)


def settings(store: StoreThread, **overrides: str) -> configuration.Config:
    """The service's configuration for this store, with `section__field` overrides as the
    environment would give them (e.g. ``quota__rate_per_s="5"``)."""
    environ = {**store.service_settings(), "COMPENSATOR_STORE__DEADLINE_S": "3",
               "COMPENSATOR_AUTH__REFRESH_INTERVAL_S": "0.2",
               "COMPENSATOR_HANDLERS__CALLBACK": json.dumps({"targets": [
                   {"name": CALLBACK_TARGET, "url": f"http://127.0.0.1:9/callbacks/{CALLBACK_TARGET}"}]})}  # fmt: skip
    environ.update({f"COMPENSATOR_{name.upper()}": value for name, value in overrides.items()})
    return configuration.load(None, environ)


async def put_tokens(store: StoreThread, roles: tuple[Role, ...] = ROLES, prefix: str = "",
                     at: str | None = None) -> dict[Role, str]:  # fmt: skip
    """A live token per role, named after it (``producer``, ``operator``, ...), in `store` or at the
    address `at` (the control set's, where the API reads tokens with several sets: same secret)."""
    host, _, port = (at or "").partition(":")
    queue = QueueClient(RaftClient([(host, int(port)) if at else store.address], auth=store.auth, deadline_s=10))
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
    # With several sets the API reads tokens from the control set (compensator/store.py access_client).
    tokens = await put_tokens(store, at=overrides.get("store__control_addresses"))
    spans = InMemorySpanExporter()
    app = api_app(settings(store, **overrides), span_exporter=spans)
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
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


async def dead_letters(api: Api, *bodies: dict[str, Any], error_class: str = "insufficient_funds",
                       error_text: str = "HTTP 402 from payment: balance too low") -> list[str]:  # fmt: skip
    """Requests submitted through the API, then dead-lettered by a worker's permanent failure (the
    other ready requests it leases on the way are released untouched)."""
    ids = []
    for index, body in enumerate(bodies):
        answer = await api.client.post("/v1/requests", json=body,
                                       headers={**api.auth(Role.PRODUCER), "Idempotency-Key": f"{body['ref_key']}-{index}"})  # fmt: skip
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    ours = {int(request_id.split("-")[1]) for request_id in ids}
    for grant in (await api.queue.lease("w", count_max=1000, lease_ms=30_000)).grants:
        if grant.message_id in ours:
            await api.queue.fail(grant.message_id, grant.token, error_class, error_text, permanent=True)
        else:
            await api.queue.release(grant.message_id, grant.token)
    return ids
