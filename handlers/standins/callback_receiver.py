"""The callback receiver's stand-in: a merchant endpoint that checks signatures and counts repeats.

    POST /callbacks/{target}    Webhook-Signature: t=<unix s>,v1=<hex>    Idempotency-Key: <key>
        200 {"received": true, "repeat": false}    first delivery under this key
        200 {"received": true, "repeat": true}     a repeat, same body (counted)
        401 {"code": "missing_signature" | "malformed_signature" | "bad_signature" | "stale_signature"}
        404 {"code": "unknown_target"}             no secret is configured for this target
        409 {"code": "idempotency_conflict"}       the key was delivered with another body
        410 {"code": "gone"}                       drawn at the fault settings' permanent_rate
        400 {"code": "missing_idempotency_key"}
        413 {"code": "too_large"}                  a body over 256 KiB

The signature is checked over the exact bytes received (handlers/signing.py, 5-minute tolerance)
with the target's secret, before anything is recorded. Each delivery is counted per (target, key)
in ``callback_deliveries``: first time, last time, count, and the body's SHA-256.

Callbacks are at least once by contract (as webhooks are): a merchant deduplicates on the
``Idempotency-Key``, and this one does by default. With ``--callback-dedup off`` it stands in for a
merchant that does not: every delivery is handled as new (``repeat`` false, no conflict check),
still counted, so a test can see how often one callback arrived.

Must never: record a delivery whose signature did not verify, or show a secret.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Final

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.responses import JSONResponse

from handlers.signing import SIGNATURE_HEADER, Secret, Verification, verify
from handlers.standins.service import PlanDep, Standin, StandinDep, answer, build_app, segment

SERVICE: Final = "callback"
BODY_BYTES_MAX: Final = 256 * 1024

DDL: Final = """
CREATE TABLE IF NOT EXISTS callback_deliveries (
    target          text NOT NULL,
    idempotency_key text NOT NULL,
    body_sha256     bytea NOT NULL,
    count           bigint NOT NULL,
    first_at        timestamptz NOT NULL,
    last_at         timestamptz NOT NULL,
    PRIMARY KEY (target, idempotency_key)
);
"""

_COUNT_ALWAYS: Final = """
INSERT INTO callback_deliveries AS d (target, idempotency_key, body_sha256, count, first_at, last_at)
VALUES ($1, $2, $3, 1, clock_timestamp(), clock_timestamp())
ON CONFLICT (target, idempotency_key) DO UPDATE SET count = d.count + 1, last_at = EXCLUDED.last_at
RETURNING count
"""

_COUNT: Final = """
INSERT INTO callback_deliveries AS d (target, idempotency_key, body_sha256, count, first_at, last_at)
VALUES ($1, $2, $3, 1, clock_timestamp(), clock_timestamp())
ON CONFLICT (target, idempotency_key) DO UPDATE SET count = d.count + 1, last_at = EXCLUDED.last_at
    WHERE d.body_sha256 = EXCLUDED.body_sha256
RETURNING count
"""

_REFUSED: Final = {
    Verification.MISSING: "missing_signature",
    Verification.MALFORMED: "malformed_signature",
    Verification.MISMATCH: "bad_signature",
    Verification.STALE: "stale_signature",
}


class _Receiver:
    """The secrets and the clock, which the route reaches through the app's state."""

    def __init__(self, secrets: Mapping[str, Secret], clock: Callable[[], float], *, dedup: bool = True) -> None:
        self.secrets = dict(secrets)
        self.clock = clock
        self.dedup = dedup

    def __repr__(self) -> str:
        return f"_Receiver(targets={sorted(self.secrets)})"


router = APIRouter()


@router.post("/callbacks/{target}")
async def receive(
    target: str, request: Request, standin: StandinDep, plan: PlanDep,
    signature: Annotated[str | None, Header(alias=SIGNATURE_HEADER)] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:  # fmt: skip
    receiver: _Receiver = request.app.state.receiver
    name = segment(target)
    secret = receiver.secrets.get(name)
    if secret is None:
        standin.record("unknown_target")
        return answer(404, {"code": "unknown_target"})
    body = await request.body()
    if len(body) > BODY_BYTES_MAX:
        standin.record("too_large")
        return answer(413, {"code": "too_large"})
    verification = verify(secret, signature, body, now_s=receiver.clock())
    if verification is not Verification.VALID:
        standin.record(_REFUSED[verification])
        return answer(401, {"code": _REFUSED[verification]})
    if not idempotency_key:
        standin.record("missing_idempotency_key")
        return answer(400, {"code": "missing_idempotency_key"})
    if plan.permanent:
        standin.record("gone")
        return answer(410, {"code": "gone"})
    digest = hashlib.sha256(body).digest()
    count = await standin.pool.fetchval(_COUNT if receiver.dedup else _COUNT_ALWAYS, name, idempotency_key, digest)
    if count is None:
        standin.record("idempotency_conflict")
        return answer(409, {"code": "idempotency_conflict"})
    repeat = count > 1 and receiver.dedup
    standin.record("repeat" if repeat else "received", applied=not repeat, repeat=repeat)
    return answer(200, {"received": True, "repeat": repeat})


def create_app(
    *, dsn: str, secrets: Mapping[str, Secret], seed: int | None = None, clock: Callable[[], float] = time.time,
    dedup: bool = True,
) -> FastAPI:  # fmt: skip
    app = build_app(standin=Standin(name=SERVICE, seed=seed), dsn=dsn, ddl=DDL, router=router,
                    title="callback receiver (stand-in)")  # fmt: skip
    app.state.receiver = _Receiver(secrets, clock, dedup=dedup)
    return app
