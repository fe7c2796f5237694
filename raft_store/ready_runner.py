"""The Ready runner: what a node does with each Ready of the core, with every effect behind a port.

The production node (node.py) and both simulators (raft_store/simulation, queues/simulation) run
this one object, so the seeds exercise the node's own pipelines: the order of a Ready's parts,
group commit (everything that arrived while the previous write ran goes into the next one, one
fsync for all), messages held back until what they promise is durable, committed entries applied
while the log is still being written, reads answered between applies, the idle commit of a
group-committing machine, and a snapshot installed only once both pipelines are drained.

The runner itself does no I/O, reads no clock and starts no thread. It is driven by callbacks:
`pump()` handles the Readies the core has, and each port calls back when its work completes.
- `Storage` writes (entries, hard state; fsynced when a Ready must sync) and installs snapshots;
- `Applier` applies committed entries to the machine and answers whoever waits for them;
- `Reader` turns read states into reads due and hands out read jobs;
- `Lane`s run a blocking job in order and call back (the node: the WAL and apply threads, with
  their completions back on the event loop; a simulator: events at simulated times);
- `Effects` sends messages, arms timers, starts snapshots, reports failures.
Small writes and applies run inline (cheaper than a thread hop) when nothing else holds the disk
or the machine; the thresholds are configuration, so a simulator can draw either path.

Must never: send a message before the write it depends on is durable; hand the machine to two
jobs at once (apply, read job, commit, snapshot, install); install a snapshot while a write or an
apply is in flight; keep running after a storage failure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from raft_store.core import RaftCore, Ready
from raft_store.types import Entry, Message, ReadState, Role, Snapshot

T = TypeVar("T")
Results = list[list[bytes] | None]
"""Per applied entry: the machine's answers to its commands, or None (no-op, replayed, config)."""


class Lane(Protocol):
    """Runs jobs one at a time, in submission order, and reports each through `done` (called
    with a function that returns the job's result or raises its exception)."""

    def submit(self, job: Callable[[], T], done: Callable[[Callable[[], T]], None]) -> None: ...


class Storage(Protocol):
    def persist(self, batch: list[Ready]) -> None:
        """One write per Ready's entries and hard state, then one fsync if any must sync (group
        commit). Runs on the disk lane or inline."""

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the machine's state and the log by a received snapshot (on the disk lane, with
        the machine held: nothing else touches it meanwhile)."""


class Applier(Protocol):
    def apply(self, entries: list[Entry]) -> Results:
        """Apply committed entries to the machine (on the machine lane or inline)."""

    def applied(self, entries: list[Entry], results: Results) -> None:
        """Back on the runner's side: answer whoever waits for these entries."""

    def uncommitted(self) -> bool:
        """A group-committing machine holds applied but uncommitted state."""

    def commit(self) -> None:
        """Commit that state (on the machine lane)."""


ReadJob = tuple[Callable[[], T], Callable[[Callable[[], T]], None]]
"""(the job that reads the machine on the machine lane, what answers its readers afterwards)."""


class Reader(Protocol):
    def read_state(self, state: ReadState) -> None:
        """The core confirmed a read index: its reads are due once it has applied."""

    def pending(self) -> bool:
        """Reads are waiting (due or not)."""

    def take(self, applied: int) -> ReadJob[Any] | None:
        """One job for the reads due at `applied`, or None."""


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Effects(Protocol):
    def send(self, m: Message) -> None: ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Cancellable: ...

    def take_snapshot(self) -> None:
        """Compact the log: start a snapshot (the runner's `snapshotting` is already set; the
        effect clears it through `snapshot_done` when it ends, however it ends)."""

    def fail(self, exc: BaseException) -> None:
        """Storage failed or the machine raised: stop the node."""

    def wake(self) -> None:
        """Something completed: the owner should step its inputs and pump again."""

    def observe_fsync(self, entries: int, started: float) -> None: ...

    def now(self) -> float:
        """A monotonic reading in seconds, for the fsync metric."""


INLINE_PERSIST_BYTES_MAX = 32 << 10
INLINE_APPLY_BYTES_MAX = 64 << 10
APPLY_BATCH_BYTES_MAX = 1 << 20
"""Why a bound: a follower applying in the background takes what committed meanwhile in one job,
up to its whole lag (64 entries of 1,000 commands when batches are enqueued), and a job holds all
its decoded commands and results at once; and a group-committing machine commits only between
jobs (the queue's store once its group has grown past its rows limit), so the group grew by the
whole job. Both stayed in the process's memory (docs/benchmarks.md, "a follower's lag and
memory bounded").
1 MiB is a few thousand small commands: the leader's applies at full load stay whole."""
FOLLOWER_INLINE_PERSIST_BYTES_MAX = 1 << 20
"""A follower's inline limit for writes on a node: nothing its loop would do meanwhile has to go
before the write (it acknowledges entries once durable, and entries that arrive during the fsync
are written together next), so the hand-off to the WAL thread and back is all the thread would
add. The leader keeps INLINE_PERSIST_BYTES_MAX: its loop has acknowledgements to count and
proposals to take while it writes (docs/benchmarks.md, "a follower writes inline")."""
FOLLOWER_INLINE_APPLY_BYTES_MAX = 4 << 10
"""A follower's inline limit on a node (docs/raft.md, "A follower applies in the background"): a
few commands, whose apply costs less than the hand-off to the apply thread and back."""


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    inline_persist_bytes_max: int = INLINE_PERSIST_BYTES_MAX
    """A batch of writes this small is written (and fsynced) inline: cheaper than the hand-off to
    the WAL thread and back (measured: ~60 us of CPU and a GIL round trip). -1: never."""
    follower_inline_persist_bytes_max: int | None = None
    """The same for a node that is not the leader (None: `inline_persist_bytes_max`)."""
    inline_apply_bytes_max: int = INLINE_APPLY_BYTES_MAX
    """A batch of committed entries this small is applied inline. -1: never."""
    follower_inline_apply_bytes_max: int = INLINE_APPLY_BYTES_MAX
    """The same for a node that is not the leader (-1: never). A follower's apply is off the commit
    path (it acknowledges entries once durable, and nobody waits for its answers), so only an apply
    cheaper than the hand-off should hold the loop that writes and acknowledges the next entries;
    the node runs the machine lane at background priority while it follows (node.py)."""
    apply_batch_bytes_max: int = APPLY_BATCH_BYTES_MAX
    """At most this many bytes of committed entries in one apply (at least one entry): a follower
    that fell behind applies its backlog in steps, not in one job as large as its lag."""
    idle_commit_s: float = 0.05
    """A group-committing machine with applied but uncommitted entries is committed once its apply
    pipeline has been idle this long: no apply in the last `idle_commit_s` (under load, light or
    heavy, it commits by size, on the machine lane; a commit every interval of a steady light load
    cost two thread hops and the group's page writes per interval)."""
    snapshot_every_entries: int = 0
    """Compact once this many entries applied since the last snapshot (0: never by count)."""
    snapshot_every_bytes: int = 0
    """... or this many bytes of entries (0: never by size)."""

    def persist_inline_max(self, *, leader: bool) -> int:
        follower = self.follower_inline_persist_bytes_max
        return self.inline_persist_bytes_max if leader or follower is None else follower

    def apply_inline_max(self, *, leader: bool) -> int:
        return self.inline_apply_bytes_max if leader else self.follower_inline_apply_bytes_max


class ReadyRunner:
    def __init__(
        self, core: RaftCore, config: RunnerConfig, *, storage: Storage, applier: Applier, reader: Reader,
        disk: Lane, machine: Lane, effects: Effects,
    ) -> None:  # fmt: skip
        self.core = core
        self.config = config
        self._storage = storage
        self._applier = applier
        self._reader = reader
        self._disk = disk
        self._machine = machine
        self._effects = effects
        self._persist_queue: list[Ready] = []
        self._persist_running = False
        self._apply_queue: list[list[Entry]] = []
        self.apply_running = False
        """An apply, a commit or a snapshot install has the machine (or is queued on its lane
        behind a read job): the machine is not the owner's to use."""
        self.reading = False
        """A read job is on the machine lane: no inline apply, no second read job."""
        self.snapshotting = False
        """A snapshot is being taken: no inline write or apply, no second snapshot."""
        self.stopping = False
        self._held: Ready | None = None
        """A Ready with a snapshot to install, waiting for both pipelines to drain."""
        self._installing = False
        self._idle_commit: Cancellable | None = None
        self._applied_since_armed = False
        """An apply ended since the idle commit's timer was armed: the pipeline was not idle."""
        self._bytes_since_snapshot = 0
        self.unapplied_bytes = 0
        """Bytes of the committed entries handed to the runner and not yet applied: with the count of
        entries, how far behind the applies are (a follower's lag bound, node.py)."""

    # ---- the Readies ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """The machine is in use on its lane right now (a loop query must not touch it)."""
        return self.apply_running or self.reading

    @property
    def idle(self) -> bool:
        """Nothing written, applied, read or installed is in flight."""
        return not (
            self._persist_running or self._persist_queue or self.apply_running or self._apply_queue
            or self.reading or self._installing or self._held is not None
        )  # fmt: skip

    def pump_one(self) -> bool:
        """Handle the next Ready, if the core has one and no snapshot install holds the runner."""
        if self.stopping or self._held is not None or self._installing or not self.core.has_ready():
            return False
        self._handle(self.core.ready())
        return True

    def pump(self) -> None:
        while self.pump_one():
            pass

    def _handle(self, rd: Ready) -> None:
        """Dispatch one Ready without waiting for its I/O: writes and applies run on their lanes,
        in order, and report back through callbacks."""
        for m in rd.early_messages:
            self._effects.send(m)
        if rd.snapshot is not None:
            self._held = rd
            self._install_when_drained()
            return
        self._dispatch(rd)

    def _dispatch(self, rd: Ready) -> None:
        for state in rd.read_states:
            self._reader.read_state(state)
        if rd.hard_state is not None and not rd.must_sync and not rd.entries:
            # Only the commit index moved: it is volatile in Raft (relearned from the leader,
            # and the machine's applied index survives), so it rides along with the next write.
            rd.hard_state = None
        if rd.entries or rd.hard_state is not None or rd.messages:
            if rd.entries or rd.hard_state is not None or self._persist_queue or self._persist_running:
                self._persist_queue.append(rd)
                self._kick_persist()
            else:
                for m in rd.messages:  # nothing to write and nothing in flight: safe now
                    self._effects.send(m)
        if rd.committed:
            self.unapplied_bytes += sum(len(e.data) for e in rd.committed)
            self._apply_queue.append(rd.committed)
            self._kick_apply()

    # ---- snapshot install -----------------------------------------------------------------
    def _install_when_drained(self) -> None:
        rd = self._held
        if rd is None or self._installing or self.stopping:
            return
        if self._persist_running or self._persist_queue or self.apply_running or self._apply_queue:
            return
        if self.reading or self.snapshotting:
            return
        assert rd.snapshot is not None
        self._installing = True
        self.apply_running = True  # the install replaces the machine's state: nobody else uses it
        self._disk.submit(functools.partial(self._storage.install_snapshot, rd.snapshot), self._installed)

    def _installed(self, result: Callable[[], None]) -> None:
        self._installing = False
        self.apply_running = False
        rd, self._held = self._held, None
        if self._failed(result) or rd is None:
            return
        self._dispatch(rd)
        self._effects.wake()

    def _progress(self) -> None:
        """A pipeline step completed: a held install may now go ahead."""
        if self._held is not None:
            self._install_when_drained()

    # ---- writes -----------------------------------------------------------------------------
    def _kick_persist(self) -> None:
        if self._persist_running or not self._persist_queue or self.stopping:
            return
        batch, self._persist_queue = self._persist_queue, []
        self._persist_running = True
        started = self._effects.now()
        size = sum(len(e.data) for rd in batch for e in rd.entries)
        # (Never inline while a snapshot compacts the log on the disk lane: one writer at a time.)
        if not self.snapshotting and size <= self.config.persist_inline_max(leader=self.core.role is Role.LEADER):
            # (On the leader its appends are already sent, so followers fsync in parallel with it.)
            try:
                self._storage.persist(batch)
            except Exception as exc:
                self._persisted(_raising(exc), batch, started)
                return
            self._persisted(_returning(None), batch, started)
            return
        self._disk.submit(functools.partial(self._storage.persist, batch),
                          lambda result: self._persisted(result, batch, started))  # fmt: skip

    def _persisted(self, result: Callable[[], None], batch: list[Ready], started: float) -> None:
        self._persist_running = False
        if self._failed(result):
            return
        if any(rd.must_sync for rd in batch):
            self._effects.observe_fsync(sum(len(rd.entries) for rd in batch), started)
        for rd in batch:
            for m in rd.messages:
                self._effects.send(m)
            self.core.on_persisted(rd)
        self._kick_persist()
        self._progress()
        self._effects.wake()

    # ---- applies ----------------------------------------------------------------------------
    def _kick_apply(self) -> None:
        if self.apply_running or not self._apply_queue or self.stopping or self._installing:
            return
        batch, size = self._take_apply_batch()
        inline = not self.snapshotting and not self.reading
        if inline and size <= self.config.apply_inline_max(leader=self.core.role is Role.LEADER):
            # A small batch costs less to apply here than a round trip through the machine lane;
            # nothing else touches the machine meanwhile (no snapshot, no read job). During a
            # read job the batch queues behind it on the machine lane instead.
            try:
                results = self._applier.apply(batch)
            except Exception as exc:
                self._effects.fail(exc)
                return
            self._after_apply(batch, results)
            return
        self.apply_running = True
        self._machine.submit(functools.partial(self._applier.apply, batch), lambda r: self._applied(r, batch))

    def _take_apply_batch(self) -> tuple[list[Entry], int]:
        """The next committed entries to apply, in order, and their bytes: all that wait, or as many
        as fit `apply_batch_bytes_max` (at least one)."""
        cap = self.config.apply_batch_bytes_max
        queue = self._apply_queue
        batch: list[Entry] = []
        size = 0
        for taken, committed in enumerate(queue):  # `taken`: the whole lists before this one
            for i, entry in enumerate(committed):
                if batch and size + len(entry.data) > cap:
                    queue[taken] = committed[i:]
                    del queue[:taken]
                    return batch, size
                batch.append(entry)
                size += len(entry.data)
        queue.clear()
        return batch, size

    def _applied(self, result: Callable[[], Results], batch: list[Entry]) -> None:
        self.apply_running = False
        if self._failed(result):
            return
        self._after_apply(batch, result())

    def _after_apply(self, batch: list[Entry], results: Results) -> None:
        core = self.core
        self._applier.applied(batch, results)
        core.on_applied(batch[-1].index, batch)
        # Reads that waited for this apply go first; entries committed meanwhile queue behind
        # them on the machine lane, so neither starves the other under load.
        self.serve_reads()
        self._kick_apply()
        self._applied_since_armed = True
        self._arm_idle_commit()
        size = sum(len(e.data) for e in batch)
        self.unapplied_bytes -= size
        self._bytes_since_snapshot += size
        every, every_bytes = self.config.snapshot_every_entries, self.config.snapshot_every_bytes
        if not self.snapshotting and (
            (every and core.log.applied - core.log.snapshot_index >= every)
            or (every_bytes and self._bytes_since_snapshot >= every_bytes)
        ):
            self._bytes_since_snapshot = 0
            self.snapshotting = True
            self._effects.take_snapshot()
        self._progress()
        self._effects.wake()

    def snapshot_done(self) -> None:
        """The snapshot `Effects.take_snapshot` started has ended (taken, skipped or failed)."""
        self.snapshotting = False
        self._kick_persist()
        self._kick_apply()
        self._progress()

    # ---- group commit -----------------------------------------------------------------------
    def _arm_idle_commit(self) -> None:
        if self._idle_commit is None and not self.busy and self._applier.uncommitted():
            self._applied_since_armed = False
            self._idle_commit = self._effects.call_later(self.config.idle_commit_s, self._commit_if_idle)

    def _commit_if_idle(self) -> None:
        self._idle_commit = None
        if self.stopping or not self._applier.uncommitted():
            return
        if self.apply_running or self._apply_queue or self.reading or self._applied_since_armed:
            self._arm_idle_commit()  # busy again: the machine lane commits by size meanwhile
            return
        self.apply_running = True  # the commit runs on the machine lane, one user at a time

        def done(result: Callable[[], None]) -> None:
            self.apply_running = False
            if not self._failed(result):
                self._kick_apply()
                self.serve_reads()
                self._progress()

        self._machine.submit(self._applier.commit, done)

    # ---- reads between applies --------------------------------------------------------------
    def serve_reads(self) -> None:
        """Answer the reads whose read index is applied, in one job on the machine lane: a query is
        serialized with applies (it sees one applied state) while the owner's loop goes on."""
        if not self._reader.pending() or self.apply_running or self.reading or self.stopping:
            return
        if self._held is not None:
            return  # the install goes first; the reads then see the installed state
        job = self._reader.take(self.core.log.applied)
        if job is None:
            return
        read, finish = job
        self.reading = True

        def done(result: Callable[[], object]) -> None:
            self.reading = False
            finish(result)
            # What a job left unanswered went back first in line; reads that arrived meanwhile
            # are served by the next job too, after any apply queued behind this one.
            self.serve_reads()
            self._kick_apply()
            self._arm_idle_commit()
            self._progress()
            self._effects.wake()

        self._machine.submit(read, done)

    # ---- failure and stop -------------------------------------------------------------------
    def _failed(self, result: Callable[[], object]) -> bool:
        """A pipeline step that failed stops the node (storage errors are never retried)."""
        try:
            result()
        except Exception as exc:
            self._effects.fail(exc)
            return True
        return False

    def stop(self) -> None:
        self.stopping = True
        if self._idle_commit is not None:
            self._idle_commit.cancel()
            self._idle_commit = None


def _returning(value: T) -> Callable[[], T]:
    return lambda: value


def _raising(exc: BaseException) -> Callable[[], None]:
    def result() -> None:
        raise exc

    return result
