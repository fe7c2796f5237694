"""The network's faults between the workers and a downstream: a small HTTP/1.1 proxy.

    python -m handlers.standins.proxy --listen 127.0.0.1:7301 --upstream 127.0.0.1:7201 \\
        --hold-rate 0.2 --hold-s 0.5-4 --drop-rate 0.1 --slow-rate 0.1 --slow-s 2 --seed 1

The stand-ins fail on their side of the wire (handlers/standins/faults.py); what they cannot do is
what the network does to a request that has left the worker. For each request of the chosen
methods (POST by default: the money-moving ones) the proxy draws one fate:
- hold: keep the whole request for a while (uniform in `hold_s`), then deliver it, whether or not
  the worker is still waiting: the request the worker gave up on arrives after its read timeout,
  perhaps after another delivery looked the transfer up and found nothing;
- lose: never deliver it, and cut the worker's connection (nothing was applied, the outcome is
  unknown to the worker);
- drop: deliver it, read the whole answer (the downstream committed), and cut the worker's
  connection without it;
- slow: deliver it and hold the answer back for `slow_s`, past the worker's read timeout;
- pass: deliver it and its answer.
Other requests (the lookups) pass. Each request goes upstream on a connection of its own, so a
held request never blocks another; the worker's connections are kept alive between requests.

Runs in a thread of its own (`running_proxy`, for tests) or as a process (the command above, for
a fault run from outside). Must never: change a byte of a request or an answer it delivers, or
deliver a request twice.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

HEAD_BYTES_MAX: Final = 64 * 1024
BODY_BYTES_MAX: Final = 8 * 1024 * 1024
FATES: Final = ("pass", "hold", "lose", "drop", "slow")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyFaults:
    hold_rate: float = 0.0
    hold_s: tuple[float, float] = (1.0, 1.0)
    lose_rate: float = 0.0
    drop_rate: float = 0.0
    slow_rate: float = 0.0
    slow_s: float = 1.0
    methods: tuple[str, ...] = ("POST",)
    seed: int | None = None

    def problems(self) -> list[str]:
        rates = (self.hold_rate, self.lose_rate, self.drop_rate, self.slow_rate)
        found = [] if all(0.0 <= r <= 1.0 for r in rates) and sum(rates) <= 1.0 else ["rates in 0..1, summing to at most 1"]
        if not 0.0 <= self.hold_s[0] <= self.hold_s[1] or self.slow_s < 0:
            found.append("hold_s a range low-high of seconds, slow_s seconds")
        return found


@dataclass(slots=True)
class _Message:
    raw: bytes
    method: str
    path: str


class _Closed(Exception):
    """The other side closed, or sent something that is not HTTP/1.1 this proxy can frame."""


async def _read_message(reader: asyncio.StreamReader) -> _Message:
    """One whole request or answer: its head and its body (by Content-Length, or chunked)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as error:
        raise _Closed from error
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:] if line)}
    body = b""
    try:
        if fields.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                chunks.append(size_line + chunk)
                if size == 0:
                    break
            body = b"".join(chunks)
        elif "content-length" in fields:
            length = int(fields["content-length"])
            if length > BODY_BYTES_MAX:
                raise _Closed
            body = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError) as error:
        raise _Closed from error
    method, path = (first[0], first[1]) if len(first) >= 2 else ("", "")
    return _Message(raw=head + body, method=method, path=path)


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    faults: ProxyFaults = field(default_factory=ProxyFaults)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    """Fates drawn, by name ("pass", "hold", ...), and "lookup" for requests of other methods."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.faults.seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def configure(self, faults: ProxyFaults) -> None:
        problems = faults.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.faults = faults
        if faults.seed is not None:
            self._rng.seed(faults.seed)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=HEAD_BYTES_MAX)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _draw(self, method: str) -> tuple[str, float]:
        faults = self.faults
        if method not in faults.methods:
            return "lookup", 0.0
        draw, edge = self._rng.random(), 0.0
        for fate, rate in (("hold", faults.hold_rate), ("lose", faults.lose_rate), ("drop", faults.drop_rate),
                           ("slow", faults.slow_rate)):  # fmt: skip
            edge += rate
            if draw < edge:
                return fate, self._rng.uniform(*faults.hold_s) if fate == "hold" else faults.slow_s
        return "pass", 0.0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                request = await _read_message(reader)
                fate, wait_s = self._draw(request.method)
                self.counts[fate] += 1
                if fate == "lose":
                    break
                if fate == "hold":
                    await asyncio.sleep(wait_s)  # in the network: the worker may give up meanwhile
                answer = await self._forward(request)
                if fate == "drop" or answer is None:
                    break
                if fate == "slow":
                    await asyncio.sleep(wait_s)
                writer.write(answer)
                await writer.drain()
        except (_Closed, ConnectionError, asyncio.CancelledError):  # closed: a cancelled task here is logged
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(self, request: _Message) -> bytes | None:
        """Deliver the request on a connection of its own; its whole answer (None: none came)."""
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=HEAD_BYTES_MAX)
        except OSError:
            return None
        try:
            up_writer.write(request.raw)
            await up_writer.drain()
            return (await _read_message(up_reader)).raw
        except (_Closed, ConnectionError):
            return None
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()


@dataclass
class RunningProxy:
    """A proxy serving from a thread of its own: `port`, and its fates counted so far."""

    proxy: FaultProxy
    port: int
    loop: asyncio.AbstractEventLoop

    def configure(self, faults: ProxyFaults) -> None:
        self.loop.call_soon_threadsafe(self.proxy.configure, faults)

    def counts(self) -> dict[str, int]:
        return dict(self.proxy.counts)


@contextlib.contextmanager
def running_proxy(upstream: tuple[str, int], faults: ProxyFaults, port: int = 0) -> Iterator[RunningProxy]:
    loop = asyncio.new_event_loop()
    proxy = FaultProxy(upstream, faults)
    proxy.configure(faults)
    started = threading.Event()
    listening: list[int] = []
    stop = asyncio.Event()

    async def serve() -> None:
        listening.append(await proxy.start(port=port))
        started.set()
        await stop.wait()
        await proxy.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="fault-proxy", daemon=True)
    thread.start()
    if not started.wait(10.0):
        raise RuntimeError("the fault proxy did not start")
    try:
        yield RunningProxy(proxy, listening[0], loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10.0)
        loop.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return host, int(port)


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    try:
        return float(low), float(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds or low-high seconds") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m handlers.standins.proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--upstream", type=_address, required=True)
    parser.add_argument("--hold-rate", type=float, default=0.0)
    parser.add_argument("--hold-s", type=_range, default=(1.0, 1.0), help="seconds, or low-high")
    parser.add_argument("--lose-rate", type=float, default=0.0)
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--slow-rate", type=float, default=0.0)
    parser.add_argument("--slow-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    faults = ProxyFaults(hold_rate=args.hold_rate, hold_s=args.hold_s, lose_rate=args.lose_rate,
                         drop_rate=args.drop_rate, slow_rate=args.slow_rate, slow_s=args.slow_s, seed=args.seed)  # fmt: skip
    problems = faults.problems()
    if problems:
        parser.error("; ".join(problems))

    async def serve() -> None:
        proxy = FaultProxy(args.upstream, faults)
        port = await proxy.start(*args.listen)
        print(f"proxy: {args.listen[0]}:{port} -> {args.upstream[0]}:{args.upstream[1]}; Ctrl-C stops", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()
            print(f"proxy: fates {dict(proxy.counts)}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
