"""The lease-expiry (and tombstone purge) driver: proposes ExpireLeases and Purge periodically.

    python -m queues.maintenance --addresses 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 --secret-file F

Owns: *when* maintenance commands are proposed. The machine decides *what* they do, from the
leader's now_ms in the log entry, so a driver never reads the queue's state and any number of
drivers is safe (a second ExpireLeases at the same time finds nothing to expire). Proposals go
through a RaftClient, which follows the leader: the commands are always appended by the leader.

Cadence: every `expire_every_s` (150 ms by default) it *reads* when the next lease expires (a
stale read of the leader's state, not a log entry) and proposes ExpireLeases(limit) only once one
has; when a command expired a full `limit`, the next one is proposed at once (a backlog of expired
leases drains at log speed). Every `purge_every_s` it reads when the next tombstone's retention
ends and how old the oldest event is, and proposes Purge(limit) only if either is due, repeated
while full. An idle set therefore writes nothing: before this, the driver alone wrote about seven
entries a second to every replica's log, forever.

Redrive jobs (queues/core/jobs.py): every period it also reads the running and paused jobs (a stale
read) and proposes StepJob(job_limit) for each running job whose rate allows an item by now
(`JobView.next_step_ms`), repeated at once while a step comes back full. The machine enforces the
rate from the entry's leader time, so two drivers stepping one job redrive no more and no sooner
than one; a job the rate holds back costs a read, not a log entry.

Expiry is not what makes an expired or delayed message leasable again: every Lease expires
overdue leases first and reads the due index at the leader's now_ms, so a message is leasable as
soon as it is due and a worker polls. The driver keeps states, counts and the event log current
for messages nobody is leasing (a paused kind, idle workers).

Must never: decide anything from its own clock except when to propose.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from queues.client import QueueClient, QueueError
from queues.core.jobs import JOBS_ACTIVE_MAX
from queues.model import EVENTS_PURGE_MAX, Code, JobState
from raft_store import cli as raft_cli
from raft_store.auth import StoreAuth
from raft_store.client import ClientError, RaftClient
from raft_store.process import configure_logging

log = logging.getLogger("queues.maintenance")


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintenanceConfig:
    expire_every_s: float = 0.15
    idle_every_s: float | None = None
    """After a period that found nothing to do: the next one starts at the earliest deadline it
    read (a lease's, a running job's next step) but no later than this (a lease granted meanwhile
    is at most this late to expire; every Lease command expires overdue leases itself anyway).
    None: every `expire_every_s`, as under load. A deployment's drivers use 1 s (`SERVICE`)."""
    expire_limit: int = 1000
    purge_every_s: float = 60.0
    purge_limit: int = 1000
    rounds_max: int = 100
    """Back-to-back full commands at most, before yielding to the next period."""
    job_limit: int = 300
    """Items one StepJob redrives at most: each is an audited redrive on every replica, so a step
    of 300 keeps an entry's apply to some tens of milliseconds."""

    def validate(self) -> None:
        if self.expire_every_s <= 0 or self.purge_every_s <= 0 or (self.idle_every_s or 1) <= 0:
            raise ValueError("periods must be positive")
        if not all(1 <= limit <= 1000 for limit in (self.expire_limit, self.purge_limit, self.job_limit)):
            raise ValueError("limits must be in [1, 1000]")


SERVICE: Final = MaintenanceConfig(idle_every_s=1.0)
"""What the service's drivers (each worker's, the local launcher's) run with: an idle set is read
once a second, not every 0.15 s (with several sets, that is most of what idle sets cost)."""


@dataclass(slots=True)
class MaintenanceStats:
    expire_commands: int = 0
    expired: int = 0
    purge_commands: int = 0
    purged: int = 0
    events_purged: int = 0
    errors: int = 0
    job_steps: int = 0
    job_items: int = 0
    """Items the steps of this driver acted on (redriven or refused)."""
    reads: int = 0
    """Reads of what is due (no log entry): most periods end here on an idle set."""


class MaintenanceDriver:
    def __init__(self, queue: QueueClient, config: MaintenanceConfig | None = None) -> None:
        self.queue = queue
        self.config = config or MaintenanceConfig()
        self.config.validate()
        self.stats = MaintenanceStats()
        self._task: asyncio.Task[None] | None = None
        self._next_due_s: float | None = None
        """The earliest deadline the current period read, in seconds from its read."""

    def start(self) -> asyncio.Task[None]:
        assert self._task is None, "already started"
        self._task = asyncio.get_running_loop().create_task(self.run(), name="queue-maintenance")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        next_purge = loop.time() + cfg.purge_every_s
        while True:
            started = loop.time()
            acted_before = self.stats.expired + self.stats.job_items
            self._next_due_s = None
            await self._guarded(self.expire_if_due)
            await self._guarded(self.step_jobs_if_due)
            if loop.time() >= next_purge:
                next_purge = loop.time() + cfg.purge_every_s
                await self._guarded(self.purge_if_due)
            period = cfg.expire_every_s
            if cfg.idle_every_s is not None and self.stats.expired + self.stats.job_items == acted_before:
                # Idle: until the earliest deadline read, within [expire_every_s, idle_every_s].
                soonest = cfg.idle_every_s if self._next_due_s is None else self._next_due_s
                period = max(cfg.expire_every_s, min(cfg.idle_every_s, soonest))
            await asyncio.sleep(max(0.0, period - (loop.time() - started)))

    def _due_in(self, due_ms: int | None, now_ms: int) -> None:
        """A deadline read this period (log time): the idle period ends by it."""
        if due_ms is not None:
            seconds = max(0.0, (due_ms - now_ms) / 1000)
            self._next_due_s = seconds if self._next_due_s is None else min(self._next_due_s, seconds)

    async def expire_if_due(self) -> int:
        due = (await self.queue.maintenance_due()).value
        self.stats.reads += 1
        if due.lease_deadline_ms is None or due.lease_deadline_ms > due.now_ms:
            self._due_in(due.lease_deadline_ms, due.now_ms)
            return 0
        return await self.expire_once()

    async def purge_if_due(self) -> int:
        due = (await self.queue.maintenance_due()).value
        self.stats.reads += 1
        tombstones = due.purge_ms is not None and due.purge_ms <= due.now_ms
        events = due.oldest_event_ms is not None and due.oldest_event_ms <= due.now_ms - due.event_retention_ms
        if not (tombstones or events):
            return 0
        return await self.purge_once()

    async def step_jobs_if_due(self) -> int:
        """Step every running job the rate allows an item by now; returns the items acted on."""
        read = await self.queue.jobs(active_only=True, limit=JOBS_ACTIVE_MAX, stale_ok=True)
        self.stats.reads += 1
        total = 0
        for job in read.value:
            if job.state is JobState.RUNNING and job.next_step_ms is not None and job.next_step_ms <= read.now_ms:
                total += await self.step_job(job.job_id)
            elif job.state is JobState.RUNNING:
                self._due_in(job.next_step_ms, read.now_ms)
        return total

    async def step_job(self, job_id: int) -> int:
        """Step one job, repeating while a step comes back full and the job still runs."""
        total = 0
        for _ in range(self.config.rounds_max):
            result = await self.queue.step_job(job_id, self.config.job_limit)
            done = len(result.redriven) + len(result.refused)
            self.stats.job_steps += 1
            self.stats.job_items += done
            total += done
            if result.code is not Code.OK or result.state is not JobState.RUNNING or done < self.config.job_limit:
                break
        return total

    async def _guarded(self, step: Callable[[], Awaitable[int]]) -> None:
        try:
            await step()
        except (ClientError, QueueError, OSError) as error:  # no leader yet, or a restart: next period
            self.stats.errors += 1
            log.warning("maintenance command failed: %r", error)

    async def expire_once(self) -> int:
        """Expire overdue leases, repeating while each command hits its limit. Returns the count."""
        total = 0
        for _ in range(self.config.rounds_max):
            result = await self.queue.expire_leases(self.config.expire_limit)
            self.stats.expire_commands += 1
            self.stats.expired += len(result.ids)
            total += len(result.ids)
            if len(result.ids) < self.config.expire_limit:
                break
        return total

    async def purge_once(self) -> int:
        total = 0
        for _ in range(self.config.rounds_max):
            result = await self.queue.purge(self.config.purge_limit)
            self.stats.purge_commands += 1
            self.stats.purged += len(result.ids)
            self.stats.events_purged += result.events_purged
            total += len(result.ids)
            if len(result.ids) < self.config.purge_limit and result.events_purged < EVENTS_PURGE_MAX:
                break
        return total


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(addresses: list[tuple[str, int]], auth: StoreAuth, config: MaintenanceConfig) -> None:
    raft = RaftClient(addresses, auth=auth, attempt_timeout_s=1.0, deadline_s=5.0)
    driver = MaintenanceDriver(QueueClient(raft, coalesce=False), config)
    try:
        await driver.run()
    finally:
        await raft.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queues.maintenance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--addresses", required=True, help="host:port,host:port,...")
    parser.add_argument("--expire-every-ms", type=float, default=150.0)
    parser.add_argument("--purge-every-s", type=float, default=60.0)
    raft_cli.add_auth_arguments(parser)
    args = parser.parse_args(argv)
    try:
        auth = raft_cli.store_auth(args)
    except raft_cli.UsageError as error:
        parser.error(str(error))
    configure_logging("warning")
    config = MaintenanceConfig(expire_every_s=args.expire_every_ms / 1000, purge_every_s=args.purge_every_s)
    try:
        config.validate()
    except ValueError as error:
        parser.error(str(error))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main([_address(a) for a in args.addresses.split(",") if a], auth, config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
