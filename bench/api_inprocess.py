"""The API's own CPU per single POST, in process: the real app over a real one-node store, no HTTP server.

    python -m bench.api_inprocess --json                 # CPU per request of the app alone
    python -m bench.api_inprocess --profile 30 --json    # and cProfile's top 30 functions (by own time)

Why beside bench.api: there, the API shares two cores with three nodes, wrk and whatever else runs,
and its CPU per request moves with them. Here the store (`raft_store.testing.inprocess.StoreThread`,
one node, fsync on, the queue machine) runs on a thread of its own and the app on this one; the
figure is this thread's CPU time (`time.thread_time`) over `--requests` single POSTs sent
`--in-flight` at a time straight into the ASGI app (bench.api's body: a 1,024-byte transfer, a new
Idempotency-Key each), under uvloop as uvicorn runs it. It counts everything the app does for a
request (middleware, span, metrics, token, validation, fingerprint, the store client and its
coroutine hand-offs, the answer's encoding) and nothing of uvicorn's HTTP parsing and socket
writes, which the hello route pays too. The garbage collector runs as in the API's process
(compensator/gc_policy.py, applied once the app's lifespan has started). Compare two checkouts in
the same session.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import uvloop

from api.tokens import new_token, token_hash
from bench.api import submission_template
from bench.harness import code_revision
from compensator import config as configuration
from compensator.wiring.api import after_start_up, api_app
from compensator.wiring.parts import gc_policy
from queues import QueueClient, RaftClient, Role
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread

KEY_MARKER: Final = "{{KEY}}"


def _scope(body: bytes, key: str, token: str) -> dict[str, Any]:
    headers = [(b"host", b"api"), (b"authorization", f"Bearer {token}".encode()),
               (b"content-type", b"application/json"), (b"idempotency-key", key.encode()),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/requests", "raw_path": b"/v1/requests",
            "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000), "state": {}}  # fmt: skip


async def _post(app: Any, body: bytes, key: str, token: str) -> int:
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(_scope(body, key, token), receive, send)
    return status


async def _run(store: StoreThread, args: argparse.Namespace) -> dict[str, Any]:
    token = new_token()
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        await queue.put_token("bench", Role.PRODUCER, token_hash(token), actor="bench/api_inprocess.py")
    finally:
        await queue.raft.close()
    environ = {**store.service_settings(), "COMPENSATOR_QUOTA__RATE_PER_S": "1000000", "COMPENSATOR_QUOTA__BURST": "10000000"}
    config = configuration.load(None, environ)
    app = api_app(config)
    # The garbage collector's policy, as `compensator api` runs its app (without it the figure
    # counted CPython's default collections, which the API process does not run).
    after_start_up(app, gc_policy(config), app.state.services.metrics)
    template = submission_template(args.body_bytes)
    prefix = f"{time.time_ns() % 10**8:08d}"
    bodies = [(template.replace(KEY_MARKER, f"{prefix}{i:012d}").encode(), f"{prefix}{i:012d}")
              for i in range(args.warmup + args.requests)]  # fmt: skip
    async with app.router.lifespan_context(app):
        statuses: dict[int, int] = {}

        async def send_all(chunk: list[tuple[bytes, str]]) -> None:
            for start in range(0, len(chunk), args.in_flight):
                for status in await asyncio.gather(*(_post(app, b, k, token) for b, k in chunk[start : start + args.in_flight])):
                    statuses[status] = statuses.get(status, 0) + 1

        await send_all(bodies[: args.warmup])
        statuses.clear()
        profiler = cProfile.Profile() if args.profile else None
        rounds: list[float] = []
        measured = bodies[args.warmup :]
        per_round = max(1, len(measured) // args.rounds)
        if profiler is not None:
            profiler.enable()
        for start in range(0, len(measured), per_round):
            cpu0 = time.thread_time()
            await send_all(measured[start : start + per_round])
            rounds.append(1e6 * (time.thread_time() - cpu0) / len(measured[start : start + per_round]))
        if profiler is not None:
            profiler.disable()
    result: dict[str, Any] = {
        "cpu_us_per_request": round(statistics.median(rounds), 1), "cpu_us_per_request_min": round(min(rounds), 1),
        "rounds_us": [round(r, 1) for r in rounds],
        "statuses": statuses, "requests": args.requests, "in_flight": args.in_flight, "body_bytes": args.body_bytes,
    }  # fmt: skip
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        result["profile"] = out.getvalue()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_inprocess", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=8, help="the figure is the median round's (and the least)")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N functions")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if min(args.requests, args.in_flight, args.rounds) < 1 or args.warmup < 0:
        parser.error("--requests, --in-flight, --rounds must be positive")
    with tempfile.TemporaryDirectory(prefix="bench-api-inprocess-") as folder:
        store = StoreThread(Path(folder) / "node", machine_factory)
        store.start()
        try:
            result = uvloop.run(_run(store, args))
        finally:
            store.stop()
    result["code"] = code_revision()
    profile = result.pop("profile", None)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    if profile:
        print(profile)
    return 0 if set(result["statuses"]) == {201} else 1


if __name__ == "__main__":
    raise SystemExit(main())
