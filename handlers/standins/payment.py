"""The payment system's stand-in: transfers, deduplicated on the caller's transfer id.

    POST /transfers        Idempotency-Key: <transfer_id>
        {transfer_id, payer, payee, amount_minor, currency, memo?, business_id}
        201 the transfer, new     200 the stored transfer, same request again
        409 {"code": "idempotency_conflict"}   the id is taken by a request with other content
        422 {"code": "account_closed"}         payer or payee account id starts with "closed-"
        422 {"code": "insufficient_funds"}     drawn at the fault settings' permanent_rate
        400 {"code": "idempotency_key_mismatch"} | {"code": "invalid_request"}
    GET /transfers/{transfer_id}   200 the transfer | 404 {"code": "not_found"}

A transfer is {transfer_id, business_id, payer, payee, amount_minor, currency, memo?, status,
created_at}. A new one is written in one transaction to ``payment_transfers`` (the reconciliation's
columns, status SUCCEEDED) and to ``payment_transfer_requests`` (the request as received and its
SHA-256, which decides "same request"). A refusal writes nothing, so a refused transfer can be
made later under the same id. A replay is answered before any refusal is drawn: a payment system
returns what it did under a key, whatever the payer's balance is now.

Must never: make two transfers for one id, or change a transfer once made.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Final

from fastapi import APIRouter, FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from handlers.standins.service import PlanDep, Standin, StandinDep, answer, build_app, document_of, segment
from ledger.upstream import PAYMENT_TRANSFERS_DDL

SERVICE: Final = "payment"
CLOSED_ACCOUNT_PREFIX: Final = "closed-"
SUCCEEDED: Final = "SUCCEEDED"

DDL: Final = (
    PAYMENT_TRANSFERS_DDL
    + """
CREATE TABLE IF NOT EXISTS payment_transfer_requests (
    transfer_id    text PRIMARY KEY,
    request_sha256 bytea NOT NULL,
    request        jsonb NOT NULL
);
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

    def canonical(self) -> str:
        return self.model_dump_json(exclude_none=True)

    def sha256(self) -> bytes:
        return hashlib.sha256(self.canonical().encode()).digest()


_SELECT: Final = """
SELECT r.request, r.request_sha256, t.status, t.created_at
FROM payment_transfer_requests r JOIN payment_transfers t USING (transfer_id)
WHERE r.transfer_id = $1
"""


def _transfer(record: Any) -> dict[str, Any]:
    document = document_of(record, "request") or {}
    return {**document, "status": record["status"], "created_at": record["created_at"].isoformat()}


router = APIRouter()


@router.post("/transfers")
async def create_transfer(
    body: TransferRequest, standin: StandinDep, plan: PlanDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:  # fmt: skip
    if idempotency_key != body.transfer_id:
        standin.record("idempotency_key_mismatch")
        return answer(400, {"code": "idempotency_key_mismatch"})
    existing = await standin.pool.fetchrow(_SELECT, body.transfer_id)
    if existing is not None:
        return _replay(standin, body, existing)
    if body.payer.startswith(CLOSED_ACCOUNT_PREFIX) or body.payee.startswith(CLOSED_ACCOUNT_PREFIX):
        standin.record("account_closed")
        return answer(422, {"code": "account_closed"})
    if plan.permanent:
        standin.record("insufficient_funds")
        return answer(422, {"code": "insufficient_funds"})
    async with standin.pool.acquire() as connection, connection.transaction():
        inserted = await connection.fetchval(
            "INSERT INTO payment_transfer_requests (transfer_id, request_sha256, request) VALUES ($1, $2, $3)"
            " ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id",
            body.transfer_id, body.sha256(), body.canonical(),
        )  # fmt: skip
        if inserted is not None:
            await connection.execute(
                "INSERT INTO payment_transfers (transfer_id, business_id, payer, payee, amount_minor, currency,"
                " status, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())",
                body.transfer_id, body.business_id, body.payer, body.payee, body.amount_minor, body.currency, SUCCEEDED,
            )  # fmt: skip
    if inserted is None:  # another request with this id committed in between
        return _replay(standin, body, await standin.pool.fetchrow(_SELECT, body.transfer_id))
    standin.record("created", applied=True)
    return answer(201, _transfer(await standin.pool.fetchrow(_SELECT, body.transfer_id)))


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


def create_app(*, dsn: str, seed: int | None = None) -> FastAPI:
    return build_app(standin=Standin(name=SERVICE, seed=seed), dsn=dsn, ddl=DDL, router=router,
                     title="payment system (stand-in)")  # fmt: skip
