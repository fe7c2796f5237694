"""The worker's breakers (breaker.py), one per downstream, over every set it leases from.

A downstream is one whatever the set a request came from, so each breaker counts the attempts of
every set; but a pause is a kind's state in one set's store, so opening a breaker holds its kinds
in every set (each set in a task of its own: a set that is down delays no other), and closing it
releases them in every set. The breaker is open, for this worker, while any set it can reach
holds it (the last read of each set says); while it is open the worker leases its kinds from no
set, whether or not that set holds it (one that was down when the breaker tripped does not), and
probes with single leases where the breaker is the only holder. A set that was down while the
breaker closed still holds it when it comes back: every worker then sees the breaker open again,
probes, and the answered probe releases it in every set.

Must never: wait on a set's call in the lease path (holds and releases run as tasks), or count a
set that is down as holding or not holding.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Final

from handlers.contract import Decision, Retryable
from queues import ClientError, Grant, QueueClient, QueueError
from services.worker.breaker import DOWNSTREAM_FAILURES, Breaker, BreakerSettings, Mode, holder
from services.worker.metrics import WorkerMetrics

log = logging.getLogger("compensator.worker")
_FAILURES: Final = frozenset(DOWNSTREAM_FAILURES)


class BreakerBoard:
    def __init__(
        self, downstream_of: Mapping[str, str], sets: Mapping[int, QueueClient], settings: BreakerSettings, *,
        worker_id: str, metrics: WorkerMetrics,
    ) -> None:  # fmt: skip
        self.kinds_of: dict[str, list[str]] = {}
        for kind, downstream in sorted(downstream_of.items()):
            self.kinds_of.setdefault(downstream, []).append(kind)
        self._downstream_of = dict(downstream_of)
        rng = random.Random()
        self.breakers = {
            downstream: Breaker(downstream, settings, clock=time.monotonic, rng=rng) for downstream in self.kinds_of
        }
        self._sets = sets
        self._worker_id = worker_id
        self._metrics = metrics
        self._paused: dict[int, Mapping[str, tuple[str, ...]]] = {}
        """Set -> its kinds' holders, as that set's last read said (sets that answer only)."""
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- what the sets say ---------------------------------------------------------------------
    def follow(self, set_id: int, paused: Mapping[str, tuple[str, ...]]) -> None:
        """Take in what a set's read says (held or not) and what operators forced."""
        self._paused[set_id] = paused
        for downstream, breaker in self.breakers.items():
            holds = self._holding(downstream)
            breaker.observe(bool(holds))
            self._metrics.breaker_open.labels(downstream).set(1 if breaker.open else 0)
            if breaker.mode is Mode.OPEN and set_id not in holds:
                self._spawn(self._hold(set_id, downstream, "forced open by an operator"))
            elif breaker.mode is Mode.CLOSED and set_id in holds:
                self._spawn(self._release(set_id, downstream))

    def any_open(self) -> bool:
        """Some downstream's breaker is open: an idle worker then asks often, to time its probes."""
        return any(breaker.open for breaker in self.breakers.values())

    def forget(self, set_id: int) -> None:
        """The set does not answer: what it last said no longer counts."""
        self._paused.pop(set_id, None)

    def _holding(self, downstream: str) -> set[int]:
        name = holder(downstream)
        return {set_id for set_id, paused in self._paused.items()
                if any(name in paused.get(kind, ()) for kind in self.kinds_of[downstream])}  # fmt: skip

    # ---- what a lane may lease -----------------------------------------------------------------
    def blocked(self, kind: str) -> bool:
        """The kind's breaker is open: no leases but probes, from any set."""
        return self.breakers[self._downstream_of[kind]].open

    def ramp(self, room: dict[str, int]) -> None:
        """Cap each downstream's room by its breaker's ramp, if it is ramping."""
        for downstream, breaker in self.breakers.items():
            allowed = breaker.allowance()
            if allowed is None:
                continue
            for kind in self.kinds_of[downstream]:
                if kind in room:
                    room[kind] = min(room[kind], allowed)
                    allowed -= room[kind]

    def probes(
        self, paused: Mapping[str, tuple[str, ...]], paused_ready: tuple[str, ...], room: dict[str, int]
    ) -> list[str]:
        """One kind per open breaker to probe now, among those only the breaker holds (in the set
        whose read this is)."""
        chosen: list[str] = []
        for downstream, breaker in self.breakers.items():
            candidates = [kind for kind in self.kinds_of[downstream] if kind in paused_ready and room.get(kind)
                          and paused.get(kind) == (holder(downstream),)]  # fmt: skip
            if candidates and breaker.probe_due():
                chosen.append(candidates[0])
        return chosen

    def downstream(self, kind: str) -> str:
        return self._downstream_of[kind]

    def took(self, kind: str, count: int) -> None:
        """Attempts started under a ramp (negative: slots taken for a lease and not granted)."""
        self.breakers[self._downstream_of[kind]].took(count)

    # ---- what an attempt says ------------------------------------------------------------------
    def record(self, set_id: int, grant: Grant, decision: Decision, probe: bool) -> None:
        downstream = self._downstream_of[grant.kind]
        breaker = self.breakers[downstream]
        failure = decision.error_class if isinstance(decision, Retryable) else None
        breaker.record(failure)
        if probe and breaker.open and failure not in _FAILURES:
            log.info("breaker %s: the probe of request %d-%d was answered; closing", downstream, set_id,
                     grant.message_id)  # fmt: skip
            breaker.observe(held=False)
            for each in self._sets:
                self._spawn(self._release(each, downstream))
        elif breaker.should_trip():
            reason = breaker.tripped()
            log.warning("breaker %s opens: %s", downstream, reason)
            for each in self._sets:
                self._spawn(self._hold(each, downstream, reason))

    async def _hold(self, set_id: int, downstream: str, reason: str) -> None:
        for kind in self.kinds_of[downstream]:
            await self._sets[set_id].pause(kind, holder(downstream), reason, actor=self._worker_id)

    async def _release(self, set_id: int, downstream: str) -> None:
        for kind in self.kinds_of[downstream]:
            await self._sets[set_id].resume(kind, holder(downstream), actor=self._worker_id)

    def _spawn(self, step: Coroutine[Any, Any, None]) -> None:
        async def guarded() -> None:
            try:
                await step
            except (ClientError, QueueError) as error:  # the next read shows the store as it is, and it is tried again
                log.warning("breaker change failed: %s", error)

        task = asyncio.create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
