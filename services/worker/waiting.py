"""How a worker learns what it may lease: WorkDue reads, long polls, and the backlog.

Waiting is a read, and an idle worker's read is a long poll: the leader holds it until a command
after the one the worker's last answer reflected has applied (an enqueue, say), or until the next
due time or the worker's `idle_wait_s`, then answers it from its new state (`raft_store.client.LongPoll`). Of
the workers waiting for the same kinds the leader answers one per apply, so an enqueue sends one
worker to lease it, not all of them. A poll is given up only when a freed slot matters (work was
ready and room was not): a poll given up is still answered, and that apply wakes no one else.

Under load the read is skipped: a kind whose last lease was granted all it asked for, or that the
last read found ready beyond this worker's room, is in the backlog and is leased again directly,
as long as the last read is younger than `idle_poll_s` (breakers and pauses are followed from the
reads). An empty lease from the backlog ends it; empty leases after reads that said ready (the
read was stale, or the store and the read disagree) back off, doubling, instead of asking again.

Must never: wait past the next due time without asking, longer than `idle_wait_s` in a long poll
or `idle_poll_s` without one, or spin on leases that come back empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Final

from queues import ClientError, LongPoll, QueueClient, QueueError, Read, RequestRefused
from queues.query_codec import WorkDue, WorkDueAnswer

log = logging.getLogger("compensator.worker")
EMPTY_LEASE_BACKOFF_S: Final = 0.005
"""The first wait after a lease that found nothing the read said was ready; doubling while it recurs."""


class WorkWatch:
    def __init__(self, queue: QueueClient, kinds: Sequence[str], *, idle_poll_s: float) -> None:
        self._queue = queue
        self._kinds = tuple(kinds)
        self._idle_poll_s = idle_poll_s
        self._answer: Read[WorkDueAnswer] | None = None
        """A long poll's answer, not yet used."""
        self._applied_seen = 0
        """The applied index the last answer reflected: a long poll waits for one past it."""
        self._read_at_s = float("-inf")
        self._long_poll = True
        """False once a node refused a waiting read (one that predates them): plain polling then."""
        self._empty_leases = 0
        self.starved = False
        """The last read found work ready for a kind without room here."""
        self.backlog: set[str] = set()

    def use(self, queue: QueueClient) -> None:
        """Send through `queue` from the next call on (the set moved: SetLane.use)."""
        self._queue = queue

    async def read(self) -> WorkDueAnswer:
        """The long poll's answer if one came, else a fresh read."""
        read, self._answer = self._answer or await self._queue.work_due(self._kinds), None
        self._read_at_s = time.monotonic()
        self._applied_seen = max(self._applied_seen, read.applied_index)
        return read.value

    def forget(self) -> None:
        """After a failure: the next lease reads afresh."""
        self._answer = None
        self.backlog.clear()

    def found(self, ready: Sequence[str], with_room: Sequence[str]) -> None:
        self.starved = len(with_room) < len(ready)
        self.backlog = set(ready) - set(with_room)

    def backlogged(self, room: dict[str, int]) -> list[str]:
        """The backlogged kinds with room, when a lease may skip the read."""
        if not self.backlog or self._answer is not None or time.monotonic() - self._read_at_s >= self._idle_poll_s:
            return []
        return [kind for kind in sorted(self.backlog) if room.get(kind)]

    def leased(self, kind: str, granted: int, asked: int) -> None:
        if granted >= asked:
            self.backlog.add(kind)  # granted all it asked: likely more behind it
        else:
            self.backlog.discard(kind)

    def nothing_ready(self) -> None:
        """A read found nothing to lease: the next wait is a long poll again. The back-off after
        empty leases is for reads that said ready and leases that found nothing (a race with other
        workers); once a read says nothing is ready, the store answers a long poll at the next
        apply, so plain polls every `idle_poll_s` would only cost the set reads (an idle lane
        polled its set ten times a second for as long as it stayed idle after such a race)."""
        self._empty_leases = 0

    def wait_after(self, granted: int, *, from_read: bool) -> float:
        """The seconds to wait after a round of leases (0: lease again at once)."""
        if granted or not from_read:  # an empty lease from the backlog: it is drained, read again
            self._empty_leases = 0
            return 0.0
        # Another worker took what the read said was ready: wait for the store to change (the
        # long poll answers at the next apply). Empty again and again: back off.
        self._empty_leases += 1
        backoff_s: float = EMPTY_LEASE_BACKOFF_S * 2 ** min(self._empty_leases - 1, 16)
        return min(self._idle_poll_s, backoff_s)

    async def wait(self, stop: asyncio.Event, wait_s: float, slot_freed: asyncio.Event) -> None:
        """Until the store changes (the answer is kept for `read`), `wait_s` ran out, the worker
        stops, or (when work was ready but room was not) a slot is freed."""
        if not self._long_poll or self._empty_leases > 1:
            # A poll answered at the next apply would say the same; a plain poll is a read each time.
            await sleep_unless(stop, min(wait_s, self._idle_poll_s))
            return
        wait = LongPoll(self._applied_seen, wait_s, wakes_one=True)
        poll = asyncio.ensure_future(self._queue.query(WorkDue(kinds=self._kinds), stale_ok=True, wait=wait))
        others = [asyncio.ensure_future(stop.wait())]
        if self.starved:
            slot_freed.clear()
            others.append(asyncio.ensure_future(slot_freed.wait()))
        try:
            await asyncio.wait((poll, *others), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for other in others:
                other.cancel()
        if not poll.done():
            poll.cancel()  # the node answers it when it runs out; the answer is dropped
            return
        try:
            answer = poll.result()
        except RequestRefused as error:  # a node that knows no waiting reads
            log.warning("the store refused a waiting read (%s); polling instead", error)
            self._long_poll = False
            return
        except (ClientError, QueueError) as error:
            log.warning("could not ask for work (will retry): %s", error)
            await sleep_unless(stop, min(wait_s, self._idle_poll_s))
            return
        if not isinstance(answer.value, WorkDueAnswer):
            raise QueueError(f"expected WorkDueAnswer, got {type(answer.value).__name__}")
        self._answer = Read(answer.value, answer.applied_index, answer.now_ms)


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
