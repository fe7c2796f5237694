"""Lease extension while a handler runs.

A lease is granted for `lease_ms`; a handler waiting on a slow downstream may need longer. Every
`lease_ms / 4` the keeper extends, in one frame, every lease with less than half its time left,
measured on this worker's monotonic clock from when the Lease (or the last extension) was *sent*:
the store applied it after that, so the local deadline is never later than the store's
(handlers/lease_time.py, which also takes the store's new deadline from the answer). A refused
extension means the lease is gone (expired and retried elsewhere, or finished): the attempt runs on,
its ack will be fenced off by the store, and it writes no request once its local deadline passed.

Must never: extend a lease whose attempt has finished (the runner forgets it first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from handlers.lease_time import LeaseTime
from queues import ClientError, Code, QueueClient, QueueError
from queues.model import ExtendLease, Outcome, QueueCommand

log = logging.getLogger("compensator.worker")


@dataclass(slots=True)
class Held:
    message_id: int
    token: int
    lease: LeaseTime
    lost: bool = False


class LeaseKeeper:
    def __init__(self, queue: QueueClient, *, lease_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._queue = queue
        self._lease_ms = lease_ms
        self._clock = clock
        self._held: dict[int, Held] = {}
        self.extended = 0
        self.lost = 0

    def use(self, queue: QueueClient) -> None:
        """Send through `queue` from the next call on (the set moved: SetLane.use)."""
        self._queue = queue

    def hold(self, message_id: int, token: int, lease: LeaseTime) -> None:
        self._held[message_id] = Held(message_id, token, lease)

    def forget(self, message_id: int) -> None:
        self._held.pop(message_id, None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 4000)
            try:
                await self.extend_due()
            except (ClientError, QueueError) as error:
                log.warning("lease extension failed (will retry): %s", error)

    async def extend_due(self) -> int:
        now = self._clock()
        due = [h for h in self._held.values() if not h.lost and h.lease.send_by() - now < self._lease_ms / 2000]
        if not due:
            return 0
        commands: list[QueueCommand] = [
            ExtendLease(message_id=h.message_id, token=h.token, lease_ms=self._lease_ms) for h in due
        ]
        results = await self._queue.submit_many(commands)
        for held, result in zip(due, results, strict=True):
            if isinstance(result, Outcome) and result.code is Code.OK:
                held.lease.extended(sent_s=now, deadline_ms=result.deadline_ms)
                self.extended += 1
            else:
                held.lost = True
                self.lost += 1
                code = result.code.name if isinstance(result, Outcome) else type(result).__name__
                log.info("lease of message %d lost while its attempt runs (%s)", held.message_id, code)
        return len(due)
