"""Closing the loop: fixable discrepancies become compensation requests.

Owns: which classes are fixable and how (today: a granted red packet that was never paid, with a
known recipient, becomes a ``payout`` request), the idempotency key derived from the discrepancy, the
JSONL outbox file, the ``outbox`` table and delivery to ``POST {api}/v1/requests``.

The key is a hash of what identifies the break (class, business id, recipient, amount, currency) and
nothing about the run: a rerun, or the same unpaid grant found again the next night, derives the same
key, so the outbox insert is a no-op and the API answers "exists" instead of paying twice.

Must never: enqueue without the explicit flag (dry run is the default), or include run-specific
values (run id, date, time) in the key or the payload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import asyncpg

from spark_reconcile.schemas import DiscrepancyClass

PAYOUT_KIND: Final = "payout"
KEY_PREFIX: Final = "recon-"
HTTP_TIMEOUT_S: Final = 10.0
DELIVERIES_MAX: Final = 100_000
ACCEPTED_STATUSES: Final = frozenset({200, 201, 202, 409})  # 409: the key exists, already enqueued


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FixRequest:
    """A compensation request document, as the API's ``POST /v1/requests`` takes it."""

    kind: str
    idempotency_key: str
    ref_key: str
    payload: dict[str, Any]

    def document(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "idempotency_key": self.idempotency_key,
            "ref_key": self.ref_key,
            "payload": self.payload,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    idempotency_key: str
    status: int | None  # None: no HTTP answer (connection refused, timeout)
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status in ACCEPTED_STATUSES


def idempotency_key(row: Mapping[str, Any]) -> str:
    identity = [
        row["discrepancy_class"],
        row["business_id"],
        row["recipient"],
        str(row["amount_minor"]),
        row["currency"],
    ]
    return KEY_PREFIX + hashlib.sha256("\x1f".join(map(str, identity)).encode()).hexdigest()[:40]


def build_fixes(rows: Iterable[Mapping[str, Any]]) -> list[FixRequest]:
    """Requests for the fixable rows, sorted by key; rows without what a payout needs are skipped."""
    fixes: dict[str, FixRequest] = {}
    for row in rows:
        if row["discrepancy_class"] != DiscrepancyClass.MISSING_IN_PAYMENT.value or not row["fixable"]:
            continue
        if not row["recipient"] or row["amount_minor"] is None or not row["currency"]:
            continue
        key = idempotency_key(row)
        fixes[key] = FixRequest(
            kind=PAYOUT_KIND,
            idempotency_key=key,
            ref_key=row["business_id"],
            payload={
                "recipient": row["recipient"],
                "amount_minor": int(row["amount_minor"]),
                "currency": row["currency"],
                "reason": "reconciliation",
                "discrepancy_class": row["discrepancy_class"],
            },
        )
    return [fixes[key] for key in sorted(fixes)]


def write_jsonl(fixes: Iterable[FixRequest], path: Path) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for fix in fixes:
            handle.write(json.dumps(fix.document(), sort_keys=True) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> list[FixRequest]:
    with path.open(encoding="utf-8") as handle:
        return [FixRequest(**json.loads(line)) for line in handle if line.strip()]


def post(fix: FixRequest, api_url: str, *, timeout_s: float = HTTP_TIMEOUT_S) -> Delivery:
    """One POST with the Idempotency-Key header; HTTP errors are values, not exceptions."""
    request = urllib.request.Request(
        f"{api_url.rstrip('/')}/v1/requests",
        data=json.dumps(fix.document(), sort_keys=True).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": fix.idempotency_key},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Delivery(idempotency_key=fix.idempotency_key, status=response.status)
    except urllib.error.HTTPError as error:
        return Delivery(idempotency_key=fix.idempotency_key, status=error.code, error=error.reason)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        return Delivery(idempotency_key=fix.idempotency_key, status=None, error=str(error))


async def enqueue_async(dsn: str, fixes: list[FixRequest], *, source: str, api_url: str) -> list[Delivery]:
    """Record the fixes in the outbox, then deliver the ones never delivered; mark what was accepted."""
    if len(fixes) > DELIVERIES_MAX:
        raise ValueError(f"refusing to enqueue more than {DELIVERIES_MAX} fixes in one run")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.executemany(
            """INSERT INTO outbox (idempotency_key, kind, ref_key, payload, source)
               VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT (idempotency_key) DO NOTHING""",
            [(f.idempotency_key, f.kind, f.ref_key, json.dumps(f.payload, sort_keys=True), source) for f in fixes],
        )
        pending = {
            row["idempotency_key"]
            for row in await connection.fetch(
                """SELECT idempotency_key FROM outbox
                   WHERE idempotency_key = ANY($1::text[]) AND delivered_at IS NULL""",
                [f.idempotency_key for f in fixes],
            )
        }
        deliveries = [await asyncio.to_thread(post, fix, api_url) for fix in fixes if fix.idempotency_key in pending]
        await connection.executemany(
            "UPDATE outbox SET delivered_at = now(), response_status = $2 WHERE idempotency_key = $1",
            [(d.idempotency_key, d.status) for d in deliveries if d.accepted],
        )
        return deliveries
    finally:
        await connection.close()


def enqueue(dsn: str, fixes: list[FixRequest], *, source: str, api_url: str) -> list[Delivery]:
    return asyncio.run(enqueue_async(dsn, fixes, source=source, api_url=api_url))
