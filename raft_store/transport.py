"""asyncio TCP between nodes and from clients: framed binary, bounded, self-healing.

Each node listens on one address. A connection opens with a HELLO frame naming the sender (a
node id, or 0 for a client) and the cluster id; frames that do not decode, a wrong cluster id or
an oversized frame close the connection (a peer that sends garbage is disconnected, not
trusted). Node-to-node traffic flows over one outbound connection per peer, fed from a bounded
queue: Raft tolerates lost messages, so when a peer is slow or down we drop and tell the core
(report_unreachable) instead of buffering without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from raft_store.codec import FRAME_BYTES_MAX, FRAME_HEADER, HELLO_MAGIC, CodecError, FrameType, frame

log = logging.getLogger("raft_store.transport")

_HELLO = struct.Struct(">5sQQ")

FrameHandler = Callable[[int, FrameType, bytes], None]
ClientHandler = Callable[["ClientConnection", FrameType, bytes], None]


@dataclass(frozen=True, slots=True)
class TransportConfig:
    cluster_id: int = 1
    queue_frames_max: int = 4096
    queue_bytes_max: int = 64 << 20
    reconnect_min_ms: int = 20
    reconnect_max_ms: int = 1000
    write_buffer_high: int = 4 << 20

    def validate(self) -> None:
        if self.queue_frames_max <= 0 or self.queue_bytes_max <= 0:
            raise ValueError("queue bounds must be positive")
        if not 0 < self.reconnect_min_ms <= self.reconnect_max_ms:
            raise ValueError("need 0 < reconnect_min_ms <= reconnect_max_ms")


def hello(node_id: int, cluster_id: int) -> bytes:
    return frame(FrameType.HELLO, _HELLO.pack(HELLO_MAGIC, node_id, cluster_id))


async def read_frame(reader: asyncio.StreamReader) -> tuple[FrameType, bytes]:
    header = await reader.readexactly(FRAME_HEADER.size)
    length, ftype = FRAME_HEADER.unpack(header)
    if length < 1 or length > FRAME_BYTES_MAX:
        raise CodecError(f"frame length {length} out of bounds")
    try:
        kind = FrameType(ftype)
    except ValueError:
        raise CodecError(f"unknown frame type {ftype}") from None
    body = await reader.readexactly(length - 1) if length > 1 else b""
    return kind, body


async def read_hello(reader: asyncio.StreamReader, cluster_id: int) -> int:
    kind, body = await read_frame(reader)
    return parse_hello(kind, body, cluster_id)


class FrameParser:
    """Splits a byte stream into frames with no coroutine per frame: one `data_received` of
    64 KiB may carry hundreds of small client frames, and parsing them in a loop is the cheap
    way to read them."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[FrameType, bytes]]:
        buf = self._buf
        buf += data
        frames: list[tuple[FrameType, bytes]] = []
        pos = 0
        header = FRAME_HEADER.size
        while len(buf) - pos >= header:
            length, ftype = FRAME_HEADER.unpack_from(buf, pos)
            if length < 1 or length > FRAME_BYTES_MAX:
                raise CodecError(f"frame length {length} out of bounds")
            end = pos + 4 + length
            if end > len(buf):
                break
            try:
                kind = FrameType(ftype)
            except ValueError:
                raise CodecError(f"unknown frame type {ftype}") from None
            frames.append((kind, bytes(buf[pos + header : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames


def parse_hello(kind: FrameType, body: bytes, cluster_id: int) -> int:
    if kind is not FrameType.HELLO or len(body) != _HELLO.size:
        raise CodecError("connection did not open with HELLO")
    magic, sender, cluster = _HELLO.unpack(body)
    if magic != HELLO_MAGIC:
        raise CodecError("bad HELLO magic")
    if cluster != cluster_id:
        raise CodecError(f"peer belongs to cluster {cluster}, we are {cluster_id}")
    return int(sender)


class CoalescingWriter:
    """Collects the frames written during one event-loop iteration and hands them to the socket
    in one write: at hundreds of replies per batch, one syscall per reply is the hot path."""

    def __init__(self, writer: asyncio.StreamWriter | asyncio.WriteTransport) -> None:
        self._writer = writer
        self._parts: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._parts:
            self._loop.call_soon(self._flush)
        self._parts.append(data)

    def _flush(self) -> None:
        parts, self._parts = self._parts, []
        if parts and not self._writer.is_closing():
            self._writer.write(b"".join(parts))


class ClientConnection:
    """One client's connection; replies may be sent from any task of the event loop."""

    def __init__(self, writer: asyncio.WriteTransport) -> None:
        self._writer = writer
        self._out = CoalescingWriter(writer)
        self.closed = False

    def send(self, ftype: FrameType, body: bytes) -> None:
        if not self.closed:
            self._out.write(frame(ftype, body))

    def close(self) -> None:
        self.closed = True
        self._writer.close()


class _PeerLink:
    """The outbound connection to one peer and its bounded send queue."""

    def __init__(self, transport: Transport, peer: int, address: tuple[str, int]) -> None:
        self.transport = transport
        self.peer = peer
        self.address = address
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.wakeup = asyncio.Event()
        self.connected = False
        self.writer: asyncio.StreamWriter | None = None
        self.dropped = 0
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-{peer}")

    def enqueue(self, data: bytes) -> bool:
        cfg = self.transport.config
        writer = self.writer
        if (
            writer is not None
            and not self.queue
            and not writer.is_closing()
            and writer.transport.get_write_buffer_size() < cfg.write_buffer_high
        ):
            # Connected and nothing queued: hand the frame to the socket now, not one event-loop
            # turn later through the pump task.
            writer.write(data)
            return True
        if len(self.queue) >= cfg.queue_frames_max or self.queued_bytes + len(data) > cfg.queue_bytes_max:
            self.dropped += 1
            return False
        self.queue.append(data)
        self.queued_bytes += len(data)
        self.wakeup.set()
        return True

    async def _run(self) -> None:
        cfg = self.transport.config
        backoff = cfg.reconnect_min_ms
        rng = random.Random()
        while not self.transport.closing:
            writer: asyncio.StreamWriter | None = None
            try:
                _, opened = await asyncio.wait_for(asyncio.open_connection(*self.address), 2.0)
                writer = opened
                opened.transport.set_write_buffer_limits(high=cfg.write_buffer_high)
                opened.write(hello(self.transport.node_id, cfg.cluster_id))
                self.connected = True
                self.writer = opened
                backoff = cfg.reconnect_min_ms
                await self._pump(opened)
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                pass
            except RuntimeError:
                pass  # uvloop: the transport closed under us (peer gone)
            except Exception:  # never let the link die: a dead link is a silent partition
                log.exception("link to peer %d failed", self.peer)
            finally:
                self.connected = False
                self.writer = None
                if writer is not None:
                    # abort, not close: close would wait to flush data a dead peer never reads.
                    writer.transport.abort()
            if self.transport.is_closing():
                return
            # Whatever was queued for a dead connection is stale by the time we are back.
            self._discard_queue()
            self.transport.on_unreachable(self.peer)
            await asyncio.sleep(rng.uniform(backoff / 2, backoff) / 1000)
            backoff = min(backoff * 2, cfg.reconnect_max_ms)

    async def _pump(self, writer: asyncio.StreamWriter) -> None:
        while not self.transport.closing:
            if not self.queue:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            if writer.is_closing():
                raise ConnectionResetError("peer closed the connection")
            batch = list(self.queue)
            self.queue.clear()
            self.queued_bytes = 0
            writer.writelines(batch)
            await writer.drain()

    def _discard_queue(self) -> None:
        self.dropped += len(self.queue)
        self.queue.clear()
        self.queued_bytes = 0


class Transport:
    def __init__(
        self,
        node_id: int,
        listen: tuple[str, int],
        peers: dict[int, tuple[str, int]],
        on_peer_frame: FrameHandler,
        on_client_frame: ClientHandler,
        config: TransportConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.listen = listen
        self.peers = dict(peers)
        self.config = config or TransportConfig()
        self.config.validate()
        self.on_peer_frame = on_peer_frame
        self.on_client_frame = on_client_frame
        self.on_unreachable: Callable[[int], None] = lambda peer: None
        self.closing = False
        self._links: dict[int, _PeerLink] = {}
        self._server: asyncio.Server | None = None
        self._inbound: set[_Inbound] = set()

    def is_closing(self) -> bool:
        return self.closing

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Inbound(self), *self.listen, reuse_address=True)

    def add_peer(self, peer: int, address: tuple[str, int]) -> None:
        self.peers[peer] = address

    def send(self, peer: int, ftype: FrameType, body: bytes) -> bool:
        link = self._links.get(peer)
        if link is None:
            address = self.peers.get(peer)
            if address is None:
                return False
            link = self._links[peer] = _PeerLink(self, peer, address)
        return link.enqueue(frame(ftype, body))

    def is_connected(self, peer: int) -> bool:
        link = self._links.get(peer)
        return link is not None and link.connected

    async def close(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for link in self._links.values():
            link.wakeup.set()
            link.task.cancel()
        for inbound in list(self._inbound):
            inbound.abort()
        await asyncio.gather(*(link.task for link in self._links.values()), return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)


class _Inbound(asyncio.Protocol):
    """One accepted connection: a peer's (Raft frames in) or a client's (requests in, results
    out). The first frame must be HELLO; anything malformed aborts the connection."""

    def __init__(self, owner: Transport) -> None:
        self.owner = owner
        self.parser = FrameParser()
        self.sender: int | None = None
        self.client: ClientConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but implement it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=self.owner.config.write_buffer_high)
        self.owner._inbound.add(self)
        self._hello_timer = asyncio.get_running_loop().call_later(5.0, self.abort)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            for ftype, body in self.parser.feed(data):
                self._dispatch(ftype, body)
        except CodecError as exc:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.warning("disconnecting %s: %s", peer, exc)
            self.abort()

    def _dispatch(self, ftype: FrameType, body: bytes) -> None:
        if self.sender is None:
            self.sender = parse_hello(ftype, body, self.owner.config.cluster_id)
            if self._hello_timer is not None:
                self._hello_timer.cancel()
            if self.sender == 0:
                assert self.transport is not None
                self.client = ClientConnection(self.transport)
            return
        if self.client is not None:
            self.owner.on_client_frame(self.client, ftype, body)
            return
        if ftype not in (FrameType.RAFT, FrameType.SNAP_CHUNK):
            raise CodecError(f"peer {self.sender} sent a {ftype.name} frame")
        self.owner.on_peer_frame(self.sender, ftype, body)

    def pause_writing(self) -> None:
        # A client that does not read its results stops being read: bounded memory per client.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client is not None:
            self.client.closed = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.owner._inbound.discard(self)
