"""A busy worker's lanes take turns to lease (services/worker/turns.py): one lease on its way at a
time across the sets, handed over in the order the lanes asked; a lane whose set does not answer
keeps the others waiting at most the hold; not busy, every lane leases at once."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.turns import Turns


async def _lease(turns: Turns, name: str, log: list[str], answered: asyncio.Event) -> None:
    async with turns.turn():
        log.append(f"{name} sent")
        await answered.wait()
        log.append(f"{name} answered")


async def _turns() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_busy_lanes_lease_one_at_a_time_in_the_order_they_asked() -> None:
    turns = Turns(active=lambda: True)
    log: list[str] = []
    answers = {name: asyncio.Event() for name in ("set1", "set2", "set3")}
    tasks = [asyncio.create_task(_lease(turns, name, log, answers[name])) for name in ("set1", "set2", "set3")]
    await _turns()
    assert log == ["set1 sent"]
    answers["set1"].set()
    await _turns()
    assert log == ["set1 sent", "set1 answered", "set2 sent"]
    answers["set2"].set()
    answers["set3"].set()
    await asyncio.gather(*tasks)
    assert log[-2:] == ["set3 sent", "set3 answered"]
    assert turns.waited == 2


async def test_a_lane_whose_set_does_not_answer_keeps_the_others_waiting_at_most_the_hold() -> None:
    turns = Turns(active=lambda: True, hold_s=0.05)
    log: list[str] = []
    never = asyncio.Event()
    down = asyncio.create_task(_lease(turns, "down", log, never))
    await _turns()
    started = asyncio.get_running_loop().time()
    answered = asyncio.Event()
    answered.set()
    await asyncio.wait_for(_lease(turns, "up", log, answered), 1.0)
    waited = asyncio.get_running_loop().time() - started
    assert 0.04 <= waited < 0.05 + 0.5, waited  # the hold, not the stuck lease's (the margin: a loaded CI loop)
    before = turns.waited
    await asyncio.wait_for(_lease(turns, "up again", log, answered), 1.0)
    assert turns.waited == before, "the stuck one holds nothing now: the next lease did not wait"
    down.cancel()
    with pytest.raises(asyncio.CancelledError):
        await down


async def test_not_busy_every_lane_leases_at_once() -> None:
    turns = Turns(active=lambda: False)
    log: list[str] = []
    answered = asyncio.Event()
    tasks = [asyncio.create_task(_lease(turns, name, log, answered)) for name in ("set1", "set2", "set3")]
    await _turns()
    assert log == ["set1 sent", "set2 sent", "set3 sent"]
    answered.set()
    await asyncio.gather(*tasks)
    assert turns.waited == 0


async def test_a_lane_cancelled_while_waiting_or_handed_the_turn_passes_it_on() -> None:
    turns = Turns(active=lambda: True)
    log: list[str] = []
    first, third = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_lease(turns, "set1", log, first))
    await _turns()
    waiting = asyncio.create_task(_lease(turns, "set2", log, asyncio.Event()))
    last = asyncio.create_task(_lease(turns, "set3", log, third))
    await _turns()
    waiting.cancel()  # its set was dropped while it waited
    first.set()
    await _turns()
    assert log == ["set1 sent", "set1 answered", "set3 sent"]
    third.set()
    await asyncio.gather(holder, last)
    with pytest.raises(asyncio.CancelledError):
        await waiting
