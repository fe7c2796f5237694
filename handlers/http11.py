"""A small HTTP/1.1 client for the gateway: asyncio protocols, httptools' parser (llhttp, in C),
and a bounded pool of keep-alive connections.

Why its own: the gateway's rule (repeat a request inside an attempt only when it *certainly* was
not sent) needs to know exactly whether a byte of the request reached the socket, and a worker
spends its CPU in the HTTP client. Here every failure says which side of the first write it
happened on (`NotSentError` or `SentError`), because the write is one call in this module; and a
request costs a future, a timer and one parse (docs/worker.md has the figures against httpx,
aiohttp and httpcore on this machine).

Owns, per pool (one per downstream):
- connections by origin (scheme, host, port), at most `connections_max` open or opening, at most
  `keepalive_max` idle, each idle one closed once `keepalive_expiry_s` old; a connection goes back
  to the pool only after an answer was read whole and the server allows keep-alive;
- a timeout per phase: waiting for a free connection (`pool_timeout_s`), connecting (TLS
  included), writing (only while the socket's buffer is full), and every wait for the next bytes
  of the answer (`read_timeout_s`), each cut short by the caller's deadline;
- answers framed by Content-Length, chunked, or the connection's end; gzip and deflate bodies
  decoded; at most `body_max` bytes of a body kept (the rest is not read: the connection is closed).

A server's close of an idle connection reaches its protocol as soon as the event loop sees it, so
an idle connection is known dead before it is reused (httpcore polls each socket for this).

Must never: reuse a connection whose answer was not read whole; write a request twice; follow a
redirect; take a proxy or certificates from the environment; put a header or a body in an error.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, cast

import httptools

from handlers.http_request import (
    ConnectError,
    ConnectionLost,
    ConnectTimeout,
    DeadlineAfterSend,
    DeadlineBeforeSend,
    DecodingError,
    HttpError,
    NotSentError,
    Origin,
    PoolLimits,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    Response,
    SendByPassed,
    Target,
    WriteTimeout,
    encode_head,
)

_NO_BODY_STATUSES: Final = frozenset({204, 304})
_SWEEP_SLACK_S: Final = 0.001


# ---- one connection ----------------------------------------------------------------------------
class _Decoder:
    """gzip or deflate, bounded: never inflates more than the room left for the body."""

    def __init__(self, encoding: str) -> None:
        self._gzip = encoding in {"gzip", "x-gzip"}
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)
        self._first = True

    def decode(self, data: bytes, room: int) -> bytes:
        try:
            return self._inflate.decompress(data, room + 1)
        except zlib.error:
            if self._gzip or not self._first:
                raise
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)  # deflate without its zlib wrapper
            return self._inflate.decompress(data, room + 1)
        finally:
            self._first = False


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one exchange at a time, its answer parsed as it arrives."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.counted = False
        """Whether the pool counts it among its open connections (until it closes)."""
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._future: asyncio.Future[Response] | None = None
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        # the exchange in progress
        self._status = 0
        self._began = False
        self._headers: list[tuple[str, str]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._body_max = 0
        self._head_only = False
        self._headers_done = False
        self._until_close = False
        self._decoder: _Decoder | None = None
        self._reusable = False
        self._last_read_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports implement it without subclassing

    def data_received(self, data: bytes) -> None:
        if self._future is None:  # nothing was asked: the server is not speaking HTTP/1.1 with us
            self.close()
            return
        self._last_read_s = self.pool.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(RemoteProtocolError("the server switched protocols"))
        except httptools.HttpParserError as error:
            self._fail(RemoteProtocolError(f"not an HTTP/1.1 answer: {str(error)[:100]}"))

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        if self._future is not None and not self._future.done():
            if self._headers_done and self._until_close:
                self._complete()  # an answer framed by the end of the connection
            else:
                said = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
                where = "mid-answer" if self._began else "before any answer"
                self._fail(ConnectionLost(f"the connection closed {where}{said}"[:200]))
        self._mark_closed()
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._began = True
        if self._future is None or self._future.done():
            self._reusable = False  # a second answer to one request: never reuse this connection

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = self._status = parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer (103 Early Hints): the real one follows
        self._headers_done = True
        framed = chunked = False
        encoding = ""
        for name, value in self._headers:
            if name == "content-length":
                framed = True
            elif name == "transfer-encoding":
                chunked = True
            elif name == "content-encoding":
                encoding = value.lower()
        self._until_close = not (framed or chunked or self._head_only or status in _NO_BODY_STATUSES)
        if encoding in {"gzip", "x-gzip", "deflate"}:
            self._decoder = _Decoder(encoding)
        if self._head_only:  # llhttp cannot be told a HEAD answer has no body: finish and never reuse
            self._complete()

    def on_body(self, body: bytes) -> None:
        future = self._future
        if future is None or future.done():
            return
        room = self._body_max - self._size
        if self._decoder is not None:
            try:
                body = self._decoder.decode(body, room)
            except zlib.error as error:
                self._fail(DecodingError(str(error)))
                return
        if len(body) > room:
            self._chunks.append(body[:room])
            self._size = self._body_max
            self._complete(truncated=True)
            return
        self._chunks.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:
            self._headers.clear()  # the interim answer's headers are not the answer's
            return
        if self._future is not None and not self._future.done():
            self._reusable = self._parser.should_keep_alive() and not self._head_only
            self._complete()

    # ---- the exchange ----------------------------------------------------------------------
    async def exchange(self, data: bytes, *, body_max: int, head_only: bool, deadline: float) -> Response:
        """Writes `data` (from here on the request counts as sent) and reads the answer."""
        limits = self.pool.limits
        loop = self.pool.loop
        future = self._future = loop.create_future()
        self._reset(body_max, head_only)
        assert self.transport is not None
        self.transport.write(data)
        try:
            if self._paused:
                await self._drain(min(loop.time() + limits.write_timeout_s, deadline), deadline)
            self._last_read_s = now = loop.time()
            self._timer = loop.call_at(min(now + limits.read_timeout_s, deadline), self._read_due, deadline)
            response: Response = await future
            return response
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._future = None
            if not (future.done() and not future.cancelled() and future.exception() is None and self._reusable):
                self.close()

    def _reset(self, body_max: int, head_only: bool) -> None:
        self._status = 0
        self._began = False
        self._headers = []
        self._chunks = []
        self._size = 0
        self._body_max = body_max
        self._head_only = head_only
        self._headers_done = False
        self._until_close = False
        self._decoder = None
        self._reusable = False

    async def _drain(self, limit: float, deadline: float) -> None:
        """While the socket's buffer is over its high-water mark: the write phase's timeout."""
        loop = self.pool.loop
        resumed = self._resumed = loop.create_future()
        timer = loop.call_at(limit, _expire, resumed)
        try:
            await resumed
        except TimeoutError:
            raise (DeadlineAfterSend("the deadline passed while writing") if limit >= deadline
                   else WriteTimeout(f"the request was not written within {self.pool.limits.write_timeout_s} s")) from None  # fmt: skip
        finally:
            timer.cancel()
            self._resumed = None

    def _read_due(self, deadline: float) -> None:
        """The read timer: a timeout only if nothing arrived for `read_timeout_s` (data moves the
        limit; the timer is set again for the new one rather than on every arrival)."""
        future = self._future
        if future is None or future.done():
            return
        loop = self.pool.loop
        limit = min(self._last_read_s + self.pool.limits.read_timeout_s, deadline)
        if loop.time() + _SWEEP_SLACK_S < limit:
            self._timer = loop.call_at(limit, self._read_due, deadline)
        elif limit >= deadline:
            self._fail(DeadlineAfterSend("the deadline passed before the answer was whole"))
        else:
            self._fail(ReadTimeout(f"no bytes of the answer for {self.pool.limits.read_timeout_s} s"))

    def _complete(self, *, truncated: bool = False) -> None:
        future = self._future
        if future is None or future.done():
            return
        if truncated:
            self._reusable = False
        future.set_result(Response(self._status, tuple(self._headers), b"".join(self._chunks), truncated))

    def _fail(self, error: HttpError) -> None:
        self._reusable = False
        if self._future is not None and not self._future.done():
            self._future.set_exception(error)
        self.close()

    # ---- life ------------------------------------------------------------------------------
    def reusable_at(self, now: float) -> bool:
        return not self.closed and now - self.idle_since < self.pool.limits.keepalive_expiry_s

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._mark_closed()

    def _mark_closed(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


# ---- the pool ----------------------------------------------------------------------------------
class Pool:
    """Connections to any number of origins, bounded as a whole (a callback gateway reaches many
    targets through one pool)."""

    def __init__(self, limits: PoolLimits, *, ssl_context: Callable[[], ssl.SSLContext] | None = None) -> None:
        self.limits = limits
        self._ssl_factory = ssl_context or _default_ssl_context
        self._ssl: ssl.SSLContext | None = None
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        """Connections open or being opened: at most `connections_max`."""
        self._busy: set[_Connection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return self._idle_count

    async def request(
        self, method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes, *, deadline: float,
        body_max: int, send_by: float | None = None,
    ) -> Response:  # fmt: skip
        """One exchange. Raises a `NotSentError` when nothing was written, a `SentError` when the
        request was written and no whole answer came, ValueError for a request that cannot be sent.
        `send_by` (`time.monotonic`): once a connection is ready, past it nothing is written."""
        if self._closed:
            raise RuntimeError("the HTTP pool is closed")
        data = encode_head(method, target, headers, body)
        if body:
            data += body
        connection = await self._acquire(target.origin, deadline)
        self._busy.add(connection)
        try:
            if send_by is not None and time.monotonic() >= send_by:  # the last moment before a byte goes out
                raise SendByPassed("the send-by moment passed before the request was written")
            return await connection.exchange(data, body_max=body_max, head_only=method == "HEAD", deadline=deadline)
        finally:
            self._busy.discard(connection)
            self._release(connection)

    async def aclose(self) -> None:
        self._closed = True
        for connection in [c for idle in self._idle.values() for c in idle] + list(self._busy):
            connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ---- acquiring -------------------------------------------------------------------------
    async def _acquire(self, origin: Origin, deadline: float) -> _Connection:
        loop = self._loop = self._loop or asyncio.get_running_loop()
        limit = min(loop.time() + self.limits.pool_timeout_s, deadline)
        while True:
            if self._closed:
                raise RuntimeError("the HTTP pool is closed")
            connection = self._take_idle(origin, loop.time())
            if connection is not None:
                return connection
            if self._open < self.limits.connections_max or self._close_one_idle():
                return await self._connect(origin, deadline)
            await self._wait(limit, deadline)

    def _take_idle(self, origin: Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if connection.reusable_at(now):
                return connection
            connection.close()
        return None

    def _close_one_idle(self) -> bool:
        """Makes room for a new connection by closing the longest-idle one of any origin."""
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.origin].remove(oldest)
        self._idle_count -= 1
        oldest.close()
        return True

    async def _wait(self, limit: float, deadline: float) -> None:
        loop = self.loop
        if loop.time() >= limit:
            raise self._waited_too_long(limit, deadline)
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_at(limit, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise self._waited_too_long(limit, deadline) from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._wake_one()  # the wake-up was meant for someone: pass it on
            raise
        finally:
            timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled while still queued
                self._waiters.remove(waiter)

    def _waited_too_long(self, limit: float, deadline: float) -> NotSentError:
        if limit >= deadline:
            return DeadlineBeforeSend("the deadline passed waiting for a connection")
        return PoolTimeout(f"no connection free within {self.limits.pool_timeout_s} s")

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: Origin, deadline: float) -> _Connection:
        loop = self.loop
        self._open += 1
        connection = _Connection(self, origin)
        left_s = deadline - loop.time()
        deadline_first = left_s <= self.limits.connect_timeout_s
        try:
            if left_s <= 0:
                raise DeadlineBeforeSend("the deadline passed before connecting")
            tls = self._context() if origin.scheme == "https" else None
            async with asyncio.timeout(min(left_s, self.limits.connect_timeout_s)):
                await loop.create_connection(lambda: connection, origin.host, origin.port, ssl=tls,
                                             server_hostname=origin.host if tls else None)  # fmt: skip
            if connection.closed:
                raise ConnectError("the server closed the connection as it was made")
        except TimeoutError:
            self._lost_slot()
            raise (DeadlineBeforeSend("the deadline passed while connecting") if deadline_first
                   else ConnectTimeout(f"no connection within {self.limits.connect_timeout_s} s")) from None  # fmt: skip
        except (OSError, ssl.SSLError) as error:
            self._lost_slot()
            raise ConnectError(f"{type(error).__name__}: {error}"[:200]) from None
        except BaseException:
            self._lost_slot()
            connection.close()
            raise
        connection.counted = True
        return connection

    def _lost_slot(self) -> None:
        self._open -= 1
        self._wake_one()

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = self._ssl_factory()
        return self._ssl

    # ---- releasing -------------------------------------------------------------------------
    def _release(self, connection: _Connection) -> None:
        if connection.closed:
            return  # forget() already freed its slot
        if self._closed or self.limits.keepalive_max == 0:
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1
        if self._idle_count > self.limits.keepalive_max:
            self._close_one_idle()
        self._wake_one()

    def forget(self, connection: _Connection) -> None:
        """A connection closed (by either side): its slot is free."""
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
            self._idle_count -= 1
        if connection.counted:
            connection.counted = False
            self._open -= 1
            self._wake_one()


def _default_ssl_context() -> ssl.SSLContext:
    """certifi's roots, as httpx used them; nothing from the environment."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())
