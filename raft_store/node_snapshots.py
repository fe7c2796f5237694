"""The node's snapshots: compaction, snapshot files for lagging followers, sending and receiving.

Compaction uses a checkpoint of the machine's own store when it can make itself durable, else a
snapshot file written on the apply lane (ordered with applies); the marker or file is saved and
the WAL compacted on the WAL lane (ordered with writes), then the core forgets the prefix. A
follower too far behind gets the newest snapshot file known good, made on demand when the node
keeps only checkpoints; it is streamed in chunks, and a received one is assembled chunk by chunk
and handed to the core as a SNAP message, which the Ready runner installs once drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from raft_store import codec
from raft_store.codec import FrameType
from raft_store.core import RaftCore
from raft_store.metrics import NodeMetrics
from raft_store.node_ports import ThreadLane
from raft_store.ready_runner import ReadyRunner
from raft_store.snapshots import SnapshotStore, SnapshotWriter
from raft_store.state_machine import CheckpointingMachine, CopyPinningMachine, PinnedCopy, StateMachine
from raft_store.transport import Transport
from raft_store.types import Message, MessageType, Snapshot, SnapshotMeta
from raft_store.wal import Wal

SNAPSHOT_CHUNK_BYTES = 1 << 20


class NodeStopped(Exception):
    """The node stopped itself: storage failed or was found corrupt."""


class NodeSnapshots:
    def __init__(
        self, node_id: int, data_dir: Path, machine: StateMachine, metrics: NodeMetrics, *,
        io: ThreadLane, apply: ThreadLane, restored: Callable[[], None], fail: Callable[[BaseException], None],
    ) -> None:  # fmt: skip
        self._node_id = node_id
        self._data_dir = data_dir
        self._machine = machine
        self._metrics = metrics
        self._io = io
        self._apply = apply
        self._copy = ThreadLane(f"copy-{node_id}")
        self._restored = restored
        """Called after the machine's state was replaced (its clock reading moves with it)."""
        self._fail = fail
        self.store = SnapshotStore(data_dir / "snapshots")
        self.wal: Wal | None = None
        self.core: RaftCore | None = None
        self.runner: ReadyRunner | None = None
        self.transport: Transport | None = None
        self.deliver: Callable[[Message], None] | None = None
        """Where a received snapshot goes, as a SNAP message for the core."""
        self.stopping = False
        self._copying = False
        # The newest snapshot file known good (verified at start, or written or received since):
        # what a lagging follower is sent, found without re-reading gigabytes on the event loop.
        self.shippable: tuple[SnapshotMeta, Path] | None = None
        self._receiving: dict[int, tuple[SnapshotMeta, SnapshotWriter]] = {}
        self._received: dict[int, Path] = {}
        self._sending: set[int] = set()

    def shutdown(self) -> None:
        self._copy.shutdown()

    # ---- restore ----------------------------------------------------------------------------
    def restore_machine(self, path: Path, meta: SnapshotMeta) -> None:
        with tempfile.NamedTemporaryFile(dir=self._data_dir, suffix=".restore", delete=False) as tmp:
            for chunk in SnapshotStore.iter_data(path):
                tmp.write(chunk)
        try:
            self._machine.restore_snapshot(Path(tmp.name), meta.index)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp.name)
        self._restored()

    def install(self, snapshot: Snapshot) -> None:
        """WAL lane, the machine held by the runner: a snapshot received from the leader."""
        meta = snapshot.meta
        path = self._received.pop(meta.index, None)
        if path is None:
            raise NodeStopped(f"core installed snapshot {meta.index} that was never received")
        self.restore_machine(path, meta)
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)
        self.shippable = (meta, path)

    # ---- compaction -------------------------------------------------------------------------
    async def take(self) -> None:
        """Compact the log (the runner's `snapshotting` is set; cleared here however it ends)."""
        core, runner = self.core, self.runner
        assert core is not None and runner is not None
        tmp = self._data_dir / "snapshot.tmp"
        try:
            index = 0
            if isinstance(self._machine, CheckpointingMachine):
                index = await self._apply.run(self._machine.checkpoint)
                if index:
                    meta = self._meta_at(index) if index > core.log.snapshot_index else None
                    if meta is not None:
                        marker = meta
                        await self._io.run(lambda: self._save_checkpoint(marker))
                        self._compacted(marker)
                        self._metrics.checkpoints += 1
                    return
            index = await self._apply.run(lambda: self._machine.write_snapshot(tmp))
            meta = self._meta_at(index) if index > core.log.snapshot_index else None
            if meta is None:
                return
            self.shippable = (meta, await self._io.run(lambda: self._save_snapshot(meta, tmp)))
            self._compacted(meta)
            self._metrics.snapshots += 1
        except Exception as exc:
            self._fail(exc)
        finally:
            runner.snapshot_done()

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
        self.store.save_checkpoint(meta)
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)

    def _save_snapshot(self, meta: SnapshotMeta, tmp: Path) -> Path:
        path = self.store.save(meta, tmp)
        tmp.unlink()
        assert self.wal is not None
        self.wal.compact(meta.index, meta.term)
        return path

    async def _file(self, at_least: int) -> tuple[SnapshotMeta, Path] | None:
        """A snapshot file covering `at_least`, written now if the newest file is older.

        With checkpoints a node keeps no full copy of its store; a follower too far behind gets
        one made on demand: for a SQLite machine a copy through its own read transaction, on a
        thread of its own while applies go on."""
        runner = self.runner
        assert runner is not None
        if self.shippable is not None and self.shippable[0].index >= at_least and self.shippable[1].exists():
            return self.shippable
        while runner.snapshotting or self._copying:  # one copy at a time; else the machine is shared
            await asyncio.sleep(0.01)
            if self.stopping:
                return None
        if self.shippable is not None and self.shippable[0].index >= at_least and self.shippable[1].exists():
            return self.shippable
        self._copying = True
        runner.snapshotting = True  # no inline apply, no compaction: the state must hold still
        tmp = self._data_dir / "snapshot-copy.tmp"
        copy: PinnedCopy | None = None
        try:
            if isinstance(self._machine, CopyPinningMachine):
                # Pin the state on the apply lane (a read transaction begun between applies:
                # milliseconds), name it while its term is still in the log, then let applies and
                # compaction go on while the pinned state is copied on a thread of its own.
                copy = await self._apply.run(self._machine.open_copy)
            if copy is not None:
                meta = self._meta_at(copy.index)
                runner.snapshot_done()
                if meta is None:
                    return None
                pinned = copy
                await self._copy.run(lambda: pinned.write(tmp))
            else:
                index = await self._apply.run(lambda: self._machine.write_snapshot(tmp))
                meta = self._meta_at(index)
                runner.snapshot_done()
                if meta is None:
                    return None
            # Framing a multi-GB copy takes long: not on the WAL thread, which the log needs.
            path = await self._copy.run(lambda: self.store.save(meta, tmp))
            self._metrics.snapshots += 1
            self.shippable = (meta, path)
            return meta, path
        finally:
            if copy is not None:
                copy.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            self._copying = False
            if runner.snapshotting:
                runner.snapshot_done()

    # ---- receiving ----------------------------------------------------------------------------
    def receive_chunk(self, chunk: codec.SnapshotChunk) -> None:
        if chunk.to != self._node_id:
            raise codec.CodecError("snapshot chunk for another node")
        current = self._receiving.get(chunk.frm)
        if chunk.offset == 0:
            if current is not None:
                current[1].abort()
            current = (chunk.meta, self.store.begin_receive(chunk.meta))
            self._receiving[chunk.frm] = current
        if current is None or current[0] != chunk.meta:
            return  # a chunk of a transfer we are not assembling: the leader will resend
        current[1].write_chunk(chunk.data, chunk.offset)
        if chunk.last:
            del self._receiving[chunk.frm]
            path = current[1].finish()
            self._received[chunk.meta.index] = path
            assert self.deliver is not None
            self.deliver(
                Message(
                    MessageType.SNAP, to=chunk.to, frm=chunk.frm, term=chunk.term, snapshot=Snapshot(meta=chunk.meta)
                )
            )

    # ---- sending ------------------------------------------------------------------------------
    def send(self, m: Message) -> None:
        core = self.core
        if m.to in self._sending or core is None:
            return
        self._sending.add(m.to)
        asyncio.get_running_loop().create_task(self._prepare_and_stream(m, core.log.snapshot_index))

    async def _prepare_and_stream(self, m: Message, at_least: int) -> None:
        try:
            found = await self._file(at_least)
        except Exception as exc:
            self._sending.discard(m.to)
            self._fail(exc)
            return
        if found is None:
            self._sending.discard(m.to)
            if self.core is not None:
                self.core.report_snapshot_failed(m.to)
            return
        await self._stream(m, *found)

    async def _stream(self, m: Message, meta: SnapshotMeta, path: Path) -> None:
        transport = self.transport
        assert transport is not None
        try:
            # One open file for the whole transfer: a newer checkpoint may delete this snapshot
            # file meanwhile, and an open descriptor keeps its bytes readable until we are done.
            source = open(path, "rb")  # noqa: SIM115 - closed in the finally below
        except FileNotFoundError:
            self._sending.discard(m.to)
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
                while not transport.send(m.to, FrameType.SNAP_CHUNK, codec.encode_chunk(chunk)):
                    await asyncio.sleep(0.05)
                    if self.stopping:
                        return
                offset += len(data)
                if last:
                    return
                await asyncio.sleep(0)
        finally:
            source.close()
            self._sending.discard(m.to)
