"""Sending proposed fixes to the compensation API, through the ``outbox`` table.

Owns: recording the fixes in ``outbox`` (``ON CONFLICT DO NOTHING``, so a rerun inserts nothing new),
posting the ones never delivered to ``POST {api}/v1/requests`` with their key in the Idempotency-Key
header and the bearer token in Authorization, and marking what the API accepted: 201 (created) or 200
(a replay of a key it already has). Anything else, or no answer, stays in the outbox for the next run.

Must never: enqueue without the explicit flag (the pipeline's dry run is the default), or write the
API token anywhere (logs, files, the outbox, error messages, reprs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
import urllib.request
from typing import Final

import asyncpg

from ledger.kinds import encode_payload
from spark_reconcile.fixes import FixRequest

HTTP_TIMEOUT_S: Final = 10.0
DELIVERIES_MAX: Final = 100_000
ACCEPTED_STATUSES: Final = frozenset({200, 201})
"""201: the API created the request; 200: it already had this key with this body (a replay)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ApiTarget:
    """Where fixes go and the bearer token that lets them in; the token never shows in a repr."""

    url: str
    token: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("the compensation API needs a URL")
        if not self.token:
            raise ValueError("the compensation API needs a bearer token")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    idempotency_key: str
    status: int | None  # None: no HTTP answer (connection refused, timeout)
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status in ACCEPTED_STATUSES


def post(fix: FixRequest, api: ApiTarget, *, timeout_s: float = HTTP_TIMEOUT_S) -> Delivery:
    """One POST; HTTP errors are values, not exceptions."""
    request = urllib.request.Request(
        f"{api.url.rstrip('/')}/v1/requests",
        data=json.dumps(fix.body(), sort_keys=True).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": fix.idempotency_key,
            "Authorization": f"Bearer {api.token}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Delivery(idempotency_key=fix.idempotency_key, status=response.status)
    except urllib.error.HTTPError as error:
        return Delivery(idempotency_key=fix.idempotency_key, status=error.code, error=str(error.reason))
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        return Delivery(idempotency_key=fix.idempotency_key, status=None, error=str(error))


async def enqueue_async(dsn: str, fixes: list[FixRequest], *, source: str, api: ApiTarget) -> list[Delivery]:
    """Record the fixes in the outbox, then deliver the ones never delivered; mark what was accepted."""
    if len(fixes) > DELIVERIES_MAX:
        raise ValueError(f"refusing to enqueue more than {DELIVERIES_MAX} fixes in one run")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.executemany(
            """INSERT INTO outbox (idempotency_key, kind, ref_key, payload, source)
               VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT (idempotency_key) DO NOTHING""",
            [(f.idempotency_key, f.kind.value, f.ref_key, encode_payload(f.payload).decode(), source) for f in fixes],
        )
        pending = {
            row["idempotency_key"]
            for row in await connection.fetch(
                """SELECT idempotency_key FROM outbox
                   WHERE idempotency_key = ANY($1::text[]) AND delivered_at IS NULL""",
                [f.idempotency_key for f in fixes],
            )
        }
        deliveries = [await asyncio.to_thread(post, fix, api) for fix in fixes if fix.idempotency_key in pending]
        await connection.executemany(
            "UPDATE outbox SET delivered_at = now(), response_status = $2 WHERE idempotency_key = $1",
            [(d.idempotency_key, d.status) for d in deliveries if d.accepted],
        )
        return deliveries
    finally:
        await connection.close()


def enqueue(dsn: str, fixes: list[FixRequest], *, source: str, api: ApiTarget) -> list[Delivery]:
    return asyncio.run(enqueue_async(dsn, fixes, source=source, api=api))
