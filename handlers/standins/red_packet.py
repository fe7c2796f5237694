"""The red-packet service's stand-in: receive lists that only ever move to a newer version.

    PUT /red-packets/{red_packet_id}/receivers/{receiver}    Idempotency-Key: <key>
        {version, amount_minor, currency}
        200 {"applied": true, "version": v, "repeat": false}   a newer version, applied now
        200 {"applied": true, "version": v, "repeat": true}    this version is already there, same content
        409 {"code": "stale_version", "current_version": v}    a newer version is there; nothing changed
        409 {"code": "version_conflict", "current_version": v} this version is there with other content
        422 {"code": "red_packet_closed"}                      drawn at the fault settings' permanent_rate
        400 {"code": "missing_idempotency_key"} | {"code": "invalid_request"}
    GET /red-packets/{red_packet_id}/receivers               200 {"receivers": [...]}

Tables: ``red_packet_receivers`` (the receive list: one row per receiver, its current version),
``red_packet_versions`` (every version ever applied, in the order applied: a test reads it to prove
no receiver's version went backwards) and ``red_packet_grants`` (the reconciliation's shape; a row,
state GRANTED, grant id ``<red_packet_id>:<receiver>``, when a receiver's entry is first applied;
a newer version updates its amount). One transaction per update: the upsert locks the receiver's
row, so concurrent updates apply in version order or not at all.

Must never: apply a version lower than or equal to the one there, or record one it did not apply.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from handlers.standins.service import PlanDep, Standin, StandinDep, answer, build_app, segment
from ledger.upstream import RED_PACKET_GRANTS_DDL

SERVICE: Final = "red_packet"
GRANTED: Final = "GRANTED"
VERSION_MAX: Final = 2**53 - 1

DDL: Final = (
    RED_PACKET_GRANTS_DDL
    + """
CREATE TABLE IF NOT EXISTS red_packet_receivers (
    red_packet_id text NOT NULL,
    receiver      text NOT NULL,
    version       bigint NOT NULL,
    amount_minor  bigint NOT NULL,
    currency      text NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (red_packet_id, receiver)
);
CREATE TABLE IF NOT EXISTS red_packet_versions (
    seq             bigserial PRIMARY KEY,
    red_packet_id   text NOT NULL,
    receiver        text NOT NULL,
    version         bigint NOT NULL,
    amount_minor    bigint NOT NULL,
    currency        text NOT NULL,
    idempotency_key text NOT NULL,
    applied_at      timestamptz NOT NULL,
    UNIQUE (red_packet_id, receiver, version)
);
"""
)


class ReceiverUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Annotated[int, Field(ge=1, le=VERSION_MAX)]
    amount_minor: Annotated[int, Field(gt=0, le=10**15)]
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]


_UPSERT: Final = """
INSERT INTO red_packet_receivers AS r (red_packet_id, receiver, version, amount_minor, currency, updated_at)
VALUES ($1, $2, $3, $4, $5, clock_timestamp())
ON CONFLICT (red_packet_id, receiver) DO UPDATE
    SET version = EXCLUDED.version, amount_minor = EXCLUDED.amount_minor, currency = EXCLUDED.currency,
        updated_at = EXCLUDED.updated_at
    WHERE r.version < EXCLUDED.version
RETURNING r.version
"""
"""Applies only a newer version. ON CONFLICT locks the existing row even when the WHERE refuses,
so the SELECT that follows a refusal sees a version nobody can change before we commit."""

_GRANT: Final = """
INSERT INTO red_packet_grants (grant_id, red_packet_id, recipient, amount_minor, currency, state, granted_at)
VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())
ON CONFLICT (grant_id) DO UPDATE SET amount_minor = EXCLUDED.amount_minor, currency = EXCLUDED.currency
"""

router = APIRouter()


@router.put("/red-packets/{red_packet_id}/receivers/{receiver}")
async def put_receiver(
    red_packet_id: str, receiver: str, body: ReceiverUpdate, standin: StandinDep, plan: PlanDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:  # fmt: skip
    if not idempotency_key:
        standin.record("missing_idempotency_key")
        return answer(400, {"code": "missing_idempotency_key"})
    if plan.permanent:
        standin.record("red_packet_closed")
        return answer(422, {"code": "red_packet_closed"})
    packet, who = segment(red_packet_id), segment(receiver)
    async with standin.pool.acquire() as connection, connection.transaction():
        row = await connection.fetchrow(_UPSERT, packet, who, body.version, body.amount_minor, body.currency)
        if row is None:
            current = await connection.fetchrow(
                "SELECT version, amount_minor, currency FROM red_packet_receivers WHERE red_packet_id = $1 AND receiver = $2",
                packet, who,
            )  # fmt: skip
            return _not_applied(standin, body, current)
        await connection.execute(
            "INSERT INTO red_packet_versions (red_packet_id, receiver, version, amount_minor, currency, idempotency_key,"
            " applied_at) VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())",
            packet, who, body.version, body.amount_minor, body.currency, idempotency_key,
        )  # fmt: skip
        await connection.execute(_GRANT, f"{packet}:{who}", packet, who, body.amount_minor, body.currency, GRANTED)
    standin.record("applied", applied=True)
    return answer(200, {"applied": True, "version": body.version, "repeat": False})


def _not_applied(standin: Standin, body: ReceiverUpdate, current: Any) -> JSONResponse:
    version = int(current["version"])
    if version > body.version:
        standin.record("stale_version")
        return answer(409, {"code": "stale_version", "current_version": version})
    if (current["amount_minor"], current["currency"]) != (body.amount_minor, body.currency):
        standin.record("version_conflict")
        return answer(409, {"code": "version_conflict", "current_version": version})
    standin.record("repeat", repeat=True)
    return answer(200, {"applied": True, "version": version, "repeat": True})


@router.get("/red-packets/{red_packet_id}/receivers")
async def get_receivers(red_packet_id: str, standin: StandinDep) -> JSONResponse:
    rows = await standin.pool.fetch(
        "SELECT receiver, version, amount_minor, currency FROM red_packet_receivers WHERE red_packet_id = $1"
        " ORDER BY receiver", segment(red_packet_id),
    )  # fmt: skip
    standin.record("listed")
    return answer(200, {"receivers": [dict(row) for row in rows]})


def create_app(*, dsn: str, seed: int | None = None) -> FastAPI:
    return build_app(standin=Standin(name=SERVICE, seed=seed), dsn=dsn, ddl=DDL, router=router,
                     title="red-packet service (stand-in)")  # fmt: skip
