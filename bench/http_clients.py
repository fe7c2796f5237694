"""HTTP client benchmark: CPU per request of the gateway's candidates against the payment stand-in.

    python -m bench.http_clients --json
    python -m bench.http_clients --requests 8000 --rounds 3 --json
    python -m bench.http_clients --aiohttp-path /tmp/aiohttp --json  # pip install --target /tmp/aiohttp aiohttp

Starts an embedded PostgreSQL and `compensator standins` (their ledgers in it), then runs each
candidate in a process of its own (uvloop, as a worker runs): `--requests` POST /transfers, each a
new transfer with its own Idempotency-Key and a JSON body as the transfer handler builds it,
`--in-flight` at a time, after `--warmup` requests that are not measured. The candidates:

- gateway:  `handlers.gateway.Gateway.send`, the worker's path (handlers/http11.py under it);
- http11:   `handlers.http11.Pool.request` alone: what the gateway adds above its client;
- httpx:    `httpx.AsyncClient` as the gateway used it until 2026-11-25 (a stream, httpcore's
            trace extension to see the write begin, the body read in chunks up to the limit);
- httpcore: `httpcore.AsyncConnectionPool` without httpx, over a network backend on asyncio's
            streams instead of anyio's (httpcore still takes anyio's locks on asyncio);
- aiohttp:  `aiohttp.ClientSession` with a TCPConnector of `--in-flight` connections; it is not a
            dependency of the project, so only where importable, or from `--aiohttp-path` (a folder
            `pip install --target` filled, put on that candidate's PYTHONPATH alone).

For each: CPU seconds of its process per request (`time.process_time`, the steadier figure on a
shared machine), requests/s and latency p50/p99 (the stand-in and PostgreSQL share the same cores,
so rates are the system's, not the client's), and the answers by status (0: the call failed, a
timeout or a lost connection; the command fails only if most did). `--rounds` runs every candidate that many times in
turn; the JSON gives each round and the median CPU per request. `parse_us` times parsing one
recorded stand-in answer with httptools and with h11 (the two HTTP/1.1 parsers among the
project's dependencies), in process.

Every process and the directory are removed on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

from bench.harness import (
    BenchError,
    Server,
    child_environment,
    code_revision,
    compensator_command,
    terminated_as_interrupt,
)
from ledger import pg
from raft_store.testing.processes import free_ports

CANDIDATES: Final = ("gateway", "http11", "httpx", "httpcore", "aiohttp")
BODY_BYTES_MAX: Final = 64 * 1024
TIMEOUTS_S: Final = {"connect": 1.0, "read": 5.0, "write": 2.0, "pool": 5.0}
Send = Callable[[bytes, str], Awaitable[int]]
"""One POST /transfers (body, idempotency key) -> the answer's status."""


# ---- the candidates, each in its own process ---------------------------------------------------
async def gateway_client(url: str, in_flight: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    from handlers.answers import Answer
    from handlers.gateway import Gateway, GatewaySettings, Outbound

    settings = GatewaySettings(connections_max=in_flight, keepalive_connections_max=in_flight,
                               pool_timeout_s=TIMEOUTS_S["pool"])  # fmt: skip
    gateway = Gateway(downstream="payment", settings=settings, base_url=url)

    async def send(body: bytes, key: str) -> int:
        outcome = await gateway.send(Outbound(method="POST", url="/transfers", body=body,
                                              headers=(("content-type", "application/json"), ("idempotency-key", key))))  # fmt: skip
        return outcome.status if isinstance(outcome, Answer) else 0

    return send, gateway.aclose


async def http11_client(url: str, in_flight: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    from handlers import http11, http_request

    limits = http_request.PoolLimits(connections_max=in_flight, keepalive_max=in_flight, keepalive_expiry_s=30.0,
                               connect_timeout_s=TIMEOUTS_S["connect"], write_timeout_s=TIMEOUTS_S["write"],
                               read_timeout_s=TIMEOUTS_S["read"], pool_timeout_s=TIMEOUTS_S["pool"])  # fmt: skip
    pool = http11.Pool(limits)
    target = http_request.parse_url(url).relative("/transfers")
    loop = asyncio.get_running_loop()

    async def send(body: bytes, key: str) -> int:
        headers = [("accept", "*/*"), ("accept-encoding", "identity"), ("user-agent", "compensator/1"),
                   ("content-type", "application/json"), ("idempotency-key", key)]  # fmt: skip
        try:
            answer = await pool.request("POST", target, headers, body, deadline=loop.time() + 10.0,
                                        body_max=BODY_BYTES_MAX)  # fmt: skip
        except http_request.HttpError:
            return 0
        return answer.status

    return send, pool.aclose


async def httpx_client(url: str, in_flight: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import httpx

    client = httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(**TIMEOUTS_S),
        limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight, keepalive_expiry=30.0),
        follow_redirects=False, trust_env=False, headers={"user-agent": "compensator/1", "accept-encoding": "identity"},
    )  # fmt: skip
    written = [False]

    async def seen(event: str, info: Any) -> None:
        if event == "http11.send_request_headers.started":
            written[0] = True

    async def send(body: bytes, key: str) -> int:
        headers = [("content-type", "application/json"), ("idempotency-key", key)]
        try:
            async with asyncio.timeout(10.0):
                async with client.stream("POST", "/transfers", headers=headers, content=body,
                                         extensions={"trace": seen}) as response:  # fmt: skip
                    size = 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > BODY_BYTES_MAX:
                            break
                    return response.status_code
        except (httpx.HTTPError, TimeoutError):
            return 0

    return send, client.aclose


async def httpcore_client(url: str, in_flight: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import httpcore

    class Stream(httpcore.AsyncNetworkStream):
        def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._reader, self._writer = reader, writer

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            try:
                async with asyncio.timeout(timeout):
                    return await self._reader.read(max_bytes)
            except TimeoutError:
                raise httpcore.ReadTimeout("read") from None
            except OSError as error:
                raise httpcore.ReadError(str(error)) from None

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            try:
                self._writer.write(buffer)
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
            except TimeoutError:
                raise httpcore.WriteTimeout("write") from None
            except OSError as error:
                raise httpcore.WriteError(str(error)) from None

        async def aclose(self) -> None:
            self._writer.close()

        def get_extra_info(self, info: str) -> Any:
            return self._writer.get_extra_info("socket") if info == "socket" else None

    class Backend(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                              socket_options: Any = None) -> httpcore.AsyncNetworkStream:  # fmt: skip
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
            return Stream(reader, writer)

        async def sleep(self, seconds: float) -> None:
            await asyncio.sleep(seconds)

    pool = httpcore.AsyncConnectionPool(max_connections=in_flight, max_keepalive_connections=in_flight,
                                        keepalive_expiry=30.0, network_backend=Backend())  # fmt: skip
    full = f"{url}/transfers"

    async def send(body: bytes, key: str) -> int:
        headers = [(b"host", url.split("//")[1].encode()), (b"user-agent", b"compensator/1"),
                   (b"accept-encoding", b"identity"), (b"content-type", b"application/json"),
                   (b"idempotency-key", key.encode()), (b"content-length", str(len(body)).encode())]  # fmt: skip
        try:
            async with pool.stream("POST", full, headers=headers, content=body,
                                   extensions={"timeout": TIMEOUTS_S}) as response:  # fmt: skip
                size = 0
                async for chunk in response.aiter_stream():
                    size += len(chunk)
                    if size > BODY_BYTES_MAX:
                        break
                return response.status
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError):
            return 0

    return send, pool.aclose


async def aiohttp_client(url: str, in_flight: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp  # type: ignore[import-not-found,unused-ignore]

    session = aiohttp.ClientSession(
        base_url=url, connector=aiohttp.TCPConnector(limit=in_flight, keepalive_timeout=30.0),
        timeout=aiohttp.ClientTimeout(total=10.0, connect=TIMEOUTS_S["connect"], sock_read=TIMEOUTS_S["read"]),
        headers={"user-agent": "compensator/1", "accept-encoding": "identity"}, auto_decompress=False,
        trust_env=False,
    )  # fmt: skip

    async def send(body: bytes, key: str) -> int:
        headers = {"content-type": "application/json", "idempotency-key": key}
        try:
            async with session.post("/transfers", data=body, headers=headers, allow_redirects=False) as response:
                await response.content.read(BODY_BYTES_MAX)
                return int(response.status)
        except (aiohttp.ClientError, TimeoutError):
            return 0

    async def close() -> None:
        await session.close()

    return send, close


MAKERS: Final = {"gateway": gateway_client, "http11": http11_client, "httpx": httpx_client,
                 "httpcore": httpcore_client, "aiohttp": aiohttp_client}  # fmt: skip


def transfer_bodies(count: int) -> list[tuple[bytes, str]]:
    from ledger.kinds import canonical_json

    nonce = secrets.token_hex(4)
    bodies = []
    for number in range(count):
        transfer_id = f"hc-{nonce}-{number}"
        body = {"transfer_id": transfer_id, "payer": "escrow", "payee": f"user-{number % 97}", "amount_minor": 100 + number % 900,
                "currency": "CNY", "memo": "red packet", "business_id": f"grant-{nonce}-{number}"}  # fmt: skip
        bodies.append((canonical_json(body), transfer_id))
    return bodies


async def drive(send: Send, bodies: list[tuple[bytes, str]], in_flight: int) -> tuple[list[float], dict[int, int]]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    cursor = iter(bodies)

    async def lane() -> None:
        for body, key in cursor:
            started = time.perf_counter()
            status = await send(body, key)
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return latencies, statuses


async def child(candidate: str, url: str, requests: int, warmup: int, in_flight: int) -> dict[str, Any]:
    send, close = await MAKERS[candidate](url, in_flight)
    try:
        bodies = transfer_bodies(warmup + requests)
        await drive(send, bodies[:warmup], in_flight)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        latencies, statuses = await drive(send, bodies[warmup:], in_flight)
        cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
    finally:
        await close()
    latencies.sort()
    return {
        "candidate": candidate, "cpu_us_per_request": round(cpu_s / requests * 1e6, 1),
        "per_s": round(requests / wall_s, 1), "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2), "statuses": statuses,
    }  # fmt: skip


def run_child(args: argparse.Namespace) -> int:
    import uvloop

    uvloop.install()
    result = asyncio.run(child(args.child, args.url, args.requests, args.warmup, args.in_flight))
    print(json.dumps(result))
    return 0


# ---- parsers ------------------------------------------------------------------------------------
def parse_us(answer: bytes, rounds: int = 20_000) -> dict[str, float]:
    """Microseconds to parse one answer: httptools (C) and h11 (pure Python)."""
    import h11
    import httptools

    class Sink:
        def on_header(self, name: bytes, value: bytes) -> None:
            pass

        def on_body(self, body: bytes) -> None:
            pass

    started = time.process_time()
    for _ in range(rounds):
        httptools.HttpResponseParser(Sink()).feed_data(answer)
    httptools_us = (time.process_time() - started) / rounds * 1e6
    started = time.process_time()
    for _ in range(rounds):
        connection = h11.Connection(h11.CLIENT)
        connection.send(
            h11.Request(method="POST", target="/transfers", headers=[("host", "x"), ("content-length", "0")])
        )
        connection.send(h11.EndOfMessage())
        connection.receive_data(answer)
        while not isinstance(connection.next_event(), h11.EndOfMessage):
            pass
    h11_us = (time.process_time() - started) / rounds * 1e6
    return {"httptools": round(httptools_us, 2), "h11": round(h11_us, 2)}


def recorded_answer(url: str) -> bytes:
    """One POST /transfers answer of the stand-in, as bytes on the wire."""
    import socket

    host, port = url.split("//")[1].split(":")
    body = transfer_bodies(1)[0][0]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /transfers HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# ---- the run -------------------------------------------------------------------------------------
def start_standins(root: Path, cleanups: list[Callable[[], None]]) -> str:
    folder = root / "pg"
    folder.mkdir()
    postgres = pg.EmbeddedPostgres(folder / "data")
    cleanups.append(postgres.stop)
    pg.wait_until_accepting(postgres.start())
    ports = free_ports(3)
    secrets_file = root / "secrets.json"
    secrets_file.write_text(json.dumps({"bench": secrets.token_urlsafe(32)}))
    secrets_file.chmod(0o600)
    command = [*compensator_command(), "standins", "--payment-port", str(ports[0]), "--red-packet-port", str(ports[1]),
               "--callback-port", str(ports[2]), "--pg-dsn", postgres.dsn, "--secrets-file", str(secrets_file)]  # fmt: skip
    standins = Server("compensator standins", command, child_environment(), root / "standins.log")
    cleanups.append(standins.stop)
    standins.start()
    url = f"http://127.0.0.1:{ports[0]}"
    standins.wait_ready(f"{url}/_faults")
    return url


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> list[str]:
    cleanups: list[Callable[[], None]] = []
    errors: list[str] = []
    try:
        url = start_standins(root, cleanups)
        aiohttp_here = args.aiohttp_path is not None or importlib.util.find_spec("aiohttp") is not None
        candidates = [c for c in args.candidates if c != "aiohttp" or aiohttp_here]
        skipped = sorted(set(args.candidates) - set(candidates))
        if skipped:
            result["skipped"] = {name: "not importable here" for name in skipped}
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name in candidates:
                command = [sys.executable, "-m", "bench.http_clients", "--child", name, "--url", url,
                           "--requests", str(args.requests), "--warmup", str(args.warmup),
                           "--in-flight", str(args.in_flight)]  # fmt: skip
                env = child_environment()
                if name == "aiohttp" and args.aiohttp_path is not None:
                    env["PYTHONPATH"] += os.pathsep + str(args.aiohttp_path)
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    errors.append(
                        f"{name}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}"
                    )
                    continue
                rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        result["candidates"] = {
            name: {"cpu_us_per_request_median": statistics.median(r["cpu_us_per_request"] for r in runs), "rounds": runs}
            for name, runs in rounds.items() if runs
        }  # fmt: skip
        for name, runs in rounds.items():  # a few failures are a figure (in `statuses`); most are a broken run
            failed = sum(n for r in runs for status, n in r["statuses"].items() if status != "201")
            if failed * 2 > args.requests * len(runs):
                errors.append(f"{name}: most answers were not 201: {[r['statuses'] for r in runs]}")
        result["parse_us"] = parse_us(recorded_answer(url))
    finally:
        while cleanups:
            with suppress(Exception):
                cleanups.pop()()
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_clients", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="measured requests per candidate and round")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="every candidate this many times, in turn")
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    parser.add_argument("--aiohttp-path", type=Path, help="a folder holding aiohttp (pip install --target)")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--child", choices=CANDIDATES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.requests, args.in_flight, args.rounds) < 1 or args.warmup < 0:
        parser.error("--requests, --in-flight and --rounds must be positive")
    if args.child:
        return run_child(args)
    os.chdir(Path(__file__).resolve().parents[1])
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime()),
                              "requests": args.requests, "in_flight": args.in_flight, "rounds": args.rounds}  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="bench-http-"))
    errors: list[str] = []
    try:
        with terminated_as_interrupt():
            errors += run(args, root, result)
    except BenchError as error:
        errors.append(str(error))
    except KeyboardInterrupt as interrupt:
        errors.append(f"interrupted ({str(interrupt) or 'SIGINT'}); every process was stopped")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for message in errors:
        print(f"bench.http_clients: {message}", file=sys.stderr)
    if errors:
        result["errors"] = errors
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    result["code"] = code_revision()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
