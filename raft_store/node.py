"""The node: the Ready runner (ready_runner.py) given a real clock, disk, network and machine.

The node's turns own the core (a loop callback scheduled by `wake`, one at a time): a turn steps
ticks (when one is due, node_ticks.py), peer messages and client proposals into it, and hands each
Ready to the runner, which sends the leader's appends, writes and fsyncs the WAL on the WAL thread
(group commit: everything that arrived while the previous fsync ran goes into the next one), sends
replies once durable, applies committed commands on the apply thread (a follower's at background
priority: they are off the commit path, docs/raft.md), answers clients and serves reads between
applies (node_ports.py, node_proposals.py, node_reads.py). Client commands arriving
at the leader in one loop iteration share one log entry, one WAL record and one fsync. Snapshots,
made, shipped and received, are node_snapshots.py's.

Failure policy: a failed fsync or a corrupt WAL stops the node (never retried and ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from raft_store import codec
from raft_store.codec import FrameType
from raft_store.core import RaftCore, Role
from raft_store.files import make_private
from raft_store.metrics import NodeMetrics
from raft_store.node_clock import NodeClock
from raft_store.node_config import NodeConfig
from raft_store.node_ports import MachineApplier, ThreadLane, WalStorage
from raft_store.node_proposals import Proposals, Waiter, admin
from raft_store.node_reads import NodeReads
from raft_store.node_recovery import recover
from raft_store.node_snapshots import NodeSnapshots, NodeStopped
from raft_store.node_status import node_status
from raft_store.node_ticks import Ticks
from raft_store.ready_runner import (
    FOLLOWER_INLINE_APPLY_BYTES_MAX,
    FOLLOWER_INLINE_PERSIST_BYTES_MAX,
    ReadyRunner,
    RunnerConfig,
)
from raft_store.state_machine import ClockedMachine, GroupCommittingMachine, StateMachine
from raft_store.transport import ClientConnection, Transport, TransportConfig
from raft_store.types import Message, MessageType
from raft_store.wal import Wal

log = logging.getLogger("raft_store.node")

APPLY_BEHIND_MAX = 64
APPLY_BEHIND_BYTES_MAX = 16 << 20
"""How far a follower's applies may fall behind its commit index, in committed entries and in their
bytes, before they leave the background priority (they return to it once within a quarter of
both). A follower elected leader must apply all of it before it answers. At the queue's full load
on the benchmark machine (256 commands of 1 KiB an entry; one replica applies about 27 µs a
command) either bound is about 0.4 s of applying; there the followers kept 8-61 entries behind
(docs/benchmarks.md, "A follower applies in the background"). The bytes bound holds entries of
large commands (batch enqueues of 1,000 items, about 1 MiB each) to 16 of them instead of 64; the
entries bound holds entries of small ones (acks)."""


def applies_in_background(is_leader: bool, behind: int, behind_bytes: int, *, now: bool) -> bool:
    """Whether a node's applies run at background priority (ready_runner.py,
    `follower_inline_apply_bytes_max`): a follower's do, unless they fall more than
    `APPLY_BEHIND_MAX` committed entries or `APPLY_BEHIND_BYTES_MAX` bytes behind; then at normal
    priority until within a quarter of both (between the bounds, as `now`), so a follower that
    becomes leader never has much to apply before it can answer. A leader's never: its applies are
    on the commit path."""
    if is_leader or behind > APPLY_BEHIND_MAX or behind_bytes > APPLY_BEHIND_BYTES_MAX:
        return False
    return (behind <= APPLY_BEHIND_MAX // 4 and behind_bytes <= APPLY_BEHIND_BYTES_MAX // 4) or now


class Node:
    """The shell: the runner's effects on a real loop, WAL thread, apply thread and transport."""

    def __init__(self, config: NodeConfig, machine: StateMachine) -> None:
        config.validate()
        self.config = config
        self.machine = machine
        self.metrics = NodeMetrics()
        self.core: RaftCore | None = None
        self.runner: ReadyRunner | None = None
        self.clock = NodeClock(config.node_id, band_ms=2 * config.tick_ms * config.heartbeat_ticks)  # stamps, "now"
        if isinstance(machine, ClockedMachine):
            machine.use_clock(self.clock.read_ms)
        self.wal: Wal | None = None
        self.transport = Transport(
            config.node_id,
            config.listen,
            {n: a for n, a in config.peers.items() if n != config.node_id},
            self._on_peer_frame,
            self._on_client_frame,
            TransportConfig(cluster_id=config.cluster_id), auth=config.auth, refused=self.metrics.refused,
        )
        self.transport.on_unreachable = self._on_unreachable
        self._io = ThreadLane(f"wal-{config.node_id}")
        self._apply = ThreadLane(f"apply-{config.node_id}")
        self._inbox: deque[Message] = deque()
        self.proposals = Proposals(config, self.clock, self.metrics)
        self.reads = NodeReads(config.node_id, machine, self.metrics, self._serve_reads)
        self.snapshots = NodeSnapshots(
            config.node_id, config.data_dir, machine, self.metrics,
            io=self._io, apply=self._apply, restored=self._clock_from_machine, fail=self._fail,
        )  # fmt: skip
        self.snapshots.transport = self.transport
        self.snapshots.deliver = self._inbox.append
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turn_scheduled = False
        self._context = contextvars.Context()
        self._ticks = Ticks(config.tick_ms, self.wake)  # delivered when one is due (node_ticks.py)
        self._stopping = False
        self._failure: BaseException | None = None
        self._was_leader = False
        self.stopped = asyncio.Event()

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        make_private(self.config.data_dir)  # 0700 and 0600 throughout, also what older versions left
        core = await self._io.run(self._recover)
        self._wire(core)
        await self.transport.start()
        self._ticks.start()
        self._context = contextvars.copy_context()  # turns run in the node's context, not a waker's
        self._loop = loop
        self.wake()  # the first turn arms the timer of the first due tick

    def _wire(self, core: RaftCore) -> None:
        cfg = self.config
        applier = MachineApplier(
            self.machine, self.clock, self.metrics, respond=self.proposals.responds, answer=self.proposals.answer
        )
        storage = WalStorage(self._wal, self.snapshots.install)
        runner_config = RunnerConfig(
            follower_inline_apply_bytes_max=FOLLOWER_INLINE_APPLY_BYTES_MAX,
            follower_inline_persist_bytes_max=FOLLOWER_INLINE_PERSIST_BYTES_MAX,
            snapshot_every_entries=cfg.snapshot_every_entries, snapshot_every_bytes=cfg.snapshot_every_bytes,
        )  # fmt: skip
        self.runner = ReadyRunner(core, runner_config, storage=storage, applier=applier, reader=self.reads,
                                  disk=self._io, machine=self._apply, effects=self)  # fmt: skip
        self.core = self.proposals.core = self.reads.core = self.snapshots.core = core
        self.clock.follow_log(core.log)
        self.snapshots.wal = self.wal
        self.snapshots.runner = self.runner

    def _wal(self) -> Wal:
        assert self.wal is not None
        return self.wal

    def _recover(self) -> RaftCore:
        self.wal, core = recover(self.config, self.machine, self.snapshots, self.metrics, self._clock_from_machine)
        return core

    def _clock_from_machine(self) -> None:
        if isinstance(self.machine, ClockedMachine):  # the time its state reached: never read below
            self.clock.committed(self.machine.log_time_ms())

    async def stop(self) -> None:
        self._stopping = self.snapshots.stopping = True
        if self.runner is not None:
            self.runner.stop()
        self._ticks.stop()  # a turn already scheduled returns at once: the node is stopping
        await self.transport.close()
        self._fail_all_waiters()
        if self.wal is not None and self._failure is None:
            with contextlib.suppress(Exception):
                await self._io.run(self.wal.close)
        self._io.shutdown()
        self._apply.shutdown()
        self.snapshots.shutdown()
        if self._failure is None and isinstance(self.machine, GroupCommittingMachine):
            self.machine.commit()  # a clean stop leaves the store current (a crash would replay)
        self.stopped.set()

    @property
    def failure(self) -> BaseException | None:
        """What stopped the node (a storage failure, a corrupt log), or None."""
        return self._failure

    @property
    def apply_background(self) -> bool:
        """Whether its applies run at background priority now (`applies_in_background` above)."""
        return self._apply.background

    @property
    def applying(self) -> bool:
        """Whether the machine is in use on the apply thread right now (`query_applied` waits it out)."""
        return self.runner is not None and self.runner.busy

    def query_applied(self, query: bytes) -> bytes | None:
        """This replica's answer to `query` from its applied state, for callers on the node's own
        loop (its metrics endpoint), which cannot await the apply thread. None while an apply or a
        read job runs: the connection is then in use on the apply thread, and a caller must not
        wait on the loop for it (so under back-to-back slow client queries a scrape may find no
        gap and go without the machine's gauges)."""
        if self.applying:
            return None
        machine: Any = self.machine
        answer: bytes = machine.query(query)
        return answer

    def status(self) -> dict[str, Any]:
        """Role, term, indexes, follower progress, addresses, clock and metrics (node_status.py)."""
        return node_status(self)

    # ---- inputs -------------------------------------------------------------------------
    def _on_peer_frame(self, sender: int, ftype: FrameType, body: bytes) -> None:
        if ftype is FrameType.RAFT:
            m = codec.decode_message(body)
            if m.frm != sender or m.to != self.config.node_id:
                raise codec.CodecError(f"message from {m.frm} to {m.to} on {sender}'s connection")
            self.clock.heard(m)
            self._inbox.append(m)
        else:
            self.snapshots.receive_chunk(codec.decode_chunk(body))
        self.wake()

    def _on_client_frame(self, conn: ClientConnection, ftype: FrameType, body: bytes) -> None:
        if ftype is FrameType.PROPOSE:
            request = codec.decode_propose(body)
            self.proposals.take(Waiter(conn, request.request_id, len(request.commands)), request.commands)
        elif ftype is FrameType.READ:
            self.reads.client_read(conn, codec.decode_read(body))
        elif ftype is FrameType.STATUS:
            conn.send(FrameType.STATUS_RESULT, json.dumps(self.status()).encode())
        elif ftype is FrameType.ADMIN:
            assert self.core is not None
            admin(self.core, self.proposals, self.transport.add_peer, conn, body)
        else:
            raise codec.CodecError(f"client sent a {ftype.name} frame")
        self.wake()

    async def propose_local(self, commands: list[tuple[int, int, bytes]]) -> codec.Result:
        """Propose from inside the node's process (embedded use and tests)."""
        future: asyncio.Future[codec.Result] = asyncio.get_running_loop().create_future()
        self.proposals.take(Waiter(None, 0, len(commands), future), tuple(commands))
        self.wake()
        return await future

    # ---- the loop -----------------------------------------------------------------------
    def wake(self) -> None:
        """Something arrived or completed: one turn runs soon, however many wakes come before it.
        (A plain loop callback, not a task waiting on an `asyncio.Event`: an idle node runs a turn
        per heartbeat, and the event's future, its waiter list and the task's step cost more than
        the turn's own work there; see docs/raft.md, "An idle node's turn".)"""
        if not self._turn_scheduled and self._loop is not None and not self._stopping:
            self._turn_scheduled = True
            self._loop.call_soon(self._turn, context=self._context)

    def _turn(self) -> None:
        """One turn of the node: step what arrived into the core, hand each Ready to the runner,
        answer reads, arm the timer of the next due tick. Turns never overlap (one loop thread)."""
        self._turn_scheduled = False
        if self._stopping:
            return
        runner, core = self.runner, self.core
        assert runner is not None and core is not None
        try:
            if self._failure is not None:
                raise self._failure
            self._step_inputs()
            while not self._stopping and runner.pump_one():
                self._step_inputs()
            self._after_role_change()
            self._serve_reads()
            self._ticks.arm(core)
        except BaseException as exc:  # storage failure or a bug: stop, loudly
            self._fail(exc)

    def _step_inputs(self) -> None:
        core = self.core
        assert core is not None
        self._ticks.deliver(core)
        inbox = self._inbox
        while inbox:
            core.step(inbox.popleft())
        self.reads.request_read_index()
        wait_s = self.proposals.propose_pending()
        if wait_s is not None:
            asyncio.get_running_loop().call_later(wait_s, self.wake)

    def _serve_reads(self) -> None:
        if self.runner is not None:
            self.runner.serve_reads()

    def _after_role_change(self) -> None:
        core = self.core
        assert core is not None
        is_leader = core.role is Role.LEADER
        self.clock.set_role(is_leader, core.leader, core.conf.voters)
        if self._was_leader and not is_leader:
            # Entries we proposed may still commit under the next leader; clients retry with
            # the same session sequence numbers and get the stored result.
            self._fail_all_waiters()
        if not is_leader and self.reads.awaiting_index and core.leader == 0:
            self.reads.leader_lost()
        self._was_leader = is_leader
        assert self.runner is not None
        behind, behind_bytes = core.log.committed - core.log.applied, self.runner.unapplied_bytes
        self._apply.set_background(applies_in_background(is_leader, behind, behind_bytes, now=self._apply.background))

    def _fail_all_waiters(self) -> None:
        self.proposals.fail_all(self.core.leader if self.core is not None else 0)

    def _on_unreachable(self, peer: int) -> None:
        if self.core is not None:
            self.core.report_unreachable(peer)

    # ---- the runner's effects ---------------------------------------------------------------
    def send(self, m: Message) -> None:
        if m.type is MessageType.SNAP:
            self.snapshots.send(m)
            return
        wall, reading = self.clock.stamps()  # the leader learns its peers' clocks, a follower its reading
        self.transport.send(m.to, FrameType.RAFT, codec.encode_message(m, wall_ms=wall, clock_ms=reading))

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    def take_snapshot(self) -> None:
        asyncio.get_running_loop().create_task(self.snapshots.take())

    def fail(self, exc: BaseException) -> None:
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            log.critical("node %d stopping: %r", self.config.node_id, exc, exc_info=exc)
        self._stopping = self.snapshots.stopping = True
        if self.runner is not None:
            self.runner.stop()
        self._fail_all_waiters()
        self.stopped.set()

    def observe_fsync(self, entries: int, started: float) -> None:
        self.metrics.observe_fsync(entries, time.perf_counter() - started)

    def now(self) -> float:
        return time.perf_counter()


__all__ = ["Node", "NodeStopped"]
