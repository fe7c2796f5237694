"""Quotas slow before they refuse: a GCRA bucket per producer, with an injected clock and sleep."""

from __future__ import annotations

import asyncio

import pytest
from api_support import running_api, transfer

from api.quotas import Quotas, QuotaSettings, Throttled
from queues import QueueClient, RaftClient, Role
from raft_store.testing.inprocess import StoreThread


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _quotas(time: FakeTime, *, rate: int = 10, burst: int = 5, hold_s: float = 0.5, held_max: int = 100,
            processes: int = 1) -> Quotas:  # fmt: skip
    settings = QuotaSettings(rate_per_s=rate, burst=burst, hold_max_s=hold_s, held_max=held_max, processes=processes)
    return Quotas(settings, clock=time.clock, sleep=time.sleep)


async def test_a_burst_passes_then_requests_wait_their_turn_then_are_refused() -> None:
    time = FakeTime()
    quotas = _quotas(time)
    for _ in range(5):
        assert await quotas.admit("p") == 0.0
    assert await quotas.admit("p") == pytest.approx(0.1)  # held for one slot, then taken
    waits = []
    for _ in range(4):
        waits.append(await quotas.admit("p"))
    assert waits == pytest.approx([0.1] * 4)
    time.now -= 0.5  # requests arriving together: each waits for its own slot, in order
    with pytest.raises(Throttled) as refused:
        for _ in range(10):
            await quotas.admit("p")
    assert refused.value.retry_after_s == 1 and quotas.refused_total == 1


async def test_a_refusal_gives_its_slot_back_and_producers_do_not_share_a_bucket() -> None:
    time = FakeTime()
    quotas = _quotas(time, rate=10, burst=1, hold_s=0.0)
    assert await quotas.admit("a") == 0.0
    for _ in range(3):
        with pytest.raises(Throttled):
            await quotas.admit("a")
    time.now += 0.1  # one slot later, and the refused ones took nothing
    assert await quotas.admit("a") == 0.0
    assert await quotas.admit("b") == 0.0


async def test_per_producer_rates_and_the_split_across_processes() -> None:
    time = FakeTime()
    quotas = _quotas(time, rate=10, burst=10, processes=2)  # each process takes 5/s with a burst of 5
    for _ in range(5):
        assert await quotas.admit("p") == 0.0
    assert await quotas.admit("p") == pytest.approx(0.2)
    # q's own quota (from the store), also split: 500/s and a burst of 50 here
    assert await quotas.admit("q", 50, rate_per_s=1000, burst=100) == 0.0
    assert await quotas.admit("q", 10, rate_per_s=1000, burst=100) == pytest.approx(0.02)
    with pytest.raises(Throttled, match="q is over its rate"):
        await quotas.admit("q", 400, rate_per_s=1000, burst=100)


async def test_bounded_waiting_room() -> None:
    time = FakeTime()
    gate = asyncio.Event()

    async def parked(seconds: float) -> None:
        await gate.wait()

    quotas = Quotas(QuotaSettings(rate_per_s=1, burst=1, hold_max_s=100, held_max=2), clock=time.clock, sleep=parked)
    await quotas.admit("p")
    waiting = [asyncio.create_task(quotas.admit("p")) for _ in range(2)]
    await asyncio.sleep(0)
    assert quotas.held == 2
    with pytest.raises(Throttled):
        await quotas.admit("p")
    gate.set()
    await asyncio.gather(*waiting)
    assert quotas.held == 0 and quotas.held_total == 2


async def test_the_api_holds_then_answers_429_with_retry_after(store: StoreThread) -> None:
    async with running_api(store, quota__hold_max_ms="300") as api:
        queue = QueueClient(RaftClient([store.address], auth=store.auth))
        await queue.set_quota("producer", actor="tests", rate_per_s=5, burst=2)
        await queue.raft.close()
        await asyncio.sleep(0.5)  # the API's token refresh carries the new quota
        answers = await asyncio.gather(*(
            api.client.post("/v1/requests", json=transfer(str(i)), headers={**api.auth(), "Idempotency-Key": f"q{i}"})
            for i in range(12)))  # fmt: skip
        statuses = [a.status_code for a in answers]
        assert statuses.count(201) == 2 + 1, statuses  # the burst, then one slot within the 300 ms hold
        refused = [a for a in answers if a.status_code == 429]
        assert len(refused) == 9 and all(int(a.headers["retry-after"]) >= 1 for a in refused)
        assert refused[0].json()["type"] == "/problems/rate-limited"
        created = {a.json()["id"] for a in answers if a.status_code == 201}
        stored = {e.message_id for e in (await api.queue.events_after(0)).value if e.kind == "transfer"}
        assert len(stored) == len(created)  # nothing refused was stored
        metrics = (await api.client.get("/metrics", headers=api.auth(Role.OPERATOR))).text
        assert 'compensator_api_throttled_total{outcome="refused"} 9.0' in metrics
        assert 'compensator_api_throttled_total{outcome="held"} 1.0' in metrics
