"""One set as a worker leases from it: its own loop, its watch for work, its completions and lease
keeper, and its own backoff, so a set that is down or has no leader stalls only itself.

A worker runs one lane per set, all on one event loop, sharing the worker's room (shares.py) and
its breakers (breaker_board.py). Each lane waits for its set's work with reads (waiting.py),
leases within its share, and hands each grant to the worker with the set's id; what the attempt
ends with goes back to the same set through this lane's completions, and the extension of its
lease through this lane's keeper. Message ids are a set's own (two sets both have a message 42):
whatever a lane keys by message id alone is that set's.

A set whose calls fail (no node answers, no leader, no majority: the client's deadline) is backed
off by its own lane, doubling up to `ERROR_BACKOFF_MAX_S`, while the others lease at full rate;
the lane says the set is unreachable (a gauge, and the documents' fallback) until a call succeeds
again, then leases as before without a restart. While it is down it wants no share, so its part
of the room goes to the others.

Fewer, fuller frames per set: a lane's Lease frame carries the completions waiting in its set
(completions.py, `take`): the attempts that ended freed the slots it leases, so their acks and
fails go in the same frame and the same log entry. And while the worker is busy its lanes take
turns to lease (turns.py): one lease frame on its way across the sets, so each set's lease carries
what finished there during the other sets' round trips, and a worker of three sets writes about as
many log entries per done request as a worker of one. A turn is held at most `turns.HOLD_S`, so a
set that does not answer delays the others' leases by that at most.

Must never: lease more than the lane took room for, or block another set's lane for longer than a
turn's hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from handlers.lease_time import LeaseTime
from queues import ClientError, Code, Grant, LeaseResult, QueueClient, QueueError
from queues.model import Lease, QueueCommand
from services.worker.breaker import holder
from services.worker.breaker_board import BreakerBoard
from services.worker.completions import Completion, Completions
from services.worker.completions import commands as completion_commands
from services.worker.keeper import LeaseKeeper
from services.worker.metrics import WorkerMetrics
from services.worker.shares import Shares
from services.worker.turns import HOLD_S, Turns
from services.worker.waiting import WorkWatch, sleep_unless

if TYPE_CHECKING:
    from services.worker.runner import WorkerSettings

log = logging.getLogger("compensator.worker")
ERROR_BACKOFF_MIN_S: Final = 0.05
ERROR_BACKOFF_MAX_S: Final = 2.0
CARRY_WAIT_S: Final = 0.05
"""While the lanes take turns: the longest a lease with nothing of its set's to carry waits for one
of the set's running attempts to end (then it carries that settlement and refills its slot too)."""

Start = Callable[["SetLane", Grant, LeaseTime, bool], None]
"""The worker's: run this grant of this lane's set (the last argument: it is a breaker's probe)."""
Settled = Callable[[int, Completion, Code], None]
"""The worker's: the store's answer to a completion, with the set it went to."""


class SetLane:
    def __init__(
        self, set_id: int, queue: QueueClient, kinds: Sequence[str], settings: WorkerSettings, *, shares: Shares,
        board: BreakerBoard, metrics: WorkerMetrics, start: Start, busy: Callable[[], bool],
        settled: Settled, turns: Turns | None = None,
    ) -> None:  # fmt: skip
        self.set_id = set_id
        self.queue = queue
        self._settings = settings
        self._shares = shares
        self._board = board
        self._metrics = metrics
        self._start = start
        self._busy = busy
        self._turns = turns
        self.watch = WorkWatch(queue, kinds, idle_poll_s=settings.idle_poll_s)
        self.completions = Completions(queue, on_settled=lambda c, code: settled(set_id, c, code),
                                       linger_s=settings.linger_s, busy=busy, carried=self._leases_soon,
                                       carry_wait_s=self._carry_wait_s)  # fmt: skip
        self.keeper = LeaseKeeper(queue, lease_ms=settings.lease_ms)
        self.reachable = True
        self.leasing = False
        """`lease_until` runs (not yet stopped for the drain)."""
        self.lease_commands = 0
        self.leased = 0
        metrics.set_unreachable.labels(str(set_id)).set(0)

    def use(self, queue: QueueClient) -> QueueClient:
        """Lease, settle and extend through `queue` from now on (the set's addresses changed in the
        table); the client used until now is answered. Calls it carries already end on it: an
        attempt's completion or extension is the same set's, whichever client takes it."""
        old, self.queue = self.queue, queue
        self.watch.use(queue)
        self.completions.use(queue)
        self.keeper.use(queue)
        return old

    # ---- the loop ------------------------------------------------------------------------------
    def _leases_soon(self) -> bool:
        """The lane leases again as soon as a slot is free, without reading first (it has a backlog
        and its set answers): its next lease can carry the completions of the attempts that free
        those slots."""
        return self.leasing and self.reachable and bool(self.watch.backlog)

    def _carry_wait_s(self) -> float:
        """How long completions wait for the lease that will carry them: a linger, or while the
        lanes take turns, the longest a turn can keep this lane's lease waiting."""
        return HOLD_S if self._turns is not None and self._turns.active() else self._settings.linger_s

    async def lease_until(self, stop: asyncio.Event) -> None:
        self.leasing = True
        try:
            await self._lease_until(stop)
        finally:
            self.leasing = False

    async def _lease_until(self, stop: asyncio.Event) -> None:
        backoff_s = ERROR_BACKOFF_MIN_S
        while not stop.is_set():
            try:
                room = self._shares.free(self.set_id)
                if not room:
                    await self._without_room(stop)
                    continue
                wait_s = await self._lease_once(room)
            except (ClientError, QueueError) as error:
                self._failed(error)
                await sleep_unless(stop, backoff_s)
                backoff_s = min(backoff_s * 2, ERROR_BACKOFF_MAX_S)
                continue
            self._answered()
            backoff_s = ERROR_BACKOFF_MIN_S
            if wait_s > 0:
                await self.watch.wait(stop, wait_s, self._shares.freed(self.set_id))

    async def _without_room(self, stop: asyncio.Event) -> None:
        """Wait for a slot. While other sets run attempts here, this set's demand must be known to
        them (their shares shrink by it), so it is read, a plain read at most every `idle_poll_s`."""
        timeout_s: float | None = None
        if self._shares.others_hold(self.set_id):
            timeout_s = self._settings.idle_poll_s
            due = await self.watch.read()
            self._board.follow(self.set_id, due.paused)
            self._shares.want(self.set_id, due.ready)
            self._answered()
        await self._shares.wait_freed(self.set_id, stop, timeout_s)

    def _failed(self, error: Exception) -> None:
        if self.reachable:
            log.warning("set %d does not answer (leasing from the other sets; retrying it): %s", self.set_id, error)
        else:
            log.debug("set %d still does not answer: %s", self.set_id, error)
        self.reachable = False
        self._metrics.set_unreachable.labels(str(self.set_id)).set(1)
        self.watch.forget()
        self._shares.want(self.set_id, ())
        self._board.forget(self.set_id)

    def _answered(self) -> None:
        if not self.reachable:
            log.warning("set %d answers again; leasing from it", self.set_id)
            self.reachable = True
            self._metrics.set_unreachable.labels(str(self.set_id)).set(0)

    async def _lease_once(self, room: dict[str, int]) -> float:
        """Lease what is ready; the seconds to wait before asking again (0: at once)."""
        watch, board = self.watch, self._board
        board.ramp(room)
        backlog = [kind for kind in watch.backlogged(room) if not board.blocked(kind)]
        if backlog and self._busy():
            await self._gather()
            room = self._shares.free(self.set_id)
            board.ramp(room)
            backlog = [kind for kind in watch.backlogged(room) if not board.blocked(kind)]
        if backlog:
            return watch.wait_after(await self._lease(backlog, [], room), from_read=False)
        due = await watch.read()
        board.follow(self.set_id, due.paused)
        self._shares.want(self.set_id, due.ready)
        room = self._shares.free(self.set_id)  # the set's share, now that the others know its demand
        board.ramp(room)
        ready = [kind for kind in sorted(due.ready) if room.get(kind) and not board.blocked(kind)]
        watch.found(sorted(due.ready), ready)
        probes = board.probes(due.paused, due.paused_ready, room)
        if not ready and not probes:
            self._shares.want(self.set_id, watch.backlog)
            if not due.ready:
                watch.nothing_ready()
            # Idle: a long poll held until the store changes; with a breaker open, its probes'
            # timing decides (every idle_poll_s).
            longest = self._settings.idle_poll_s if board.any_open() else self._settings.idle_wait_s
            if due.next_due_ms is None:
                return longest
            return min(longest, max(0.0, (due.next_due_ms - due.now_ms) / 1000))
        return watch.wait_after(await self._lease(ready, probes, room), from_read=True)

    async def _gather(self) -> None:
        """Before a busy lane's lease: the slots freed within a linger join it. With several sets
        a slot is often freed by another set's attempt (any set's lane may take it), so the lease
        would carry nothing of its own set: an entry of its own where one set's lease carries the
        settlement of the attempt that freed its slot. While the lanes take turns, such a lease
        first waits, at most `CARRY_WAIT_S`, for one of its set's running attempts to end."""
        if (self._turns is not None and self._turns.active() and not self.completions.pending
                and self._shares.held(self.set_id)):  # fmt: skip
            await self.completions.arrival(CARRY_WAIT_S)
        await asyncio.sleep(self._settings.linger_s)

    async def _lease(self, ready: list[str], probes: list[str], room: dict[str, int]) -> int:
        """One Lease command per kind (`ready`, then one-grant probes), in one frame, for room
        taken first; starts the grants, gives back the room they did not fill, and says how many
        there were."""
        settings = self._settings
        asked = [min(room[kind], settings.batch_max) for kind in ready] + [1 for _ in probes]
        commands: list[QueueCommand] = [
            Lease(worker_id=settings.worker_id, kinds=(kind,), lease_ms=settings.lease_ms, count_max=count)
            for kind, count in zip(ready, asked, strict=False)
        ]  # fmt: skip
        commands += [
            Lease(worker_id=settings.worker_id, kinds=(kind,), lease_ms=settings.lease_ms, count_max=1,
                  probe=holder(self._board.downstream(kind)))
            for kind in probes
        ]  # fmt: skip
        kinds = ready + probes
        for index, (kind, count) in enumerate(zip(kinds, asked, strict=True)):
            self._shares.take(self.set_id, kind, count)
            if index < len(ready):  # a ramp's allowance, too, is taken before the lanes' leases run at once
                self._board.took(kind, count)
        started = [0] * len(kinds)
        try:
            await self._send(commands, kinds, asked, len(ready), started)
        finally:  # a grant keeps its slot until its attempt ends; the rest are given back
            for index, (kind, count, used) in enumerate(zip(kinds, asked, started, strict=True)):
                self._shares.give(self.set_id, kind, count - used)
                if index < len(ready):
                    self._board.took(kind, used - count)
        self._shares.want(self.set_id, self.watch.backlog)
        return sum(started)

    async def _send(
        self, commands: list[QueueCommand], kinds: list[str], asked: list[int], ready: int, started: list[int]
    ) -> None:
        settings = self._settings
        async with self._turns.turn() if self._turns is not None else contextlib.nullcontext():
            carried = self.completions.take()  # the attempts whose slots this lease refills, settled in its frame
            settling = completion_commands(carried)
            requested_s = time.monotonic()  # the store grants after this: the lease ends no earlier here
            try:
                results = await self.queue.submit_many(settling + commands)
            except BaseException:
                self.completions.not_carried(carried)
                raise
        received_s = time.monotonic()
        self.completions.carried(carried, results[: len(settling)])
        results = results[len(settling) :]
        self.lease_commands += len(commands)
        for index, result in enumerate(results):
            if not isinstance(result, LeaseResult):
                raise QueueError(f"expected a lease result, got {result!r}")
            self._metrics.leases_expired.inc(result.expired)
            probe = index >= ready
            if not probe:
                self.watch.leased(kinds[index], len(result.grants), asked[index])
            grants = (await self.queue.checked(result)).grants
            for grant in grants:
                lease = LeaseTime.granted(lease_ms=settings.lease_ms, deadline_ms=grant.deadline_ms,
                                          requested_s=requested_s, received_s=received_s)  # fmt: skip
                started[index] += 1
                self._start(self, grant, lease, probe)
            self.leased += len(grants)
            self._metrics.set_grants.labels(str(self.set_id)).inc(len(grants))
