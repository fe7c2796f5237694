"""The production node's ports of the Ready runner (ready_runner.py): threads, the WAL, a machine.

A `ThreadLane` is one worker thread whose completions come back on the event loop (the WAL
thread, the apply thread). `WalStorage` writes Readies to the WAL with one fsync per batch and
installs received snapshots. `MachineApplier` applies committed entries to a `StateMachine`
exactly as every replica must: the leader's stamped clock, no-op for an entry that does not parse,
`note_applied` for configuration entries and for entries a restart replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from raft_store.core import Ready
from raft_store.log_context import GROUP
from raft_store.metrics import NodeMetrics
from raft_store.node_clock import NodeClock
from raft_store.ready_runner import Results, _raising, _returning
from raft_store.state_machine import BatchFormatError, GroupCommittingMachine, StateMachine, decode_batch
from raft_store.types import Entry, EntryKind, Snapshot
from raft_store.wal import Wal

log = logging.getLogger("raft_store.node")
T = TypeVar("T")


class ThreadLane:
    """Jobs one at a time, in submission order, on a thread; `done` runs on the loop that
    submitted. A job whose loop has closed when it ends reports nothing.

    A job hands its result straight to the loop (`call_soon_threadsafe`), without the executor's
    futures: a concurrent Future wrapped in an asyncio Future cost a lock, two futures, their
    callbacks and one more loop turn per job, paid by every write and apply handed to a thread.

    `set_background(True)` runs the jobs submitted from then on at the lowest priority (Linux's
    SCHED_IDLE: the thread gets a core only when nothing of normal priority wants it). A thread
    that has lowered its priority may not raise it again without privilege (sched(7)), so the lane
    keeps a thread per priority, each started when first needed (from the caller's thread, whose
    priority a new thread inherits) and kept: a change hands the queue over, the thread that takes
    over waiting until the other has run everything it was given. A thread per change instead cost
    a follower memory: by a run with one malloc arena, each new thread's arena kept what was freed
    in it (docs/benchmarks.md, "a follower's lag and memory bounded")."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: dict[bool, queue.SimpleQueue[_Item]] = {}
        self._threads: dict[bool, threading.Thread] = {}
        self._context: contextvars.Context | None = None
        self._closed = False
        self._background = False

    def submit(self, job: Callable[[], T], done: Callable[[Callable[[], T]], None]) -> None:
        if self._closed:
            raise RuntimeError(f"{self._name}: cannot run a job after shutdown")
        self._queue(self._background).put((job, done, asyncio.get_running_loop()))

    @property
    def background(self) -> bool:
        """The priority jobs submitted now run at (True: background)."""
        return self._background

    def set_background(self, background: bool) -> None:
        """The priority of the jobs submitted from now on (call from a thread of normal priority)."""
        if background is self._background or self._closed:
            return
        before, self._background = self._background, background
        if self._jobs:  # else the first job starts a thread at this priority
            handed = threading.Event()
            self._queue(before).put(_HandOver(handed))
            self._queue(background).put(_TakeOver(handed))

    async def run(self, job: Callable[[], T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def done(result: Callable[[], T]) -> None:
            if future.done():  # the awaiting task was cancelled meanwhile
                return
            try:
                future.set_result(result())
            except BaseException as exc:  # handed to whoever awaits the job
                future.set_exception(exc)

        self.submit(job, done)
        return await future

    def _queue(self, background: bool) -> queue.SimpleQueue[_Item]:
        """The queue of the thread of this priority, started if it is not yet."""
        jobs = self._jobs.get(background)
        if jobs is not None:
            return jobs
        if self._context is None:  # run in this context: a hosted replica's thread logs as its set's
            group = GROUP.get()
            self._name = f"{self._name} ({group})" if group else self._name
            self._context = contextvars.copy_context()
        jobs = self._jobs[background] = queue.SimpleQueue()
        thread = threading.Thread(
            target=self._context.copy().run, args=(self._work, jobs, background), daemon=True,
            name=f"{self._name} (background)" if background else self._name,
        )  # fmt: skip
        self._threads[background] = thread
        thread.start()
        return jobs

    def _work(self, jobs: queue.SimpleQueue[_Item], background: bool) -> None:
        if background:
            _lower_priority(self._name)
        while (item := jobs.get()) is not None:
            if isinstance(item, _HandOver):
                item.handed.set()  # every job before the change has run
                continue
            if isinstance(item, _TakeOver):
                item.handed.wait()
                continue
            job, done, loop = item
            result: Callable[[], Any]
            try:
                result = _returning(job())
            except BaseException as exc:  # reported through `done`, as the executor's future did
                result = _raising(exc)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to tell
                loop.call_soon_threadsafe(done, result)

    def shutdown(self) -> None:
        """Run what is queued, then end the lane's threads."""
        self._closed = True
        for jobs in self._jobs.values():
            jobs.put(None)
        for thread in self._threads.values():
            thread.join()


class _HandOver(NamedTuple):
    """Last of what a thread runs before the other takes over: it sets `handed`."""

    handed: threading.Event


class _TakeOver(NamedTuple):
    """First of what the other thread runs after a change: it waits for `handed`."""

    handed: threading.Event


def _lower_priority(name: str) -> None:
    """This thread at SCHED_IDLE; where the platform refuses, it goes on at normal priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError) as exc:  # not Linux, or a sandbox that forbids it
        global _WARNED
        if not _WARNED:
            _WARNED = True
            log.warning("%s: background priority not available (%s); running at normal priority", name, exc)


_WARNED = False


_Job = tuple[Callable[[], Any], Callable[[Callable[[], Any]], None], asyncio.AbstractEventLoop]
_Item = _Job | _HandOver | _TakeOver | None
"""A job, a change of thread (`ThreadLane.set_background`), or None: end."""


class WalStorage:
    def __init__(self, wal: Callable[[], Wal], install: Callable[[Snapshot], None]) -> None:
        self._wal = wal
        self._install = install

    def persist(self, batch: list[Ready]) -> None:
        """One write per Ready, one fsync for the whole batch (group commit)."""
        wal = self._wal()
        sync = False
        for rd in batch:
            if rd.entries:
                wal.append(rd.entries, rd.hard_state)  # one write for both
            elif rd.hard_state is not None:
                wal.set_hard_state(rd.hard_state)
            sync = sync or rd.must_sync
        if sync:
            wal.sync()

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self._install(snapshot)


class MachineApplier:
    def __init__(
        self, machine: StateMachine, clock: NodeClock, metrics: NodeMetrics, *,
        respond: Callable[[int], bool], answer: Callable[[list[Entry], Results], None],
    ) -> None:  # fmt: skip
        self.machine = machine
        self._group: GroupCommittingMachine | None = machine if isinstance(machine, GroupCommittingMachine) else None
        """The machine as a group-committing one, or None: checked once (a runtime Protocol check
        costs microseconds, and the runner asks after every apply)."""
        self._clock = clock
        self._metrics = metrics
        self._respond = respond
        """Whether this node has clients waiting for an entry's results (only its proposer does)."""
        self._answer = answer

    def apply(self, entries: list[Entry]) -> Results:
        out: Results = []
        machine = self.machine
        for entry in entries:
            if entry.index <= machine.applied_index():
                out.append(None)  # replayed after a restart: already in the machine's state
                continue
            if entry.kind is EntryKind.NORMAL:
                try:
                    now_ms, commands = decode_batch(entry.data)
                except BatchFormatError:
                    log.error("entry %d does not parse; applying it as a no-op", entry.index)
                    machine.note_applied(entry.index)
                    out.append(None)
                    continue
                result = machine.apply_batch(entry.index, now_ms, commands, respond=self._respond(entry.index))
                self._clock.committed(now_ms)
                out.append(result)
                self._metrics.applied_commands += len(commands)
            else:
                machine.note_applied(entry.index)
                out.append(None)
        return out

    def applied(self, entries: list[Entry], results: Results) -> None:
        self._answer(entries, results)

    def uncommitted(self) -> bool:
        return self._group is not None and self._group.uncommitted

    def commit(self) -> None:
        if self._group is not None:
            self._group.commit()
