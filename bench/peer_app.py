"""The peer `bench.peer_procrastinate` measures us against: what a Python team would build instead.

    python -m bench.peer_app intake --port P      # FastAPI: one procrastinate job per item POSTed
    python -m bench.peer_app worker --concurrency N

A FastAPI intake that takes the bench's `POST /v1/requests:batch` body (the same items bench.e2e
sends to our API), validates each item with pydantic and defers one procrastinate job per item in
one `batch_defer_async` (one transaction, acknowledged once PostgreSQL's synchronous standby has
flushed it too: the harness starts the primary with `synchronous_standby_names` and fsync on); and
procrastinate workers whose one task calls the same stand-ins our handlers call, with the same
requests (a transfer keyed by its transfer id, a receive-list entry at its version, a signed
callback), retried by procrastinate after `PEER_RETRY_MS` (+10 % jitter) up to `PEER_ATTEMPTS_MAX`
attempts on a 5xx, a 429 or a transport error. httpx is the HTTP client, as in most FastAPI code.

What it leaves out that ours does, in its favour: no Idempotency-Key replay at the intake (a
producer's resend makes a second job; the bench resends only after a transport error or a 503),
no authentication, no lookups before a re-sent transfer (the payment stand-in's dedup makes a
resend safe, as it does for our `dedup` guarantee), no breakers, no traces or metrics.

Configured by the environment the harness sets: PEER_DSN (the queue's primary), PEER_PAYMENT_URL,
PEER_RED_PACKET_URL, PEER_CALLBACK_URL (the callback receiver), PEER_CALLBACK_SECRETS_FILE and
PEER_CALLBACK_TARGET, PEER_RETRY_MS, PEER_ATTEMPTS_MAX.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import httpx
import uvloop
from procrastinate import App, PsycopgConnector
from procrastinate.jobs import Job
from procrastinate.retry import BaseRetryStrategy, RetryDecision
from pydantic import BaseModel, Field

from handlers.signing import SIGNATURE_HEADER, Secret, sign
from ledger.kinds import canonical_json

TASK: Final = "compensate"
READY_LINE: Final = "peer worker running"
RETRYABLE_STATUSES: Final = frozenset({408, 425, 429, 500, 502, 503, 504})
TIMEOUT: Final = httpx.Timeout(10.0, connect=2.0)


class Retryable(Exception):
    """An attempt that may succeed later: procrastinate schedules the job again."""


class Refused(Exception):
    """An answer no retry can change: the job fails."""


class Jitter(BaseRetryStrategy):
    """procrastinate's RetryStrategy waits whole seconds; the bench's policy is milliseconds."""

    def __init__(self, *, wait_ms: int, attempts_max: int) -> None:
        self.wait_ms = wait_ms
        self.attempts_max = attempts_max

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        if job.attempts + 1 >= self.attempts_max or not isinstance(exception, Retryable):
            return None
        wait = timedelta(milliseconds=self.wait_ms * (1 + 0.1 * random.random()))
        return RetryDecision(retry_at=datetime.now(UTC) + wait)


def build_app(environ: dict[str, str], *, pool_max: int) -> App:
    """`pool_max`: PostgreSQL connections (a worker's concurrency, a few for the intake)."""
    app = App(connector=PsycopgConnector(conninfo=environ["PEER_DSN"], min_size=2, max_size=pool_max))
    clients: dict[str, httpx.AsyncClient] = {}
    secret = Secret.from_text(json.loads(Path(environ["PEER_CALLBACK_SECRETS_FILE"]).read_text())[environ["PEER_CALLBACK_TARGET"]]) \
        if environ.get("PEER_CALLBACK_SECRETS_FILE") else None  # fmt: skip

    def client(name: str) -> httpx.AsyncClient:
        found = clients.get(name)
        if found is None:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            found = clients[name] = httpx.AsyncClient(base_url=environ[name], timeout=TIMEOUT, limits=limits)
        return found

    retry = Jitter(wait_ms=int(environ.get("PEER_RETRY_MS", "200")),
                   attempts_max=int(environ.get("PEER_ATTEMPTS_MAX", "20")))  # fmt: skip

    @app.task(name=TASK, retry=retry, pass_context=False)
    async def compensate(kind: str, key: str, ref_key: str, payload: dict[str, Any]) -> None:
        if kind == "transfer":
            body = {**payload, "business_id": ref_key}
            answer = await _call(client("PEER_PAYMENT_URL"), "POST", "/transfers", canonical_json(body),
                                 {"content-type": "application/json", "idempotency-key": payload["transfer_id"]})  # fmt: skip
            _settle(answer, lambda: False)
        elif kind == "list_update":
            url = f"/red-packets/{quote(payload['red_packet_id'], safe='')}/receivers/{quote(payload['receiver'], safe='')}"
            body = {
                "version": payload["version"],
                "amount_minor": payload["amount_minor"],
                "currency": payload["currency"],
            }
            answer = await _call(client("PEER_RED_PACKET_URL"), "PUT", url, canonical_json(body),
                                 {"content-type": "application/json", "idempotency-key": key})  # fmt: skip
            _settle(answer, lambda: answer.status_code == 409 and answer.json().get("code") == "stale_version")
        elif kind == "callback":
            assert secret is not None, "PEER_CALLBACK_SECRETS_FILE is not set"
            signed = canonical_json(payload["body"])
            headers = {"content-type": "application/json", "idempotency-key": key,
                       SIGNATURE_HEADER: sign(secret, timestamp_s=int(time.time()), body=signed)}  # fmt: skip
            url = f"/callbacks/{quote(payload['target'], safe='')}"
            answer = await _call(client("PEER_CALLBACK_URL"), "POST", url, signed, headers)
            _settle(answer, lambda: False)
        else:
            raise Refused(f"unknown kind {kind!r}")

    return app


async def _call(
    client: httpx.AsyncClient, method: str, url: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    try:
        return await client.request(method, url, content=body, headers=headers)
    except httpx.TransportError as error:
        raise Retryable(f"{type(error).__name__}") from error


def _settle(answer: httpx.Response, also_success: Callable[[], bool]) -> None:
    if answer.is_success or also_success():
        return
    if answer.status_code in RETRYABLE_STATUSES:
        raise Retryable(f"{answer.status_code}")
    raise Refused(f"{answer.status_code}: {answer.text[:200]}")


# ---- the intake -------------------------------------------------------------------------------------
class Item(BaseModel):
    kind: str = Field(pattern="^(transfer|list_update|callback)$")
    ref_key: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any]
    failure: dict[str, Any] | None = None


class BatchItem(BaseModel):
    idempotency_key: str = Field(min_length=1, max_length=255)
    request: Item


class Batch(BaseModel):
    items: list[BatchItem] = Field(min_length=1, max_length=1000)


def intake(environ: dict[str, str]) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    app = build_app(environ, pool_max=8)
    task = app.tasks[TASK]

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        async with app.open_async():
            yield

    api = FastAPI(lifespan=lifespan)

    @api.post("/v1/requests:batch")
    async def batch(body: Batch) -> dict[str, Any]:
        jobs: list[dict[str, Any]] = [
            {"kind": i.request.kind, "key": i.idempotency_key, "ref_key": i.request.ref_key, "payload": i.request.payload}
            for i in body.items
        ]  # fmt: skip
        ids = await task.batch_defer_async(*jobs)
        return {"items": [{"status": 201, "request": {"id": job_id}} for job_id in ids]}

    @api.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    return api


async def work(environ: dict[str, str], concurrency: int) -> None:
    app = build_app(environ, pool_max=concurrency + 2)
    async with app.open_async():
        print(READY_LINE, flush=True)
        await app.run_worker_async(concurrency=concurrency, delete_jobs="never", install_signal_handlers=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_app", description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    intake_command = commands.add_parser("intake")
    intake_command.add_argument("--port", type=int, required=True)
    worker_command = commands.add_parser("worker")
    worker_command.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    if args.command == "intake":
        import uvicorn

        uvicorn.run(intake(environ), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                    log_level="warning", access_log=False, server_header=False)  # fmt: skip
    else:
        uvloop.run(work(environ, args.concurrency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
