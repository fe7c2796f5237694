"""The fault proxy between a client and the payment stand-in: each fate does to a request what the
network would, seen from both sides (what the client got, what the stand-in applied)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from handlers_support import Standins

from handlers.standins.proxy import ProxyFaults, running_proxy

TRANSFER: dict[str, Any] = {"transfer_id": "t-1", "payer": "escrow", "payee": "u-1", "amount_minor": 5,
                            "currency": "CNY", "business_id": "g-1"}  # fmt: skip


def upstream(standins: Standins) -> tuple[str, int]:
    host, port = standins.urls["payment"].removeprefix("http://").split(":")
    return host, int(port)


async def post(url: str, transfer_id: str, timeout_s: float = 0.4) -> httpx.Response | str:
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        try:
            return await client.post("/transfers", json={**TRANSFER, "transfer_id": transfer_id},
                                     headers={"Idempotency-Key": transfer_id})  # fmt: skip
        except httpx.HTTPError as error:
            return type(error).__name__


async def paid(standins: Standins) -> list[str]:
    return [row["transfer_id"] for row in await standins.rows("SELECT transfer_id FROM payment_transfers ORDER BY 1")]


@pytest.mark.parametrize(
    ("faults", "client_saw", "applied_at_once", "applied_later"),
    [
        (ProxyFaults(), 201, True, True),
        (ProxyFaults(hold_rate=1.0, hold_s=(0.8, 0.8)), "ReadTimeout", False, True),
        (ProxyFaults(lose_rate=1.0), "RemoteProtocolError", False, False),
        (ProxyFaults(drop_rate=1.0), "RemoteProtocolError", True, True),
        (ProxyFaults(slow_rate=1.0, slow_s=0.8), "ReadTimeout", True, True),
    ],
    ids=["pass", "hold", "lose", "drop", "slow"],
)
async def test_each_fate(
    standins: Standins, faults: ProxyFaults, client_saw: Any, applied_at_once: bool, applied_later: bool
) -> None:
    with running_proxy(upstream(standins), faults) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"
        answer = await post(url, "t-1")
        now = await paid(standins)
        await asyncio.sleep(1.0)
        later = await paid(standins)
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
            lookup = await client.get("/transfers/t-1")  # lookups pass whatever the faults
        counts = proxy.counts()
    assert (answer.status_code if isinstance(answer, httpx.Response) else answer) == client_saw
    assert (now == ["t-1"], later == ["t-1"]) == (applied_at_once, applied_later)
    assert lookup.status_code == (200 if applied_later else 404)
    assert counts["lookup"] == 1 and sum(counts.values()) == 2


async def test_a_held_request_does_not_hold_the_next_one(standins: Standins) -> None:
    faults = ProxyFaults(hold_rate=1.0, hold_s=(1.5, 1.5), seed=1)
    with running_proxy(upstream(standins), faults) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"
        held = asyncio.create_task(post(url, "t-1", timeout_s=3.0))
        await asyncio.sleep(0.1)
        proxy.configure(ProxyFaults())
        started = time.monotonic()
        quick = await post(url, "t-2", timeout_s=3.0)
        quick_s = time.monotonic() - started
        assert isinstance(await held, httpx.Response)
    assert isinstance(quick, httpx.Response) and quick.status_code == 201 and quick_s < 1.0
    assert await paid(standins) == ["t-1", "t-2"]
