"""A busy lane's lease that would carry nothing of its set's waits for one of its set's attempts to
end (services/worker/lanes.py, `_gather`): `Completions.arrival` answers as soon as a completion is
pending, at once when one already is, and after its timeout when none came."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from queues import QueueClient
from services.worker.completions import Completions


def _completions() -> Completions:
    # Nothing here reaches the store: arrival only watches what is pending.
    return Completions(cast(QueueClient, object()), on_settled=lambda completion, code: None)


async def test_arrival_answers_when_a_completion_is_added() -> None:
    completions = _completions()
    waiting = asyncio.create_task(completions.arrival(5.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    started = time.monotonic()
    completions.ack(42, 7, "transfer", "transferred")
    assert await asyncio.wait_for(waiting, 1.0) is True
    assert time.monotonic() - started < 0.5


async def test_arrival_answers_at_once_when_one_is_pending_and_false_after_its_timeout() -> None:
    completions = _completions()
    started = time.monotonic()
    assert await completions.arrival(0.05) is False
    assert time.monotonic() - started >= 0.04
    completions.fail(43, 8, "transfer", error_class="timeout", error_text="no answer", permanent=False,
                     retry_after_ms=None)  # fmt: skip
    assert await asyncio.wait_for(completions.arrival(5.0), 0.1) is True
    taken = completions.take()
    assert [c.message_id for c in taken] == [43]
    assert await completions.arrival(0.01) is False  # taken by a lease: nothing pending any more
