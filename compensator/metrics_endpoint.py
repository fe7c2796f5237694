"""A process's Prometheus endpoint: ``GET /metrics`` served on the process's own event loop.

Why on the loop and not prometheus_client's HTTP server thread: a collector built at scrape time
(a store node's, from its status and its queue replica) must run between the loop's steps, as the
node's own reads do, and one endpoint serves every process the same way (the process shell starts
it on the process's metrics port). A scrape that finds the process busy with something that must
not be read half-done (`busy`: a node's apply) waits for it, a second at most.

Must never: answer anything but ``GET /metrics``, or listen anywhere the operator did not ask.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest

CONTENT_TYPE: Final = b"text/plain; version=0.0.4; charset=utf-8"
REQUEST_BYTES_MAX: Final = 8192
BUSY_WAITS_MAX: Final = 200
BUSY_WAIT_S: Final = 0.005
"""A scrape waits up to a second for the busy step to end, checking between the loop's turns."""


class MetricsServer:
    """`GET /metrics` of `registry` on host:port, on the running loop."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self._registry = registry
        self._host, self._port = host, port
        self._busy = busy
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = [*head.split(b"\r\n", 1)[0].split(b" "), b"", b""]
            if len(head) > REQUEST_BYTES_MAX or method != b"GET" or path.split(b"?")[0] != b"/metrics":
                body, status, kind = b"only GET /metrics here\n", b"404 Not Found", b"text/plain"
            else:
                for _ in range(BUSY_WAITS_MAX):  # an apply takes milliseconds; the queue gauges need it done
                    if not self._busy():
                        break
                    await asyncio.sleep(BUSY_WAIT_S)
                body, status, kind = generate_latest(self._registry), b"200 OK", CONTENT_TYPE
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)  # fmt: skip
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
