"""The API's shared dead-letter summary reads against the real store: asks of one filter at once share
one read, an ask that arrives while a read runs gets the next read (never one that started before
it), a failed read fails only its own askers, and nothing is kept for an idle filter."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from api_support import Api, dead_letters, transfer

from api.summaries import SummaryReads
from queues import DeadLetterFilter, QueueClient, RaftClient
from raft_store.client import ClientError

TRANSFERS = DeadLetterFilter(kind="transfer")


class GatedQueue(QueueClient):
    """The real client; each summary's answer is held until the test opens the gate, so the test
    decides what arrives while a read is in flight."""

    def __init__(self, raft: RaftClient) -> None:
        super().__init__(raft)
        self.gate = asyncio.Event()
        self.asked = 0

    async def dead_letter_summary(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        answer = await super().dead_letter_summary(*args, **kwargs)
        await self.gate.wait()
        return answer


async def test_asks_during_a_read_share_the_next_read_which_starts_after_them(api: Api) -> None:
    await dead_letters(api, transfer("a"))
    queue = GatedQueue(RaftClient(api.queue.raft.addresses, auth=api.queue.raft.auth, deadline_s=5))
    reads = SummaryReads(queue)
    try:
        first = asyncio.ensure_future(reads.get(TRANSFERS))
        await asyncio.sleep(0.1)
        assert queue.asked == 1  # the first read answered the store's state (one dead letter) and is held
        await dead_letters(api, transfer("b"))
        later = [asyncio.ensure_future(reads.get(TRANSFERS)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert queue.asked == 1  # the next read waits for the running one: one at a time
        queue.gate.set()
        assert (await first).value.count == 1
        assert [a.value.count for a in await asyncio.gather(*later)] == [2, 2, 2]  # never the older read
        assert queue.asked == 2 and reads.reads == 2
        assert len(reads) == 0  # nothing kept once idle
    finally:
        await queue.raft.close()


async def test_a_failed_read_fails_its_askers_only_and_the_next_ask_reads_again(api: Api) -> None:
    nowhere = QueueClient(RaftClient([("127.0.0.1", 1)], auth=api.queue.raft.auth, attempt_timeout_s=0.2, deadline_s=0.5))
    reads = SummaryReads(nowhere)
    try:
        with pytest.raises(ClientError):
            await reads.get(TRANSFERS)
        assert len(reads) == 0
    finally:
        await nowhere.raft.close()
    await dead_letters(api, transfer("c"))
    working = SummaryReads(api.queue)
    assert (await working.get(TRANSFERS)).value.count == 1
    assert (await working.get(DeadLetterFilter(kind="callback"))).value.count == 0 and working.reads == 2


async def test_the_list_shows_when_its_totals_were_read(api: Api) -> None:
    await dead_letters(api, transfer("d"))
    summary = await api.app.state.services.summaries.get(TRANSFERS)
    assert summary.value.count == 1 and summary.read_at_s > 0
