"""The gateway's HTTP/1.1 client against scripted servers on loopback: a connection cut at each
phase of a call is classified by which side of the request's write it happened on (not sent, so
repeated inside the attempt; or an unknown outcome, never repeated), answers framed every way are
read whole, and a connection is reused only after a whole answer.

The scripted server counts connections and requests, so "never repeated" is checked on the
server's side."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from handlers_support import FAST

from handlers import http_request
from handlers.answers import Answer, NotSent, NotSentClass, OutcomeUnknown, UnknownClass
from handlers.gateway import Gateway, GatewaySettings, Outbound

BODY = b'{"transfer_id":"t-1"}'
POST = Outbound(method="POST", url="/transfers", body=BODY, headers=(("content-type", "application/json"),))
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Served:
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    """Each request's head and body as the server read them (whole ones only)."""


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Served], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader, served: Served) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    request = head + await reader.readexactly(length)
    served.requests.append(request)
    return request


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox would."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[Served]:
    served = Served()
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await script(reader, writer, served)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went, or the test ended
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    served.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield served
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await server.wait_closed()


def gateway(url: str, settings: GatewaySettings = FAST) -> Gateway:
    return Gateway(downstream="payment", settings=settings, base_url=url, rng=random.Random(1))


async def send(url: str, request: Outbound = POST, settings: GatewaySettings = FAST) -> object:
    client = gateway(url, settings)
    try:
        return await client.send(request)
    finally:
        await client.aclose()


# ---- a cut at each phase -----------------------------------------------------------------------
async def test_a_cut_before_any_byte_is_written_is_not_sent_and_tried_again() -> None:
    """The server closes each kept-alive connection once idle: the client sees it before reusing
    it, so the next request is written on a new connection, once."""

    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        writer.write(OK)
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    async with scripted(one_answer_then_close) as served:
        client = gateway(served.url)
        try:
            first = await client.send(POST)
            await asyncio.sleep(0.2)  # the reset has arrived; the connection sits idle in the pool
            second = await client.send(POST)
        finally:
            await client.aclose()
    assert isinstance(first, Answer) and isinstance(second, Answer)
    assert (served.connections, len(served.requests)) == (2, 2)


async def test_a_server_gone_before_the_write_is_not_sent_after_every_try() -> None:
    async with scripted(answering(OK)) as served:
        client = gateway(served.url)
        first = await client.send(POST)  # never raises: the gateway's outcomes are values
    try:
        await asyncio.sleep(0.1)  # the server is gone: its listening socket and the idle connection
        second = await client.send(POST)
    finally:
        await client.aclose()
    assert isinstance(first, Answer)
    assert isinstance(second, NotSent)
    assert (second.error_class, second.tries) == (NotSentClass.CONNECT_FAILED, FAST.connect_tries_max)
    assert len(served.requests) == 1


async def test_a_cut_in_the_middle_of_the_request_is_an_unknown_outcome() -> None:
    async def reset_mid_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await reader.readexactly(10)
        reset(writer)

    async with scripted(reset_mid_headers) as served:
        outcome = await send(served.url)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert served.connections == 1  # never repeated inside the attempt


async def test_a_cut_after_the_request_before_any_answer_is_an_unknown_outcome() -> None:
    async def read_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        writer.close()

    async with scripted(read_then_close) as served:
        outcome = await send(served.url)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert outcome.detail.startswith("ConnectionLost: the connection closed before any answer")
    assert (served.connections, len(served.requests)) == (1, 1)


@pytest.mark.parametrize(
    "partial",
    [
        b"HTTP/1.1 200 OK\r\nContent-Le",  # mid-headers of the answer
        b'HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{"transfer_id"',  # mid-body
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",  # between chunks
    ],
    ids=["mid-answer-headers", "mid-body", "between-chunks"],
)
async def test_a_cut_in_the_middle_of_the_answer_is_an_unknown_outcome(partial: bytes) -> None:
    async def answer_partly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        writer.write(partial)
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    async with scripted(answer_partly) as served:
        outcome = await send(served.url)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert outcome.detail.startswith("ConnectionLost: the connection closed mid-answer")
    assert (served.connections, len(served.requests)) == (1, 1)


async def test_silence_after_the_request_is_a_timeout_never_repeated() -> None:
    async def read_then_wait(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        await asyncio.sleep(5)

    async with scripted(read_then_wait) as served:
        outcome = await send(served.url)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.TIMEOUT
    assert outcome.detail.startswith("ReadTimeout: ")
    assert (served.connections, len(served.requests)) == (1, 1)


async def test_a_request_the_server_never_reads_is_a_write_timeout_an_unknown_outcome() -> None:
    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await asyncio.sleep(5)

    big = Outbound(method="POST", url="/upload", body=b"x" * (64 << 20))
    async with scripted(never_read) as served:
        outcome = await send(served.url, big)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.TIMEOUT
    assert outcome.detail.startswith("WriteTimeout: ")
    assert served.connections == 1


async def test_an_answer_that_is_not_http_is_an_unknown_outcome() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with scripted(garbage) as served:
        outcome = await send(served.url)
    assert isinstance(outcome, OutcomeUnknown) and outcome.error_class is UnknownClass.CONNECTION_LOST
    assert outcome.detail.startswith("RemoteProtocolError: ")


# ---- answers and reuse -------------------------------------------------------------------------
def answering(*answers: bytes, keep_open: bool = True) -> Script:
    """Answers the server's n-th request with the n-th of `answers`, whichever connection it
    came on; closes a connection after an answer unless `keep_open`."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        while len(served.requests) < len(answers):
            await read_request(reader, served)
            writer.write(answers[len(served.requests) - 1])
            await writer.drain()
            if not keep_open:
                return
        await reader.read()

    return script


async def exchange_twice(script: Script, settings: GatewaySettings = FAST) -> tuple[object, object, Served]:
    async with scripted(script) as served:
        client = gateway(served.url, settings)
        try:
            first = await client.send(POST)
            second = await client.send(Outbound(method="GET", url="/transfers/t-1"))
        finally:
            await client.aclose()
    return first, second, served


async def test_a_connection_is_reused_after_a_whole_answer() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nchun\r\n3\r\nked\r\n0\r\n\r\n"
    first, second, served = await exchange_twice(answering(OK, chunked))
    assert isinstance(first, Answer) and (first.status, first.body) == (200, b"ok")
    assert isinstance(second, Answer) and second.body == b"chunked"
    assert (served.connections, len(served.requests)) == (1, 2)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_a_connection_the_server_will_close_is_not_reused(answer: bytes) -> None:
    first, second, served = await exchange_twice(answering(answer, answer, keep_open=False))
    assert isinstance(first, Answer) and isinstance(second, Answer) and second.body == b"ok"
    assert (served.connections, len(served.requests)) == (2, 2)


async def test_an_answer_framed_by_the_end_of_the_connection_is_read_whole() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of ")
        await writer.drain()
        writer.write(b"it")
        await writer.drain()
        writer.close()

    first, second, served = await exchange_twice(until_close)
    assert isinstance(first, Answer) and first.body == b"all of it" and first.header("content-type") == "text/plain"
    assert isinstance(second, Answer) and second.body == b"all of it"
    assert served.connections == 2


async def test_a_truncated_body_closes_the_connection() -> None:
    from handlers.answers import BODY_BYTES_MAX

    long = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (BODY_BYTES_MAX + 10) + b"y" * (BODY_BYTES_MAX + 10)
    first, second, served = await exchange_twice(answering(long, OK))
    assert isinstance(first, Answer) and first.body_truncated and len(first.body) == BODY_BYTES_MAX
    assert isinstance(second, Answer) and second.body == b"ok"
    assert served.connections == 2


async def test_an_idle_connection_past_its_keepalive_expiry_is_not_reused() -> None:
    brief = GatewaySettings(connect_timeout_s=0.5, read_timeout_s=0.5, keepalive_expiry_s=0.1)
    async with scripted(answering(OK, OK)) as served:
        client = gateway(served.url, brief)
        try:
            await client.send(POST)
            await asyncio.sleep(0.2)
            second = await client.send(POST)
        finally:
            await client.aclose()
    assert isinstance(second, Answer)
    assert (served.connections, len(served.requests)) == (2, 2)


async def test_interim_answers_gzip_and_head_are_read_as_http_has_them() -> None:
    compressed = gzip.compress(b'{"status":"SUCCEEDED"}')
    early_hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
    zipped = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(compressed) + compressed
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
    async with scripted(answering(early_hints + zipped, head)) as served:
        client = gateway(served.url)
        try:
            unzipped = await client.send(POST)
            headed = await client.send(Outbound(method="HEAD", url="/transfers/t-1"))
        finally:
            await client.aclose()
    assert isinstance(unzipped, Answer) and unzipped.body == b'{"status":"SUCCEEDED"}'
    assert unzipped.header("link") is None  # the interim answer's headers are not the answer's
    assert isinstance(headed, Answer) and (headed.status, headed.body) == (200, b"")


async def test_a_busy_pool_hands_a_freed_connection_to_the_next_waiting_call() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        while True:
            await read_request(reader, served)
            await asyncio.sleep(0.05)
            writer.write(OK)
            await writer.drain()

    one = GatewaySettings(connections_max=1, keepalive_connections_max=1, pool_timeout_s=5.0, read_timeout_s=5.0,
                          connect_timeout_s=5.0)  # a loaded machine must not make a second connection
    async with scripted(slow) as served:
        client = gateway(served.url, one)
        try:
            outcomes = await asyncio.gather(*(client.send(POST) for _ in range(5)))
        finally:
            await client.aclose()
    assert all(isinstance(o, Answer) and o.status == 200 for o in outcomes)
    assert (served.connections, len(served.requests)) == (1, 5)


@pytest.mark.parametrize(("keepalive", "connections"), [(None, 8), (2, 14)])
async def test_a_burst_keeps_its_connections_for_the_next_unless_told_to_keep_fewer(
    keepalive: int | None, connections: int
) -> None:
    """Unset, `keepalive_connections_max` keeps every connection the pool opened (up to
    `connections_max`): a second burst of 8 calls reuses the first burst's 8. Told to keep 2, the
    pool closes 6 as the first burst ends and opens them again for the second."""

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        while True:
            await read_request(reader, served)
            await asyncio.sleep(0.05)  # the burst's calls overlap: each needs a connection of its own
            writer.write(OK)
            await writer.drain()

    settings = GatewaySettings(connections_max=8, keepalive_connections_max=keepalive, pool_timeout_s=5.0,
                               read_timeout_s=5.0, connect_timeout_s=5.0)  # fmt: skip
    async with scripted(held) as served:
        client = gateway(served.url, settings)
        try:
            for _ in range(2):
                outcomes = await asyncio.gather(*(client.send(POST) for _ in range(8)))
                assert all(isinstance(o, Answer) and o.status == 200 for o in outcomes)
        finally:
            await client.aclose()
    assert (served.connections, len(served.requests)) == (connections, 16)


async def test_a_cancelled_call_closes_its_connection_and_frees_its_slot() -> None:
    async def slow_then_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: Served) -> None:
        await read_request(reader, served)
        await asyncio.sleep(5)

    one = GatewaySettings(connections_max=1, keepalive_connections_max=1, pool_timeout_s=0.5, read_timeout_s=5.0)
    async with scripted(slow_then_ok) as served:
        client = gateway(served.url, one)
        try:
            call = asyncio.create_task(client.send(POST))
            await asyncio.sleep(0.1)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.05)
            pool = client._pool  # the slot count is what this test is about
            assert (pool.open_connections, pool.idle_connections) == (0, 0)
        finally:
            await client.aclose()


def test_a_request_that_cannot_be_sent_as_it_is_is_refused_before_any_connection() -> None:
    target = http_request.parse_url("http://127.0.0.1:9/x")
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        http_request.encode_head("POST", target, [("idempotency-key", "k\r\nx-injected: 1")], b"")
    with pytest.raises(ValueError, match="cannot be sent"):
        http_request.encode_head("POST", target, [("content-length", "5")], b"")
    with pytest.raises(ValueError):
        http_request.parse_url("ftp://example.com/")
    assert http_request.parse_url("https://example.com/a b?q=1").path == "/a%20b?q=1"
    assert http_request.parse_url("http://[::1]:8080/").host_header == "[::1]:8080"
