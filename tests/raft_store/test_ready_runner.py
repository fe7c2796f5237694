"""The Ready runner's contract, one rule at a time, on a real core with ports the test completes by hand.

The simulations exercise the runner under random interleavings; these pin the rules the node's
throughput and safety rely on, so a regression names the rule it broke.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from raft_store import ready_runner
from raft_store.core import Config, RaftCore, Ready, Recovered, Role
from raft_store.ready_runner import ReadJob, ReadyRunner, Results, RunnerConfig
from raft_store.types import ConfState, Entry, EntryKind, Message, MessageType, ReadState, Snapshot, SnapshotMeta


class ManualLane:
    """Jobs wait until the test completes them, in order."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Callable[[Callable[[], Any]], None]]] = []

    def submit(self, job: Callable[[], Any], done: Callable[[Callable[[], Any]], None]) -> None:
        self.jobs.append((job, done))

    def complete(self) -> None:
        job, done = self.jobs.pop(0)
        value = job()
        done(lambda: value)


class Ports:
    def __init__(self) -> None:
        self.batches: list[list[Ready]] = []
        self.applied: list[int] = []
        self.sent: list[Message] = []
        self.reads: list[ReadState] = []
        self.read_jobs = 0
        self.answered = 0
        self.failures: list[BaseException] = []

    def persist(self, batch: list[Ready]) -> None:
        self.batches.append(batch)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        raise AssertionError("no snapshot in these tests")

    def apply(self, entries: list[Entry]) -> Results:
        self.applied += [e.index for e in entries]
        return [[] for _ in entries]

    def applied_(self, entries: list[Entry], results: Results) -> None:
        pass

    def read_state(self, state: ReadState) -> None:
        self.reads.append(state)

    def pending(self) -> bool:
        return bool(self.reads)

    def take(self, applied: int) -> ReadJob[Any] | None:
        if not self.reads:
            return None
        self.reads = []

        def job() -> int:
            self.read_jobs += 1
            return applied

        def finish(result: Callable[[], Any]) -> None:
            self.answered += 1

        return job, finish

    def uncommitted(self) -> bool:
        return False

    def commit(self) -> None:
        pass

    def send(self, m: Message) -> None:
        self.sent.append(m)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Any:
        raise AssertionError("no idle commit in these tests")

    def take_snapshot(self) -> None:
        raise AssertionError("no snapshot in these tests")

    def fail(self, exc: BaseException) -> None:
        self.failures.append(exc)

    def wake(self) -> None:
        pass

    def observe_fsync(self, entries: int, started: float) -> None:
        pass

    def now(self) -> float:
        return 0.0


class _Applier:
    def __init__(self, ports: Ports) -> None:
        self.ports = ports

    def apply(self, entries: list[Entry]) -> Results:
        return self.ports.apply(entries)

    def applied(self, entries: list[Entry], results: Results) -> None:
        self.ports.applied_(entries, results)

    def uncommitted(self) -> bool:
        return False

    def commit(self) -> None:
        pass


def _runner(**config: Any) -> tuple[ReadyRunner, Ports, ManualLane, ManualLane]:
    conf = ConfState(voters=frozenset({1}))
    core = RaftCore(Config(node_id=1), Recovered(snapshot=SnapshotMeta(0, 0, conf)), random.Random(1))
    ports, disk, machine = Ports(), ManualLane(), ManualLane()
    runner = ReadyRunner(core, RunnerConfig(**config), storage=ports, applier=_Applier(ports), reader=ports,
                         disk=disk, machine=machine, effects=ports)  # fmt: skip
    return runner, ports, disk, machine


def _lead(runner: ReadyRunner, disk: ManualLane) -> None:
    runner.core.campaign()
    runner.pump()
    while disk.jobs:
        disk.complete()
        runner.pump()
    assert runner.core.role is Role.LEADER


def test_writes_arriving_during_a_write_share_the_next_one() -> None:
    runner, ports, disk, _ = _runner(inline_persist_bytes_max=-1)
    _lead(runner, disk)
    before = len(ports.batches)
    for value in (b"a", b"b", b"c"):
        runner.core.propose(value)
        runner.pump()
    assert len(disk.jobs) == 1, "one write at a time"
    disk.complete()  # the first proposal's write; the other two waited
    runner.pump()
    disk.complete()
    runner.pump()
    sizes = [sum(len(rd.entries) for rd in batch) for batch in ports.batches[before:]]
    assert sizes == [1, 2], f"the two proposals that waited are one write: {sizes}"
    assert not ports.failures


def test_entries_apply_only_once_durable_on_a_single_voter() -> None:
    runner, ports, disk, _ = _runner(inline_persist_bytes_max=-1)
    _lead(runner, disk)
    index = runner.core.propose(b"x")
    runner.pump()
    assert index not in ports.applied
    disk.complete()
    runner.pump()
    assert index in ports.applied


def test_an_apply_committed_during_a_read_job_queues_behind_it() -> None:
    runner, ports, disk, machine = _runner(inline_persist_bytes_max=-1)
    _lead(runner, disk)
    ports.reads.append(ReadState(index=runner.core.log.applied, context=b"r"))
    runner.serve_reads()
    assert runner.reading and len(machine.jobs) == 1
    index = runner.core.propose(b"x")
    runner.pump()
    disk.complete()  # durable and committed: the apply must not run inline beside the read job
    runner.pump()
    assert index not in ports.applied and len(machine.jobs) == 2
    machine.complete()  # the read job
    assert ports.answered == 1 and index not in ports.applied
    machine.complete()  # then the apply
    assert index in ports.applied
    assert runner.core.log.entry(index).kind is EntryKind.NORMAL


def _follower(**config: Any) -> tuple[ReadyRunner, Ports, ManualLane, ManualLane]:
    """Node 2 of three, following node 1 in term 1, with entries 1-2 durable and 1 committed."""
    conf = ConfState(voters=frozenset({1, 2, 3}))
    core = RaftCore(Config(node_id=2), Recovered(snapshot=SnapshotMeta(0, 0, conf)), random.Random(1))
    ports, disk, machine = Ports(), ManualLane(), ManualLane()
    runner = ReadyRunner(core, RunnerConfig(**config), storage=ports, applier=_Applier(ports), reader=ports,
                         disk=disk, machine=machine, effects=ports)  # fmt: skip
    entries = tuple(Entry(term=1, index=i, kind=EntryKind.NORMAL, data=b"x") for i in (1, 2))
    core.step(Message(MessageType.APP, to=2, frm=1, term=1, entries=entries, commit=1))
    runner.pump()
    assert core.role is Role.FOLLOWER and core.log.committed == 1
    return runner, ports, disk, machine


@pytest.mark.parametrize(
    "limit", [ready_runner.INLINE_APPLY_BYTES_MAX, ready_runner.FOLLOWER_INLINE_APPLY_BYTES_MAX, 0, -1]
)
def test_a_follower_applies_inline_only_below_its_own_limit(limit: int) -> None:
    """A follower's apply larger than `follower_inline_apply_bytes_max` goes to the machine lane
    (which the node runs at background priority), not on the loop that writes and acknowledges the
    next entries; one within it runs inline. The committed entry here is one byte."""
    runner, ports, _, machine = _follower(follower_inline_apply_bytes_max=limit)
    if limit >= 1:
        assert ports.applied == [1] and not machine.jobs
    else:
        assert ports.applied == [] and len(machine.jobs) == 1 and runner.apply_running
        machine.complete()
        assert ports.applied == [1] and not runner.apply_running
    assert any(m.type is MessageType.APP_RESP and m.index == 2 for m in ports.sent), "acknowledged either way"
    assert not ports.failures


@pytest.mark.parametrize("limit", [None, -1, 999, 1000, ready_runner.FOLLOWER_INLINE_PERSIST_BYTES_MAX])
def test_a_follower_writes_inline_only_within_its_own_limit(limit: int | None) -> None:
    """`follower_inline_persist_bytes_max` (None: the leader's, here -1, never inline): an append
    within it is written and acknowledged in the same turn, a larger one goes to the disk lane and
    is acknowledged only once that write is done. The appended entry is 1,000 bytes."""
    runner, ports, disk, _ = _follower(inline_persist_bytes_max=-1, follower_inline_persist_bytes_max=limit)
    while disk.jobs:  # the helper's own entries
        disk.complete()
        runner.pump()
    entries = (Entry(term=1, index=3, kind=EntryKind.NORMAL, data=b"y" * 1000),)
    runner.core.step(Message(MessageType.APP, to=2, frm=1, term=1, index=2, log_term=1, entries=entries, commit=1))
    runner.pump()

    def acknowledged() -> bool:
        return any(m.type is MessageType.APP_RESP and m.index == 3 for m in ports.sent)

    if limit is not None and limit >= 1000:
        assert not disk.jobs and acknowledged()
    else:
        assert len(disk.jobs) == 1 and not acknowledged(), "never acknowledged before it is durable"
        disk.complete()
        runner.pump()
        assert acknowledged()
    assert runner.core.log.last_index() == 3 and not ports.failures


def test_the_leader_keeps_its_own_write_limit_beside_a_larger_followers() -> None:
    runner, ports, disk, _ = _runner(inline_persist_bytes_max=-1, follower_inline_persist_bytes_max=1 << 20)
    _lead(runner, disk)
    index = runner.core.propose(b"x")
    runner.pump()
    assert len(disk.jobs) == 1 and index not in ports.applied
    disk.complete()
    runner.pump()
    assert index in ports.applied and not ports.failures


def test_the_runner_counts_the_bytes_committed_and_not_yet_applied() -> None:
    """What a follower's lag bound reads (node.py, `applies_in_background`): the bytes of the
    entries committed and handed to the runner, until their apply has ended."""
    runner, ports, disk, machine = _follower(follower_inline_apply_bytes_max=-1)
    assert runner.unapplied_bytes == 1 and len(machine.jobs) == 1  # entry 1, one byte, on the lane
    entries = (Entry(term=1, index=3, kind=EntryKind.NORMAL, data=b"y" * 1000),)
    runner.core.step(Message(MessageType.APP, to=2, frm=1, term=1, index=2, log_term=1, entries=entries, commit=3))
    runner.pump()
    while disk.jobs:
        disk.complete()
        runner.pump()
    assert runner.core.log.committed == 3 and runner.unapplied_bytes == 1 + 1 + 1000
    machine.complete()  # entry 1; entries 2 and 3 were queued behind it and go next, together
    assert ports.applied == [1] and runner.unapplied_bytes == 1001 and len(machine.jobs) == 1
    machine.complete()
    assert ports.applied == [1, 2, 3] and runner.unapplied_bytes == 0
    assert not ports.failures


def test_an_apply_takes_at_most_its_bytes_bound_of_what_waits_and_at_least_one_entry() -> None:
    """`apply_batch_bytes_max`: a follower behind by many entries applies them in steps, in order."""
    runner, ports, disk, machine = _follower(follower_inline_apply_bytes_max=-1, apply_batch_bytes_max=1000)
    machine.complete()  # entry 1
    sizes = {3: 400, 4: 400, 5: 400, 6: 1500, 7: 10}
    entries = tuple(Entry(term=1, index=i, kind=EntryKind.NORMAL, data=b"y" * n) for i, n in sizes.items())
    runner.core.step(Message(MessageType.APP, to=2, frm=1, term=1, index=2, log_term=1, entries=entries, commit=7))
    runner.pump()
    while disk.jobs:
        disk.complete()
        runner.pump()
    jobs = []
    while machine.jobs:
        before = len(ports.applied)
        machine.complete()
        jobs.append(ports.applied[before:])
    # Entry 2 (durable already) committed first, alone; then 400+400 fit 1000, a third 400 does
    # not; 1500 goes alone although above the bound; 1500+10 do not fit either.
    assert jobs == [[2], [3, 4], [5], [6], [7]]
    assert runner.unapplied_bytes == 0 and not ports.failures


def test_the_leader_applies_small_batches_inline_whatever_followers_do() -> None:
    runner, ports, disk, machine = _runner(inline_persist_bytes_max=-1, follower_inline_apply_bytes_max=-1)
    _lead(runner, disk)
    index = runner.core.propose(b"x")
    runner.pump()
    disk.complete()
    runner.pump()
    assert index in ports.applied and not machine.jobs


class _Timers(Ports):
    """Ports whose timers are fired by hand, with a group-committing machine."""

    def __init__(self) -> None:
        super().__init__()
        self.timers: list[Callable[[], None]] = []
        self.open_group = False
        self.commits = 0

    def apply(self, entries: list[Entry]) -> Results:
        self.open_group = True
        return super().apply(entries)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Any:
        self.timers.append(callback)
        return _NoCancel()

    def fire(self) -> None:
        timers, self.timers = self.timers, []
        for callback in timers:
            callback()


class _NoCancel:
    def cancel(self) -> None:
        pass


class _GroupApplier(_Applier):
    ports: _Timers

    def uncommitted(self) -> bool:
        return self.ports.open_group

    def commit(self) -> None:
        self.ports.open_group = False
        self.ports.commits += 1


def test_the_idle_commit_waits_until_no_apply_ended_for_its_interval() -> None:
    conf = ConfState(voters=frozenset({1}))
    core = RaftCore(Config(node_id=1), Recovered(snapshot=SnapshotMeta(0, 0, conf)), random.Random(1))
    ports, disk, machine = _Timers(), ManualLane(), ManualLane()
    runner = ReadyRunner(core, RunnerConfig(), storage=ports, applier=_GroupApplier(ports), reader=ports,
                         disk=disk, machine=machine, effects=ports)  # fmt: skip
    _lead(runner, disk)
    for value in (b"a", b"b", b"c"):  # a steady light load: an apply in every interval
        runner.core.propose(value)
        runner.pump()
        assert len(ports.timers) <= 1, "one idle-commit timer at a time"
        ports.fire()
        assert not machine.jobs and ports.commits == 0, "no commit while applies keep coming"
    ports.fire()  # an interval with no apply: now the group commits, on the machine lane
    assert len(machine.jobs) == 1
    machine.complete()
    assert ports.commits == 1 and not ports.open_group and not ports.failures
