"""asyncio TCP between nodes and from clients: framed binary, bounded, self-healing, authenticated.

Each node listens on one address. A connection opens with the handshake of raft_store/handshake.py
(HELLO naming the sender, a node id or 0 for a client, and the cluster; both sides prove they hold
the cluster secret), over TLS when it is configured; until it succeeds nothing else is read. A
connection that fails it, sends frames that do not decode or an oversized frame is closed, logged
and counted by reason (`refused`, in the node's status and metrics): a peer that sends garbage is
disconnected, not trusted. Node-to-node traffic flows over one outbound connection per peer, fed
from a bounded queue: Raft tolerates lost messages, so when a peer is slow or down we drop and tell
the core (report_unreachable) instead of buffering without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from raft_store.auth import StoreAuth
from raft_store.codec import FRAME_BYTES_MAX, FRAME_HEADER, FRAME_TYPES, CodecError, FrameType, frame
from raft_store.handshake import HANDSHAKE_TIMEOUT_S, DialerHandshake, HandshakeFailed, NodeHandshake, Refusal

log = logging.getLogger("raft_store.transport")

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


async def dial(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handshake: DialerHandshake) -> None:
    """The dialer's side of the handshake on a stream; raises HandshakeFailed, or OSError /
    IncompleteReadError / TimeoutError when the connection fails meanwhile."""

    async def exchange() -> None:
        writer.write(handshake.hello())
        writer.write(handshake.on_challenge(*await read_frame(reader)))
        handshake.on_welcome(*await read_frame(reader))

    await asyncio.wait_for(exchange(), HANDSHAKE_TIMEOUT_S)


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
            kind = FRAME_TYPES.get(ftype)  # (not `FrameType(ftype)`: two Python calls per frame)
            if kind is None:
                raise CodecError(f"unknown frame type {ftype}")
            frames.append((kind, bytes(buf[pos + header : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames


class Writable(Protocol):
    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...


class CoalescingWriter:
    """Collects the frames written during one event-loop iteration and hands them to the socket
    in one write: at hundreds of replies per batch, one syscall per reply is the hot path."""

    def __init__(self, writer: Writable) -> None:
        self._writer = writer
        self._parts: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._parts:
            self._loop.call_soon(self.flush)
        self._parts.append(data)

    def flush(self) -> None:
        """Writes what was collected now, not at the end of the iteration (a no-op when nothing was)."""
        parts, self._parts = self._parts, []
        if parts and not self._writer.is_closing():
            self._writer.write(b"".join(parts))


class ClientConnection:
    """One client's connection; replies may be sent from any task of the event loop."""

    def __init__(self, writer: Writable) -> None:
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
        self.sock: asyncio.WriteTransport | None = None
        """`writer.transport` while connected."""
        self.dropped = 0
        self.refused_by = ""
        """Why the last handshake with this peer failed (logged once, not at every retry)."""
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-{peer}")

    def enqueue(self, data: bytes) -> bool:
        cfg = self.transport.config
        sock = self.sock
        if (
            sock is not None
            and not self.queue
            and not sock.is_closing()
            and sock.get_write_buffer_size() < cfg.write_buffer_high
        ):
            # Connected and nothing queued: hand the frame to the socket now, not one event-loop
            # turn later through the pump task (to the transport itself: the stream writer's
            # methods are Python calls around these, once per heartbeat of an idle set).
            sock.write(data)
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
                auth = self.transport.auth
                host, port = self.address
                reader, opened = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=auth.client_ssl, server_hostname=host if auth.client_ssl else None),
                    2.0,
                )
                writer = opened
                opened.transport.set_write_buffer_limits(high=cfg.write_buffer_high)
                handshake = DialerHandshake(auth.secrets.presented(), self.transport.node_id, cfg.cluster_id)
                await dial(reader, opened, handshake)
                if self.refused_by:
                    log.warning("peer %d lets this node in again", self.peer)
                    self.refused_by = ""
                self.connected = True
                self.writer = opened
                self.sock = opened.transport
                backoff = cfg.reconnect_min_ms
                await self._pump(opened)
            except asyncio.CancelledError:
                raise
            except (HandshakeFailed, CodecError) as exc:
                # Logged when it starts (and when it ends, above), not at every reconnect.
                if str(exc) != self.refused_by:
                    log.warning("peer %d at %s:%d: %s", self.peer, *self.address, exc)
                    self.refused_by = str(exc)
            except ssl.SSLError as exc:
                if str(exc) != self.refused_by:
                    log.warning("peer %d at %s:%d: TLS failed: %s", self.peer, *self.address, exc)
                    self.refused_by = str(exc)
            except (OSError, asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                pass
            except RuntimeError:
                pass  # uvloop: the transport closed under us (peer gone)
            except Exception:  # never let the link die: a dead link is a silent partition
                log.exception("link to peer %d failed", self.peer)
            finally:
                self.connected = False
                self.writer = None
                self.sock = None
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
        *,
        auth: StoreAuth,
        refused: Counter[str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.auth = auth
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
        self.refused: Counter[str] = Counter() if refused is None else refused
        """Connections refused before they were let in, by reason (the node's metrics export it)."""

    def refuse(self, peer: object, reason: str, message: str) -> None:
        self.refused[reason] += 1
        log.warning("refused the connection from %s: %s", peer, message)

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


class _TlsLayer:
    """Server-side TLS over a plain transport, through memory BIOs, so the node sees a failed TLS
    handshake (to log and count it with the dialer's address), which a server started with
    `ssl=` hides inside the event loop. It stands in for the transport as a `Writable`."""

    def __init__(self, context: ssl.SSLContext, transport: asyncio.Transport) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._transport = transport
        self.established = False

    def feed(self, data: bytes) -> bytes:
        """The plaintext that `data` completes; raises ssl.SSLError when the handshake fails."""
        self._incoming.write(data)
        if not self.established:
            try:
                self._tls.do_handshake()
                self.established = True
            except ssl.SSLWantReadError:
                pass
            finally:
                self._flush()
            if not self.established:
                return b""
        chunks = []
        while True:
            try:
                chunk = self._tls.read(256 * 1024)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        self._flush()
        return b"".join(chunks)

    def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending and not self._transport.is_closing():
            self._transport.write(pending)

    def write(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._tls.write(data)
            self._flush()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._transport.close()


class _Inbound(asyncio.Protocol):
    """One accepted connection: a peer's (Raft frames in) or a client's (requests in, results
    out). It must first complete TLS (when configured) and the handshake within
    HANDSHAKE_TIMEOUT_S; a failure is refused: logged, counted, and the connection closed."""

    def __init__(self, owner: Transport) -> None:
        self.owner = owner
        self.parser = FrameParser()
        self.sender: int | None = None
        """Set once the dialer proved it holds the cluster secret."""
        self.client: ClientConnection | None = None
        self.transport: asyncio.Transport | None = None
        self.out: Writable | None = None
        self.tls: _TlsLayer | None = None
        self.handshake: NodeHandshake | None = None
        self.peername: object = None
        self._awaiting_hello = True
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but implement it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=self.owner.config.write_buffer_high)
        self.peername = transport.get_extra_info("peername")
        self.owner._inbound.add(self)
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._timed_out)
        context = self.owner.auth.server_ssl
        if context is not None:
            self.tls = _TlsLayer(context, self.transport)
        self.out = self.tls or self.transport
        self.handshake = NodeHandshake(self.owner.auth.secrets, self.owner.config.cluster_id)

    def _timed_out(self) -> None:
        if self.sender is None:
            self._refuse("timeout", f"no handshake within {HANDSHAKE_TIMEOUT_S} s", tell=False)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _refuse(self, reason: str, message: str, *, tell: bool) -> None:
        self.owner.refuse(self.peername, reason, message)
        self.handshake = None
        if self._timer is not None:
            self._timer.cancel()
        if tell and self.out is not None:
            self.out.write(NodeHandshake.refused())
        if self.transport is not None:
            self.transport.pause_reading()
            if tell:
                self.transport.close()  # after the REFUSED frame is written
            else:
                self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.tls is not None:
            try:
                data = self.tls.feed(data)
            except ssl.SSLError as exc:
                self._refuse("tls", f"TLS handshake failed: {exc}", tell=False)
                return
            if not data:
                return
        try:
            for ftype, body in self.parser.feed(data):
                self._dispatch(ftype, body)
        except Refusal as refusal:
            self._refuse(refusal.reason, str(refusal), tell=True)
        except CodecError as exc:
            if self.sender is None:
                self._refuse("malformed", str(exc), tell=False)
            else:
                log.warning("disconnecting %s: %s", self.peername, exc)
                self.abort()

    def _dispatch(self, ftype: FrameType, body: bytes) -> None:
        if self.sender is None:
            handshake, out = self.handshake, self.out
            if handshake is None or out is None:
                return  # refused: the rest of what it sent is ignored until the close
            if self._awaiting_hello:
                out.write(handshake.on_hello(ftype, body))
                self._awaiting_hello = False
                return
            sender = handshake.on_auth(ftype, body)
            self.sender, self.handshake = sender, None
            if self._timer is not None:
                self._timer.cancel()
            out.write(NodeHandshake.welcome())
            if sender == 0:
                self.client = ClientConnection(out)
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
        if self.sender is None and self.handshake is not None and not self.owner.closing:
            # Gone before the handshake ended: a probe, or a dialer that did not trust our proof.
            self.owner.refused["abandoned"] += 1
            log.info("%s closed the connection during the handshake", self.peername)
        if self._timer is not None:
            self._timer.cancel()
        self.owner._inbound.discard(self)
