"""One client connection to a node (raft_store/client.py's RaftClient holds one per node): the
handshake, then many requests in flight on it, matched to their results by request id. Apart from
the client so that each module stays within its size limit; nothing else uses it."""

from __future__ import annotations

import asyncio
from typing import cast

from raft_store import codec
from raft_store.codec import FrameType
from raft_store.handshake import DialerHandshake, HandshakeFailed
from raft_store.transport import CoalescingWriter, FrameParser

Address = tuple[str, int]


def show_address(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


class Connection(asyncio.Protocol):
    """One connection to a node; many requests in flight, matched to results by request id.
    `ready` resolves once the handshake let us in (or fails with HandshakeFailed)."""

    def __init__(self, address: Address, handshake: DialerHandshake) -> None:
        self.address = address
        self.handshake: DialerHandshake | None = handshake
        self._challenged = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parser = FrameParser()
        self.pending: dict[int, asyncio.Future[tuple[FrameType, bytes]]] = {}
        self.status_waiters: list[asyncio.Future[tuple[FrameType, bytes]]] = []
        self.transport: asyncio.Transport | None = None
        self.out: CoalescingWriter | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but implement it.
        self.transport = cast(asyncio.Transport, transport)
        self.out = CoalescingWriter(self.transport)
        assert self.handshake is not None
        self.transport.write(self.handshake.hello())

    def _handshake(self, ftype: FrameType, body: bytes) -> None:
        handshake = self.handshake
        assert handshake is not None and self.transport is not None
        if not self._challenged:
            self._challenged = True
            self.transport.write(handshake.on_challenge(ftype, body))
            return
        handshake.on_welcome(ftype, body)
        self.handshake = None
        if not self.ready.done():
            self.ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.parser.feed(data)
            for ftype, body in frames:
                if self.handshake is not None:
                    self._handshake(ftype, body)
                elif ftype is FrameType.RESULT:
                    future = self.pending.pop(codec.result_request_id(body), None)
                    if future is not None and not future.done():
                        future.set_result((ftype, body))
                elif ftype is FrameType.STATUS_RESULT and self.status_waiters:
                    waiter = self.status_waiters.pop(0)
                    if not waiter.done():
                        waiter.set_result((ftype, body))
        except (codec.CodecError, HandshakeFailed) as exc:
            self._fail(exc)
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("closed by the node"))

    def _fail(self, exc: BaseException) -> None:
        self.lost = True
        if not self.ready.done():
            self.ready.set_exception(exc if isinstance(exc, HandshakeFailed) else ConnectionError(
                f"connection to {show_address(self.address)} lost during the handshake: {exc!r}"))  # fmt: skip
            self.ready.exception()  # retrieved here: nobody may be waiting any more
        for future in [*self.pending.values(), *self.status_waiters]:
            if not future.done():
                future.set_exception(ConnectionError(f"connection to {self.address} lost: {exc!r}"))
        self.pending.clear()
        self.status_waiters.clear()

    def write(self, data: bytes) -> None:
        assert self.out is not None
        self.out.write(data)

    @property
    def alive(self) -> bool:
        return not self.lost

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._fail(ConnectionError("closed"))
