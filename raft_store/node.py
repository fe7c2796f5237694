"""The node runner: drives the pure core with real time, disk, network and a state machine.

One asyncio task owns the core and runs the Ready contract (see core.py) in order: send the
leader's appends, write and fsync the WAL in a dedicated thread (group commit: everything that
arrived while the previous fsync ran goes into the next one), send replies, apply committed
commands in the apply thread, answer clients, advance. Client commands arriving at the leader in
one loop iteration share one log entry, one WAL record and one fsync. Client reads are answered
in the apply thread too, a batch at a time between applies, never on the loop: a query may take
hundreds of milliseconds (a summary over a large dead-letter tier), longer than the election
timeout, and the loop must keep ticking, heartbeating and appending meanwhile.

Failure policy: a failed fsync or a corrupt WAL stops the node (never retried and ignored).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from raft_store import codec
from raft_store.codec import FrameType, Status
from raft_store.core import Config as CoreConfig
from raft_store.core import ProposalDropped, RaftCore, Ready, Recovered, Role
from raft_store.files import make_private
from raft_store.membership import MembershipError
from raft_store.metrics import NodeMetrics
from raft_store.node_clock import NodeClock
from raft_store.node_config import NodeConfig
from raft_store.node_status import node_status
from raft_store.reads import ReadsDue
from raft_store.snapshots import SnapshotStore, SnapshotWriter
from raft_store.state_machine import (
    BatchFormatError,
    CheckpointingMachine,
    ClockedMachine,
    CopyPinningMachine,
    GroupCommittingMachine,
    PinnedCopy,
    StateMachine,
    decode_batch,
    encode_batch,
)
from raft_store.transport import ClientConnection, Transport, TransportConfig
from raft_store.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryKind,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from raft_store.wal import Wal

log = logging.getLogger("raft_store.node")

SNAPSHOT_CHUNK_BYTES = 1 << 20
INLINE_APPLY_BYTES_MAX = 64 << 10
INLINE_PERSIST_BYTES_MAX = 32 << 10
IDLE_COMMIT_S = 0.05
"""A group-committing machine with applied but uncommitted entries is committed once its apply
pipeline has been idle this long (under load it commits by size, in the apply thread)."""
READ_JOB_BUDGET_S = 0.01
"""A read job stops taking further queries of its batch after this long (the rest go first into
the next job): applies queued behind it then wait for at most one slow query plus this, however
many reviewers ask at once."""


class Queryable(Protocol):
    def query(self, data: bytes) -> bytes: ...


@dataclass(slots=True)
class _Waiter:
    conn: ClientConnection | None
    request_id: int
    count: int
    future: asyncio.Future[codec.Result] | None = None


class NodeStopped(Exception):
    """The node stopped itself: storage failed or was found corrupt."""


class Node:
    def __init__(self, config: NodeConfig, machine: StateMachine) -> None:
        config.validate()
        self.config = config
        self.machine = machine
        self.metrics = NodeMetrics()
        self.core: RaftCore | None = None
        self.clock = NodeClock(config.node_id, band_ms=2 * config.tick_ms * config.heartbeat_ticks)  # stamps, "now"
        if isinstance(machine, ClockedMachine):
            machine.use_clock(self.clock.read_ms)
        self.wal: Wal | None = None
        self.snapshots = SnapshotStore(config.data_dir / "snapshots")
        self.transport = Transport(
            config.node_id,
            config.listen,
            {n: a for n, a in config.peers.items() if n != config.node_id},
            self._on_peer_frame,
            self._on_client_frame,
            TransportConfig(cluster_id=config.cluster_id), auth=config.auth, refused=self.metrics.refused,
        )
        self.transport.on_unreachable = self._on_unreachable
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"wal-{config.node_id}")
        self._apply_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"apply-{config.node_id}")
        self._idle_commit: asyncio.TimerHandle | None = None
        self._copy_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"copy-{config.node_id}")
        self._copying = False
        # The newest snapshot file known good (verified at start, or written or received since):
        # what a lagging follower is sent, found without re-reading gigabytes on the event loop.
        self._shippable: tuple[SnapshotMeta, Path] | None = None
        self._inbox: deque[Message] = deque()
        self._ticks = 0
        self._proposals: list[tuple[_Waiter, tuple[tuple[int, int, bytes], ...]]] = []
        self._proposals_since = 0.0
        self._waiting: dict[int, tuple[int, list[_Waiter]]] = {}
        self._admin_waiting: dict[int, tuple[int, _Waiter]] = {}
        self._reads: dict[bytes, list[tuple[ClientConnection, codec.Read]]] = {}
        self._read_batch: list[tuple[ClientConnection, codec.Read]] = []
        self._reads_due = ReadsDue(self._serve_reads, self.metrics)
        self._read_seq = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._failure: BaseException | None = None
        self._receiving: dict[int, tuple[SnapshotMeta, SnapshotWriter]] = {}
        self._received: dict[int, Path] = {}
        self._sending_snapshot: set[int] = set()
        self._was_leader = False
        self._persist_queue: list[Ready] = []
        self._persist_running = False
        self._apply_queue: list[list[Entry]] = []
        self._apply_running = False
        """An apply or a commit is on the apply thread (or queued there behind a read job), or a
        snapshot is being installed: the machine is not the loop's to use."""
        self._reading = False
        """A read job is on the apply thread: no inline apply, no second read job, no loop query."""
        self._snapshotting = False
        self._bytes_since_snapshot = 0
        self.stopped = asyncio.Event()

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        make_private(self.config.data_dir)  # 0700 and 0600 throughout, also what older versions left
        self.core = await loop.run_in_executor(self._io, self._recover)
        await self.transport.start()
        self._tasks = [
            loop.create_task(self._run(), name=f"node-{self.config.node_id}"),
            loop.create_task(self._ticker(), name=f"ticker-{self.config.node_id}"),
        ]

    def _recover(self) -> RaftCore:
        cfg = self.config
        wal, rec = Wal.open(cfg.data_dir / "wal", segment_bytes=cfg.segment_bytes, volatile=cfg.volatile_until_fsync)
        if rec.torn_tail is not None:
            log.warning("node %d: WAL torn tail truncated: %s", cfg.node_id, rec.torn_tail)
            self.metrics.torn_tails += 1
        self.wal = wal
        self._clock_from_machine()
        latest = self.snapshots.latest()
        self._shippable = latest
        if latest is not None:
            meta, path = latest
        else:
            meta, path = SnapshotMeta(0, 0, ConfState(voters=cfg.initial_voters)), None
        checkpoint = self.snapshots.checkpoint()
        if checkpoint is not None and checkpoint.index > meta.index:
            # The log before the checkpoint is gone; only the machine's own store holds it.
            if self.machine.applied_index() < checkpoint.index:
                raise NodeStopped(
                    f"state store reflects index {self.machine.applied_index()}, behind its checkpoint at"
                    f" {checkpoint.index}: the store was replaced or rolled back; move this data directory"
                    " aside and let the node rejoin empty (it then receives a snapshot)"
                )
            meta, path = checkpoint, None
        if path is not None and self.machine.applied_index() < meta.index:
            self._restore_machine(path, meta)
        entries = [e for e in rec.entries if e.index > meta.index]
        if entries and entries[0].index != meta.index + 1:
            raise NodeStopped(f"WAL starts at {entries[0].index}, snapshot ends at {meta.index}: refusing a gap")
        last = entries[-1].index if entries else meta.index
        applied = self.machine.applied_index()
        if applied > last:
            raise NodeStopped(f"state machine applied {applied} beyond the log's last index {last}")
        return RaftCore(
            CoreConfig(node_id=cfg.node_id, election_ticks=cfg.election_ticks, heartbeat_ticks=cfg.heartbeat_ticks),
            Recovered(
                hard_state=rec.hard_state, snapshot=meta, entries=tuple(entries), applied=max(applied, meta.index)
            ),
            random.Random(),
        )

    def _clock_from_machine(self) -> None:
        if isinstance(self.machine, ClockedMachine):  # the time its state reached: never read below
            self.clock.committed(self.machine.log_time_ms())

    def _restore_machine(self, path: Path, meta: SnapshotMeta) -> None:
        with tempfile.NamedTemporaryFile(dir=self.config.data_dir, suffix=".restore", delete=False) as tmp:
            for chunk in SnapshotStore.iter_data(path):
                tmp.write(chunk)
        try:
            self.machine.restore_snapshot(Path(tmp.name), meta.index)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp.name)
        self._clock_from_machine()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.close()
        self._fail_all_waiters()
        if self.wal is not None and self._failure is None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._io, self.wal.close)
        self._io.shutdown(wait=True)
        self._apply_pool.shutdown(wait=True)
        self._copy_pool.shutdown(wait=True)
        if self._idle_commit is not None:
            self._idle_commit.cancel()
        if self._failure is None and isinstance(self.machine, GroupCommittingMachine):
            self.machine.commit()  # a clean stop leaves the store current (a crash would replay)
        self.stopped.set()

    # ---- inputs -------------------------------------------------------------------------
    async def _ticker(self) -> None:
        interval = self.config.tick_ms / 1000
        next_at = time.monotonic()
        while not self._stopping:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self._ticks += 1
            self._wake.set()

    def _on_peer_frame(self, sender: int, ftype: FrameType, body: bytes) -> None:
        if ftype is FrameType.RAFT:
            m = codec.decode_message(body)
            if m.frm != sender or m.to != self.config.node_id:
                raise codec.CodecError(f"message from {m.frm} to {m.to} on {sender}'s connection")
            self.clock.heard(m)
            self._inbox.append(m)
        else:
            self._receive_chunk(codec.decode_chunk(body))
        self._wake.set()

    def _on_client_frame(self, conn: ClientConnection, ftype: FrameType, body: bytes) -> None:
        if ftype is FrameType.PROPOSE:
            self._client_propose(conn, codec.decode_propose(body))
        elif ftype is FrameType.READ:
            self._client_read(conn, codec.decode_read(body))
        elif ftype is FrameType.STATUS:
            conn.send(FrameType.STATUS_RESULT, json.dumps(self.status()).encode())
        elif ftype is FrameType.ADMIN:
            self._client_admin(conn, body)
        else:
            raise codec.CodecError(f"client sent a {ftype.name} frame")
        self._wake.set()

    def _client_propose(
        self, conn: ClientConnection | None, request: codec.Propose, future: asyncio.Future[codec.Result] | None = None
    ) -> None:
        core = self.core
        assert core is not None
        waiter = _Waiter(conn, request.request_id, len(request.commands), future)
        if core.role is not Role.LEADER:
            self._reply(waiter, Status.NOT_LEADER, core.leader, ())
            return
        if not self._proposals:
            self._proposals_since = time.monotonic()
        self._proposals.append((waiter, request.commands))

    async def propose_local(self, commands: list[tuple[int, int, bytes]]) -> codec.Result:
        """Propose from inside the node's process (embedded use and tests)."""
        future: asyncio.Future[codec.Result] = asyncio.get_running_loop().create_future()
        self._client_propose(None, codec.Propose(0, tuple(commands)), future)
        self._wake.set()
        return await future

    @property
    def failure(self) -> BaseException | None:
        """What stopped the node (a storage failure, a corrupt log), or None."""
        return self._failure

    @property
    def applying(self) -> bool:
        """Whether the machine is in use on the apply thread right now (`query_applied` waits it out)."""
        return self._apply_running or self._reading

    def query_applied(self, query: bytes) -> bytes | None:
        """This replica's answer to `query` from its applied state, for callers on the node's own
        loop (its metrics endpoint), which cannot await the apply thread. None while an apply or a
        read job runs: the connection is then in use on the apply thread, and a caller must not
        wait on the loop for it (so under back-to-back slow client queries a scrape may find no
        gap and go without the machine's gauges)."""
        if self._apply_running or self._reading:
            return None
        machine: Any = self.machine
        answer: bytes = machine.query(query)
        return answer

    def _client_read(self, conn: ClientConnection, read: codec.Read) -> None:
        core = self.core
        assert core is not None
        if not read.linearizable or read.wait_ms:  # due at once, or a long poll (reads.py)
            self._reads_due.take_stale(conn, read, core.log.applied)
        elif core.leader == 0:
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, Status.NOT_LEADER, 0, ())))
        else:
            self._read_batch.append((conn, read))

    def _request_read_index(self) -> None:
        """All linearizable reads that arrived since the last turn share one ReadIndex round
        (one heartbeat to the followers), however many there are."""
        core = self.core
        assert core is not None
        if not self._read_batch:
            return
        self._read_seq += 1
        context = self._read_seq.to_bytes(8, "big") + os.urandom(4)
        self._reads[context] = self._read_batch
        self._read_batch = []
        core.read_index(context)

    def _client_admin(self, conn: ClientConnection, body: bytes) -> None:
        core = self.core
        assert core is not None
        try:
            request = json.loads(body)
            op, node, request_id = str(request["op"]), int(request["node"]), int(request.get("request_id", 0))
        except (ValueError, KeyError, TypeError) as exc:
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(0, Status.ERROR, 0, (str(exc).encode(),))))
            return
        waiter = _Waiter(conn, request_id, 1)
        if core.role is not Role.LEADER:
            self._reply(waiter, Status.NOT_LEADER, core.leader, ())
            return
        if op == "transfer":
            core.transfer_leadership(node)
            self._reply(waiter, Status.OK, core.leader, (b"transfer started",))
            return
        changes = {
            "add_voter": ConfChangeType.ADD_VOTER,
            "add_learner": ConfChangeType.ADD_LEARNER,
            "remove": ConfChangeType.REMOVE_NODE,
        }
        if op not in changes:
            self._reply(waiter, Status.ERROR, core.leader, (f"unknown op {op!r}".encode(),))
            return
        if "address" in request:
            host, port = str(request["address"]).rsplit(":", 1)
            self.transport.add_peer(node, (host, int(port)))
        try:
            index = core.propose_conf_change(ConfChange(changes[op], node))
        except (ProposalDropped, MembershipError) as exc:
            self._reply(waiter, Status.ERROR, core.leader, (str(exc).encode(),))
            return
        self._admin_waiting[index] = (core.term, waiter)

    # ---- the loop -----------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self._stopping:
                await self._wake.wait()
                self._wake.clear()
                if self._failure is not None:
                    raise self._failure
                self._step_inputs()
                core = self.core
                assert core is not None
                while core.has_ready() and not self._stopping:
                    await self._handle_ready(core.ready())
                    self._step_inputs()
                self._after_role_change()
                self._serve_reads()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # storage failure or a bug: stop, loudly
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            log.critical("node %d stopping: %r", self.config.node_id, exc, exc_info=exc)
        self._stopping = True
        self._fail_all_waiters()
        self.stopped.set()
        self._wake.set()

    def _step_inputs(self) -> None:
        core = self.core
        assert core is not None
        while self._ticks:
            self._ticks -= 1
            core.tick()
        inbox = self._inbox
        while inbox:
            core.step(inbox.popleft())
        self._request_read_index()
        self._propose_pending()

    def _propose_pending(self) -> None:
        core = self.core
        assert core is not None
        if not self._proposals:
            return
        if core.role is not Role.LEADER:
            for waiter, _ in self._proposals:
                self._reply(waiter, Status.NOT_LEADER, core.leader, ())
            self._proposals = []
            return
        pending = sum(len(c) for _, c in self._proposals)
        age_ms = (time.monotonic() - self._proposals_since) * 1000
        if not self.config.group_commit.should_sync(pending, age_ms) and self.config.group_commit.max_delay_ms > 0:
            delay = (self.config.group_commit.max_delay_ms - age_ms) / 1000
            asyncio.get_running_loop().call_later(max(0.0, delay), self._wake.set)
            return
        self._sync_clock_role()
        now_ms = self.clock.read_ms()  # the log's clock as the leader reads it, stamped into the entry
        while self._proposals:
            batch: list[tuple[int, int, bytes]] = []
            waiters: list[_Waiter] = []
            while self._proposals and (
                not batch or len(batch) + len(self._proposals[0][1]) <= self.config.batch_commands_max
            ):
                waiter, commands = self._proposals.pop(0)
                batch.extend(commands)
                waiters.append(waiter)
            try:
                index = core.propose(encode_batch(now_ms, batch))
            except ProposalDropped:
                for waiter in waiters:
                    self._reply(waiter, Status.DROPPED, core.leader, ())
                continue
            self._waiting[index] = (core.term, waiters)
            self.metrics.proposed_commands += len(batch)

    async def _handle_ready(self, rd: Ready) -> None:
        """Dispatch one Ready without waiting for its I/O: writes and applies run in their own
        threads, in order, and report back through callbacks on the event loop."""
        for m in rd.early_messages:
            self._send(m)
        if rd.snapshot is not None:
            await self._drain_pipelines()
            # The restore replaces the machine's connection on the WAL thread: mark the machine
            # busy so that no read job, idle commit or loop query touches it meanwhile.
            self._apply_running = True
            try:
                await asyncio.get_running_loop().run_in_executor(self._io, self._install_snapshot, rd.snapshot.meta)
            finally:
                self._apply_running = False
        for state in rd.read_states:
            for conn, read in self._reads.pop(state.context, []):
                self._reads_due.add(state.index, conn, read)
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
                    self._send(m)
        if rd.committed:
            self._apply_queue.append(rd.committed)
            self._kick_apply()

    def _kick_persist(self) -> None:
        if self._persist_running or not self._persist_queue or self._stopping:
            return
        batch, self._persist_queue = self._persist_queue, []
        self._persist_running = True
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        # (Never while a snapshot compacts the WAL in the WAL thread: one writer at a time.)
        if not self._snapshotting and sum(len(e.data) for rd in batch for e in rd.entries) <= INLINE_PERSIST_BYTES_MAX:
            # Light load: a small write and its fsync cost less here than the hand-off to the
            # WAL thread and back (measured: ~60 us of CPU and a GIL round trip). The leader's
            # appends are already in the sockets, so followers fsync in parallel with us.
            future: asyncio.Future[None] = loop.create_future()
            try:
                self._persist(batch)
                future.set_result(None)
            except Exception as exc:
                future.set_exception(exc)
            self._persisted(future, batch, started)
            return
        future = loop.run_in_executor(self._io, self._persist, batch)
        future.add_done_callback(lambda f: self._persisted(f, batch, started))

    def _persist(self, batch: list[Ready]) -> None:
        """WAL thread: one write per Ready, one fsync for the whole batch (group commit)."""
        wal = self.wal
        assert wal is not None
        sync = False
        for rd in batch:
            if rd.entries:
                wal.append(rd.entries)
            if rd.hard_state is not None:
                wal.set_hard_state(rd.hard_state)
            sync = sync or rd.must_sync
        if sync:
            wal.sync()

    def _failed(self, future: asyncio.Future[Any]) -> bool:
        """A pipeline step that failed stops the node (storage errors are never retried)."""
        if future.cancelled():
            return True
        exc = future.exception()
        if exc is not None:
            self._fail(exc)
            return True
        return False

    def _persisted(self, future: asyncio.Future[None], batch: list[Ready], started: float) -> None:
        self._persist_running = False
        if self._failed(future):
            return
        core = self.core
        assert core is not None
        entries = sum(len(rd.entries) for rd in batch)
        if any(rd.must_sync for rd in batch):
            self.metrics.observe_fsync(entries, time.perf_counter() - started)
        for rd in batch:
            for m in rd.messages:
                self._send(m)
            core.on_persisted(rd)
        self._kick_persist()
        self._wake.set()

    def _kick_apply(self) -> None:
        if self._apply_running or not self._apply_queue or self._stopping:
            return
        batch = [entry for committed in self._apply_queue for entry in committed]
        self._apply_queue = []
        if not self._snapshotting and not self._reading and sum(len(e.data) for e in batch) <= INLINE_APPLY_BYTES_MAX:
            # A small batch costs less to apply here than a round trip through the apply
            # thread; nothing else touches the machine meanwhile (no snapshot, no read job).
            # During a read job the batch queues behind it on the apply thread instead.
            try:
                results = self._apply(batch)
            except Exception as exc:
                self._fail(exc)
                return
            self._after_apply(batch, results)
            return
        self._apply_running = True
        future = asyncio.get_running_loop().run_in_executor(self._apply_pool, self._apply, batch)
        future.add_done_callback(lambda f: self._applied(f, batch))

    def _applied(self, future: asyncio.Future[list[list[bytes] | None]], batch: list[Entry]) -> None:
        self._apply_running = False
        if not self._failed(future):
            self._after_apply(batch, future.result())

    def _after_apply(self, batch: list[Entry], results: list[list[bytes] | None]) -> None:
        core = self.core
        assert core is not None
        self._answer(batch, results)
        core.on_applied(batch[-1].index, batch)
        # Reads that waited for this apply go first; entries committed meanwhile queue behind
        # them on the apply thread, so neither starves the other under load.
        self._serve_reads()
        self._kick_apply()
        self._arm_idle_commit()
        self._bytes_since_snapshot += sum(len(e.data) for e in batch)
        if not self._snapshotting and (
            core.log.applied - core.log.snapshot_index >= self.config.snapshot_every_entries
            or self._bytes_since_snapshot >= self.config.snapshot_every_bytes
        ):
            self._bytes_since_snapshot = 0
            self._snapshotting = True
            asyncio.get_running_loop().create_task(self._take_snapshot())
        self._wake.set()

    def _arm_idle_commit(self) -> None:
        machine = self.machine
        if (
            self._idle_commit is None
            and not self._apply_running
            and not self._reading
            and isinstance(machine, GroupCommittingMachine)
            and machine.uncommitted
        ):
            self._idle_commit = asyncio.get_running_loop().call_later(IDLE_COMMIT_S, self._commit_if_idle)

    def _commit_if_idle(self) -> None:
        self._idle_commit = None
        machine = self.machine
        if self._stopping or not isinstance(machine, GroupCommittingMachine) or not machine.uncommitted:
            return
        if self._apply_running or self._apply_queue or self._reading:
            self._arm_idle_commit()  # busy again: the apply thread commits by size meanwhile
            return
        self._apply_running = True  # the commit runs in the apply thread, one user at a time
        future = asyncio.get_running_loop().run_in_executor(self._apply_pool, machine.commit)

        def done(f: asyncio.Future[None]) -> None:
            self._apply_running = False
            if not self._failed(f):
                self._kick_apply()
                self._serve_reads()

        future.add_done_callback(done)

    async def _drain_pipelines(self) -> None:
        while self._persist_running or self._persist_queue or self._apply_running or self._apply_queue or self._reading:
            await asyncio.sleep(0.001)
            if self._failure is not None:
                raise self._failure
        while self._snapshotting:
            await asyncio.sleep(0.005)

    def _apply(self, committed: list[Entry]) -> list[list[bytes] | None]:
        out: list[list[bytes] | None] = []
        machine = self.machine
        for entry in committed:
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
                # Only the node that proposed the entry has clients waiting for its results.
                result = machine.apply_batch(entry.index, now_ms, commands, respond=entry.index in self._waiting)
                self.clock.committed(now_ms)
                out.append(result)
                self.metrics.applied_commands += len(commands)
            else:
                machine.note_applied(entry.index)
                out.append(None)
        return out

    def _answer(self, committed: list[Entry], results: list[list[bytes] | None]) -> None:
        for entry, result in zip(committed, results, strict=True):
            waiting = self._waiting.pop(entry.index, None)
            if waiting is not None:
                term, waiters = waiting
                if term != entry.term or result is None:
                    # Another term at the index: another leader's entry replaced ours, which can
                    # never apply. Our own entry without results committed, so "not applied"
                    # would be a guess: in doubt.
                    status = Status.NOT_LEADER if term != entry.term else Status.IN_DOUBT
                    for waiter in waiters:
                        self._reply(waiter, status, 0, ())
                else:
                    offset = 0
                    for waiter in waiters:
                        self._reply(
                            waiter, Status.OK, self.config.node_id, tuple(result[offset : offset + waiter.count])
                        )
                        offset += waiter.count
            admin = self._admin_waiting.pop(entry.index, None)
            if admin is not None:
                term, waiter = admin
                status = Status.OK if term == entry.term else Status.NOT_LEADER
                self._reply(waiter, status, self.config.node_id, (b"applied",))

    def _reply(self, waiter: _Waiter, status: Status, hint: int, results: tuple[bytes, ...]) -> None:
        result = codec.Result(waiter.request_id, status, hint, results)
        if waiter.future is not None:
            if not waiter.future.done():
                waiter.future.set_result(result)
        elif waiter.conn is not None:
            waiter.conn.send(FrameType.RESULT, codec.encode_result(result))

    def _serve_reads(self) -> None:
        """Answer the reads whose read index is applied, in one job on the apply thread.

        Queries once ran here on the loop, between applies; a dead-letter summary over 100,000
        dead letters takes ~300 ms, the election timeout, and stalled heartbeats and appends for
        that long. On the apply thread a query is still serialized with applies on the same
        connection (it sees one applied state), while the loop goes on. One job takes every
        ready read (one thread hop per batch); answers are sent from the loop when it ends."""
        if not self._reads_due or self._apply_running or self._reading or self._stopping or self.core is None:
            return
        ready = self._reads_due.due(self.core.log.applied)
        if not ready:
            return
        self._reading = True
        queries = [read.query for _, _, read in ready]
        future = asyncio.get_running_loop().run_in_executor(self._apply_pool, self._query_batch, queries)
        future.add_done_callback(lambda f: self._read_done(f, ready))

    def _query_batch(self, queries: list[bytes]) -> tuple[int, list[tuple[Status, bytes]]]:
        """Apply thread: answers to a prefix of `queries` (all of them unless the job ran past
        READ_JOB_BUDGET_S), with the applied index they all reflect, taken from the machine here
        (exact: nothing applies while this runs). A query that raises answers ERROR: a bad read
        must neither stop the node nor leave its client waiting."""
        machine: Any = self.machine
        applied = int(machine.applied_index())
        deadline = time.perf_counter() + READ_JOB_BUDGET_S
        answers: list[tuple[Status, bytes]] = []
        for query in queries:
            if answers and time.perf_counter() >= deadline:
                break
            try:
                answers.append((Status.OK, machine.query(query)))
            except Exception as exc:
                log.exception("node %d: a query failed", self.config.node_id)
                answers.append((Status.ERROR, f"query failed: {exc!r}"[:500].encode()))
        return applied, answers

    def _read_done(
        self,
        future: asyncio.Future[tuple[int, list[tuple[Status, bytes]]]],
        ready: list[tuple[int, ClientConnection, codec.Read]],
    ) -> None:
        self._reading = False
        hint = self.core.leader if self.core is not None else 0
        if future.cancelled() or future.exception() is not None:
            exc = None if future.cancelled() else future.exception()
            log.error("node %d: a read job failed: %r", self.config.node_id, exc)
            answers: list[tuple[Status, bytes]] = [(Status.ERROR, f"read failed: {exc!r}".encode())] * len(ready)
            applied = 0
        else:
            applied, answers = future.result()
        for (_, conn, read), (status, answer) in zip(ready, answers, strict=False):
            results = (answer, applied.to_bytes(8, "big")) if status is Status.OK else (answer,)
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, status, hint, results)))
        # What the budget left unanswered goes first into the next job, after any apply queued
        # behind this one. Reads that arrived meanwhile are served by that job too.
        self._reads_due.put_back(ready[len(answers) :])
        self._serve_reads()
        self._kick_apply()
        self._arm_idle_commit()
        self._wake.set()

    def _after_role_change(self) -> None:
        core = self.core
        assert core is not None
        is_leader = core.role is Role.LEADER
        self._sync_clock_role()
        if self._was_leader and not is_leader:
            # Entries we proposed may still commit under the next leader; clients retry with
            # the same session sequence numbers and get the stored result.
            self._fail_all_waiters()
        if not is_leader and (self._reads or self._read_batch) and core.leader == 0:
            waiting = [r for batch in self._reads.values() for r in batch] + self._read_batch
            for conn, read in waiting:
                conn.send(
                    FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, Status.NOT_LEADER, 0, ()))
                )
            self._reads = {}
            self._read_batch = []
        self._was_leader = is_leader

    def _sync_clock_role(self) -> None:
        """The log's clock follows the majority's time when leading, else the leader's reading."""
        assert self.core is not None
        self.clock.set_role(self.core.role is Role.LEADER, self.core.leader, self.core.conf.voters)

    def _fail_all_waiters(self) -> None:
        """Answer everyone waiting when this node stops leading or stops. What is in the log may
        still commit under the next leader (IN_DOUBT); what never reached it cannot (NOT_LEADER).
        A client tells its caller "not applied" only on the second."""
        hint = self.core.leader if self.core is not None else 0
        for _, waiters in self._waiting.values():
            for waiter in waiters:
                self._reply(waiter, Status.IN_DOUBT, hint, ())
        self._waiting = {}
        for _, waiter in self._admin_waiting.values():
            self._reply(waiter, Status.IN_DOUBT, hint, ())
        self._admin_waiting = {}
        for waiter, _ in self._proposals:
            self._reply(waiter, Status.NOT_LEADER, hint, ())
        self._proposals = []

    # ---- snapshots --------------------------------------------------------------------
    async def _take_snapshot(self) -> None:
        """Compact the log: by a checkpoint of the machine's own store when it can make itself
        durable, else by a snapshot file written in the apply thread (ordered with applies). The
        marker or file is saved and the WAL compacted in the WAL thread (ordered with writes),
        then the core forgets the prefix."""
        core = self.core
        assert core is not None
        loop = asyncio.get_running_loop()
        tmp = self.config.data_dir / "snapshot.tmp"
        try:
            index = 0
            if isinstance(self.machine, CheckpointingMachine):
                index = await loop.run_in_executor(self._apply_pool, self.machine.checkpoint)
                if index:
                    meta = self._meta_at(index) if index > core.log.snapshot_index else None
                    if meta is not None:
                        await loop.run_in_executor(self._io, self._save_checkpoint, meta)
                        self._compacted(meta)
                        self.metrics.checkpoints += 1
                    return
            index = await loop.run_in_executor(self._apply_pool, self.machine.write_snapshot, tmp)
            meta = self._meta_at(index) if index > core.log.snapshot_index else None
            if meta is None:
                return
            self._shippable = (meta, await loop.run_in_executor(self._io, self._save_snapshot, meta, tmp))
            self._compacted(meta)
            self.metrics.snapshots += 1
        except Exception as exc:
            self._fail(exc)
        finally:
            self._snapshotting = False

    def _meta_at(self, index: int) -> SnapshotMeta | None:
        """Meta for a snapshot at `index`, or None when its term is no longer in the log."""
        core = self.core
        assert core is not None
        term = core.log.term(index)
        if term is None:
            return None
        return SnapshotMeta(index=index, term=term, conf=core.log.conf_at(index))

    def _compacted(self, meta: SnapshotMeta) -> None:
        core = self.core
        assert core is not None
        if meta.index > core.log.snapshot_index:
            core.compact(meta.index)

    def _save_checkpoint(self, meta: SnapshotMeta) -> None:
        self.snapshots.save_checkpoint(meta)
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)

    async def _snapshot_file(self, at_least: int) -> tuple[SnapshotMeta, Path] | None:
        """A snapshot file covering `at_least`, written now if the newest file is older.

        With checkpoints a node keeps no full copy of its store; a follower too far behind gets
        one made on demand: for a SQLite machine a copy through its own read transaction, on a
        thread of its own while applies go on."""
        if self._shippable is not None and self._shippable[0].index >= at_least and self._shippable[1].exists():
            return self._shippable
        while self._snapshotting or self._copying:  # one copy at a time; else the machine is shared
            await asyncio.sleep(0.01)
            if self._stopping:
                return None
        if self._shippable is not None and self._shippable[0].index >= at_least and self._shippable[1].exists():
            return self._shippable
        self._copying = True
        self._snapshotting = True  # no inline apply, no compaction: the state must hold still
        loop = asyncio.get_running_loop()
        tmp = self.config.data_dir / "snapshot-copy.tmp"
        copy: PinnedCopy | None = None
        try:
            if isinstance(self.machine, CopyPinningMachine):
                # Pin the state in the apply thread (a read transaction begun between applies:
                # milliseconds), name it while its term is still in the log, then let applies and
                # compaction go on while the pinned state is copied on a thread of its own.
                copy = await loop.run_in_executor(self._apply_pool, self.machine.open_copy)
            if copy is not None:
                meta = self._meta_at(copy.index)
                self._snapshotting = False
                if meta is None:
                    return None
                await loop.run_in_executor(self._copy_pool, copy.write, tmp)
            else:
                index = await loop.run_in_executor(self._apply_pool, self.machine.write_snapshot, tmp)
                meta = self._meta_at(index)
                self._snapshotting = False
                if meta is None:
                    return None
            # Framing a multi-GB copy takes long: not on the WAL thread, which the log needs.
            path = await loop.run_in_executor(self._copy_pool, self.snapshots.save, meta, tmp)
            self.metrics.snapshots += 1
            self._shippable = (meta, path)
            return meta, path
        finally:
            if copy is not None:
                copy.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            self._copying = False
            self._snapshotting = False

    def _save_snapshot(self, meta: SnapshotMeta, tmp: Path) -> Path:
        path = self.snapshots.save(meta, tmp)
        tmp.unlink()
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)
        return path

    def _install_snapshot(self, meta: SnapshotMeta) -> None:
        path = self._received.pop(meta.index, None)
        if path is None:
            raise NodeStopped(f"core installed snapshot {meta.index} that was never received")
        self._restore_machine(path, meta)
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)
        self._shippable = (meta, path)

    def _receive_chunk(self, chunk: codec.SnapshotChunk) -> None:
        if chunk.to != self.config.node_id:
            raise codec.CodecError("snapshot chunk for another node")
        current = self._receiving.get(chunk.frm)
        if chunk.offset == 0:
            if current is not None:
                current[1].abort()
            current = (chunk.meta, self.snapshots.begin_receive(chunk.meta))
            self._receiving[chunk.frm] = current
        if current is None or current[0] != chunk.meta:
            return  # a chunk of a transfer we are not assembling: the leader will resend
        current[1].write_chunk(chunk.data, chunk.offset)
        if chunk.last:
            del self._receiving[chunk.frm]
            path = current[1].finish()
            self._received[chunk.meta.index] = path
            self._inbox.append(
                Message(
                    MessageType.SNAP, to=chunk.to, frm=chunk.frm, term=chunk.term, snapshot=Snapshot(meta=chunk.meta)
                )
            )

    def _send_snapshot(self, m: Message) -> None:
        core = self.core
        if m.to in self._sending_snapshot or core is None:
            return
        self._sending_snapshot.add(m.to)
        asyncio.get_running_loop().create_task(self._prepare_and_stream(m, core.log.snapshot_index))

    async def _prepare_and_stream(self, m: Message, at_least: int) -> None:
        try:
            found = await self._snapshot_file(at_least)
        except Exception as exc:
            self._sending_snapshot.discard(m.to)
            self._fail(exc)
            return
        if found is None:
            self._sending_snapshot.discard(m.to)
            if self.core is not None:
                self.core.report_snapshot_failed(m.to)
            return
        await self._stream_snapshot(m, *found)

    async def _stream_snapshot(self, m: Message, meta: SnapshotMeta, path: Path) -> None:
        try:
            # One open file for the whole transfer: a newer checkpoint may delete this snapshot
            # file meanwhile, and an open descriptor keeps its bytes readable until we are done.
            source = open(path, "rb")  # noqa: SIM115 - closed in the finally below
        except FileNotFoundError:
            self._sending_snapshot.discard(m.to)
            if self.core is not None:
                self.core.report_snapshot_failed(m.to)
            return
        try:
            size = os.fstat(source.fileno()).st_size
            offset = 0
            while True:
                data = source.read(SNAPSHOT_CHUNK_BYTES)
                last = offset + len(data) >= size
                chunk = codec.SnapshotChunk(m.frm, m.to, m.term, meta, offset, last, data)
                while not self.transport.send(m.to, FrameType.SNAP_CHUNK, codec.encode_chunk(chunk)):
                    await asyncio.sleep(0.05)
                    if self._stopping:
                        return
                offset += len(data)
                if last:
                    return
                await asyncio.sleep(0)
        finally:
            source.close()
            self._sending_snapshot.discard(m.to)

    # ---- network --------------------------------------------------------------------------
    def _send(self, m: Message) -> None:
        if m.type is MessageType.SNAP:
            self._send_snapshot(m)
            return
        wall, reading = self.clock.stamps()  # the leader learns its peers' clocks, a follower its reading
        self.transport.send(m.to, FrameType.RAFT, codec.encode_message(m, wall_ms=wall, clock_ms=reading))

    def _on_unreachable(self, peer: int) -> None:
        if self.core is not None:
            self.core.report_unreachable(peer)

    # ---- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Role, term, indexes, follower progress, addresses, clock and metrics (node_status.py)."""
        return node_status(self)
