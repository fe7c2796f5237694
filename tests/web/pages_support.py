"""What the review pages' HTTP tests share: the real app on a real store (api_support), a user per
web role logged in through the login form, and dead letters made the way a worker makes them.

Imported by name (tests/web/conftest.py puts tests/api on the path for api_support)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import httpx
from api_support import Api, running_api

from queues import Role
from raft_store.testing.inprocess import StoreThread

WEB_ROLES: Final = (Role.VIEWER, Role.REVIEWER, Role.APPROVER, Role.ADMIN)
PASSWORD: Final = "correct horse battery staple"
_CSRF: Final = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass
class Pages:
    api: Api
    browsers: dict[Role, httpx.AsyncClient]
    """A logged-in client (its session cookie kept) per web role; `anonymous` has none."""
    anonymous: httpx.AsyncClient
    csrf: dict[Role, str]

    async def post(self, role: Role, path: str, data: dict[str, Any] | None = None, **kwargs: Any) -> httpx.Response:
        """A form post as the page sends it: with the session's CSRF token."""
        return await self.browsers[role].post(path, data={"csrf_token": self.csrf[role], **(data or {})}, **kwargs)

    async def get(self, role: Role, path: str, **kwargs: Any) -> httpx.Response:
        return await self.browsers[role].get(path, **kwargs)


async def login(api: Api, name: str) -> tuple[httpx.AsyncClient, str]:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://api")
    answer = await client.post("/review/login", data={"name": name, "password": PASSWORD, "next": "/review/dead-letters"})
    assert answer.status_code == 303, answer.text
    page = await client.get("/review/dead-letters")
    found = _CSRF.search(page.text)
    assert page.status_code == 200 and found, page.text[:500]
    return client, found.group(1)


@asynccontextmanager
async def running_pages(store: StoreThread, **overrides: str) -> AsyncIterator[Pages]:
    async with running_api(store, **overrides) as api:
        web = api.app.state.services.web
        browsers: dict[Role, httpx.AsyncClient] = {}
        csrf: dict[Role, str] = {}
        for role in WEB_ROLES:
            await web.accounts.add(role.value, role, PASSWORD, actor="tests")
            browsers[role], csrf[role] = await login(api, role.value)
        anonymous = httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://api")
        try:
            yield Pages(api, browsers, anonymous, csrf)
        finally:
            for client in (*browsers.values(), anonymous):
                await client.aclose()


def list_update(key: str, amount_minor: int = 100, currency: str = "CNY") -> dict[str, Any]:
    return {"kind": "list_update", "ref_key": f"rp-{key}",
            "payload": {"red_packet_id": f"rp-{key}", "receiver": "user-700042", "version": 1,
                        "amount_minor": amount_minor, "currency": currency}}  # fmt: skip


def transfer(key: str, amount_minor: int = 888, currency: str = "CNY", **payload: Any) -> dict[str, Any]:
    return {"kind": "transfer", "ref_key": f"rp-{key}",
            "payload": {"transfer_id": f"tr-{key}", "payer": "red-packet-escrow", "payee": "user-4200042",
                        "amount_minor": amount_minor, "currency": currency, **payload}}  # fmt: skip


def marked_ids(html: str, name: str) -> list[str]:
    """The data-id of every element with data-test=`name`, in page order."""
    return re.findall(rf'data-test="{name}"[^>]*?data-id="([^"]+)"', html)
