"""The payment system's stand-in: transfers, in the modes real payment systems have.

    POST /transfers        Idempotency-Key: <transfer_id>   [Expires-At: <RFC 3339>]
        {transfer_id, payer, payee, amount_minor, currency, memo?, business_id, expires_at?}
        201 the transfer, new     200 the stored transfer, same request again (dedup on)
        409 {"code": "idempotency_conflict"}   the id is taken by a request with other content (dedup on)
        422 {"code": "request_expired"}        its expires_at has passed on this clock (expiry enforce)
        422 {"code": "account_closed"}         payer or payee account id starts with "closed-"
        422 {"code": "insufficient_funds"}     drawn at the fault settings' permanent_rate
        400 {"code": "idempotency_key_mismatch"} | {"code": "expires_at_mismatch"} | {"code": "invalid_request"}
    GET /transfers/{transfer_id}   200 the (first) transfer | 404 {"code": "not_found"}

Two switches, fixed when it starts (`compensator standins --payment-dedup on|off --payment-expiry
enforce|ignore`; defaults on and ignore):
- dedup on: one transfer per transfer id; a repeat is answered with it (a replay is answered before
  any refusal is drawn: a payment system returns what it did under a key, whatever the payer's
  balance is now), other content under the id is a conflict. Off: every accepted POST is a new
  payment with a payment id of its own, as many bank and wallet APIs do: two payments for one
  transfer id are two rows of ``payment_transfers``.
- expiry enforce: a POST whose ``expires_at`` (the body's field or the ``Expires-At`` header; both
  must agree) has passed on this stand-in's clock is refused and writes nothing. The check is made
  in the transaction that writes the payment, just before its inserts. Ignore: the field is read
  and ignored, as by a payment system that has never heard of it. A POST without one is accepted.

A transfer is {payment_id, transfer_id, business_id, payer, payee, amount_minor, currency, memo?,
status, created_at}. A new one is written in one transaction to ``payment_transfers`` (the
reconciliation's columns, status SUCCEEDED) and to ``payment_transfer_requests`` (the request as
received, without its expiry, and its SHA-256, which decides "same request"). A refusal writes
nothing, so a refused transfer can be made later under the same id.

Must never: with dedup on, make two transfers for one id; change a transfer once made; with expiry
enforced, apply a request past its expiry.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from handlers.standins.service import PlanDep, Standin, StandinDep, answer, build_app, document_of, segment
from ledger.upstream import PAYMENT_TRANSFERS_DDL, payment_id_migration

SERVICE: Final = "payment"
CLOSED_ACCOUNT_PREFIX: Final = "closed-"
SUCCEEDED: Final = "SUCCEEDED"

DDL: Final = (
    PAYMENT_TRANSFERS_DDL
    + """
CREATE TABLE IF NOT EXISTS payment_transfer_requests (
    payment_id     text PRIMARY KEY,
    transfer_id    text NOT NULL,
    request_sha256 bytea NOT NULL,
    request        jsonb NOT NULL
);
"""
    + payment_id_migration("payment_transfer_requests")
    + """
CREATE INDEX IF NOT EXISTS payment_transfer_requests_transfer_id ON payment_transfer_requests (transfer_id);
"""
)
"""``payment_transfers`` is ledger/upstream.py's: the nightly reconciliation reads what this stand-in writes."""

Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$")]


class TransferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    transfer_id: Id
    payer: Id
    payee: Id
    amount_minor: Annotated[int, Field(gt=0, le=10**15)]
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
    memo: Annotated[str, StringConstraints(max_length=256)] | None = None
    business_id: Id
    expires_at: Annotated[str, StringConstraints(max_length=64)] | None = None
    """Not part of the transfer: when this request stops being one the caller wants applied (RFC 3339)."""

    def canonical(self) -> str:
        """The transfer this request asks for (what "the same request" compares), without its expiry."""
        return self.model_dump_json(exclude_none=True, exclude={"expires_at"})

    def sha256(self) -> bytes:
        return hashlib.sha256(self.canonical().encode()).digest()


_SELECT: Final = """
SELECT r.payment_id, r.request, r.request_sha256, t.status, t.created_at
FROM payment_transfer_requests r JOIN payment_transfers t USING (payment_id)
WHERE r.transfer_id = $1 ORDER BY t.created_at, r.payment_id LIMIT 1
"""
"""The first payment under a transfer id (with dedup on, the only one)."""
_SELECT_PAYMENT: Final = _SELECT.replace("WHERE r.transfer_id = $1 ORDER BY t.created_at, r.payment_id LIMIT 1",
                                         "WHERE r.payment_id = $1")  # fmt: skip
EXPIRED: Final = "request_expired"


@dataclass(frozen=True, slots=True, kw_only=True)
class PaymentModes:
    """How this payment system treats a repeated or a late request (fixed when it starts)."""

    dedup: bool = True
    enforce_expiry: bool = False
    clock: Callable[[], float] = time.time
    """Its clock, against which an expiry is checked (unix seconds)."""


def _transfer(record: Any) -> dict[str, Any]:
    document = document_of(record, "request") or {}
    return {**document, "payment_id": record["payment_id"], "status": record["status"],
            "created_at": record["created_at"].isoformat()}  # fmt: skip


def _instant(text: str) -> datetime | None:
    """An RFC 3339 time with its offset, or None."""
    try:
        stated = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return stated if stated.tzinfo is not None else None


def _expiry(body: TransferRequest, header: str | None) -> datetime | str | None:
    """The request's expiry (the body's or the header's, which must agree), or a refusal's code."""
    stated = [_instant(text) for text in (body.expires_at, header) if text is not None]
    if any(when is None for when in stated):
        return "invalid_request"
    if len(set(stated)) > 1:
        return "expires_at_mismatch"
    return stated[0] if stated else None


router = APIRouter()


@router.post("/transfers")
async def create_transfer(
    request: Request, body: TransferRequest, standin: StandinDep, plan: PlanDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    expires_header: Annotated[str | None, Header(alias="Expires-At")] = None,
) -> JSONResponse:  # fmt: skip
    modes: PaymentModes = request.app.state.payment_modes
    if idempotency_key != body.transfer_id:
        standin.record("idempotency_key_mismatch")
        return answer(400, {"code": "idempotency_key_mismatch"})
    expires_at = _expiry(body, expires_header)
    if isinstance(expires_at, str):
        standin.record(expires_at)
        return answer(400, {"code": expires_at})
    payment_id = f"pay-{uuid.uuid4().hex}"
    async with standin.pool.acquire() as connection, connection.transaction():
        earlier = 0
        if modes.dedup:  # one at a time per transfer id: the first one's transaction decides
            await connection.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 17))", body.transfer_id)
            existing = await connection.fetchrow(_SELECT, body.transfer_id)
            if existing is not None:
                return _replay(standin, body, existing)
        else:
            earlier = await connection.fetchval(
                "SELECT count(*) FROM payment_transfer_requests WHERE transfer_id = $1", body.transfer_id)
        if body.payer.startswith(CLOSED_ACCOUNT_PREFIX) or body.payee.startswith(CLOSED_ACCOUNT_PREFIX):
            standin.record("account_closed")
            return answer(422, {"code": "account_closed"})
        if plan.permanent:
            standin.record("insufficient_funds")
            return answer(422, {"code": "insufficient_funds"})
        if modes.enforce_expiry and expires_at is not None and modes.clock() >= expires_at.timestamp():
            standin.record(EXPIRED)  # checked last, in the transaction that would write it
            return answer(422, {"code": EXPIRED})
        await connection.execute(
            "INSERT INTO payment_transfers (payment_id, transfer_id, business_id, payer, payee, amount_minor, currency,"
            " status, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp())",
            payment_id, body.transfer_id, body.business_id, body.payer, body.payee, body.amount_minor, body.currency,
            SUCCEEDED,
        )  # fmt: skip
        await connection.execute(
            "INSERT INTO payment_transfer_requests (payment_id, transfer_id, request_sha256, request)"
            " VALUES ($1, $2, $3, $4)", payment_id, body.transfer_id, body.sha256(), body.canonical(),
        )  # fmt: skip
    standin.record("paid_again" if earlier else "created", applied=True)
    return answer(201, _transfer(await standin.pool.fetchrow(_SELECT_PAYMENT, payment_id)))


def _replay(standin: Standin, body: TransferRequest, existing: Any) -> JSONResponse:
    if bytes(existing["request_sha256"]) != body.sha256():
        standin.record("idempotency_conflict")
        return answer(409, {"code": "idempotency_conflict"})
    standin.record("replayed", repeat=True)
    return answer(200, _transfer(existing))


@router.get("/transfers/{transfer_id}")
async def get_transfer(transfer_id: str, standin: StandinDep) -> JSONResponse:
    found = await standin.pool.fetchrow(_SELECT, segment(transfer_id))
    if found is None:
        standin.record("not_found")
        return answer(404, {"code": "not_found"})
    standin.record("found")
    return answer(200, _transfer(found))


def create_app(*, dsn: str, seed: int | None = None, modes: PaymentModes | None = None) -> FastAPI:
    app = build_app(standin=Standin(name=SERVICE, seed=seed), dsn=dsn, ddl=DDL, router=router,
                    title="payment system (stand-in)")  # fmt: skip
    app.state.payment_modes = modes or PaymentModes()
    return app
