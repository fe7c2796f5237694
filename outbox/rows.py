"""The outbox's rows: adding a request in the producer's transaction, claiming due rows, settling them.

Owns: every SQL statement on the outbox table. Adding is idempotent by key: the same key with the
same body adds nothing (a producer retrying its own transaction is safe); the same key with another
body is :class:`OutboxConflict`, at once, in the producer's transaction, instead of a 422 from the
API hours later. Claiming takes due pending rows ``FOR UPDATE SKIP LOCKED``, so several relays share
the work and never send one row at the same time; the lock is held until the claiming transaction
settles the rows.

Must never: delete a row, or move a row out of ``sent`` or ``rejected``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from outbox.schema import DEFAULT_TABLE, check_table

KEY_PATTERN: Final = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,93}[\x21-\x7e]|[\x21-\x7e]")
"""The API's Idempotency-Key: 1-95 printable ASCII characters, no space at either end."""
BODY_BYTES_MAX: Final = 256 * 1024 + 16 * 1024
"""The API's default limit for one request: a payload of up to 256 KiB plus the envelope."""
CLAIM_MAX: Final = 1000
ERROR_CHARS_MAX: Final = 500


class OutboxConflict(ValueError):
    """This idempotency key is already in the outbox with another body."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRequest:
    """One request for ``POST /v1/requests``: the body, and the Idempotency-Key it is sent under."""

    key: str
    body: Mapping[str, Any]

    def __post_init__(self) -> None:
        if KEY_PATTERN.fullmatch(self.key) is None:
            raise ValueError("an idempotency key is 1-95 printable ASCII characters, without spaces at the ends")
        if not isinstance(self.body.get("kind"), str) or not isinstance(self.body.get("payload"), Mapping):
            raise ValueError("a request body needs a kind (a string) and a payload (an object)")
        if len(self.encoded()) > BODY_BYTES_MAX:
            raise ValueError(f"a request body is at most {BODY_BYTES_MAX} bytes")

    @classmethod
    def of(cls, *, key: str, kind: str, ref_key: str, payload: Mapping[str, Any], **extra: Any) -> OutboxRequest:
        """The body from its members (``delay_s``, ``not_before``, ``failure`` go in ``extra``)."""
        return cls(key=key, body={"kind": kind, "ref_key": ref_key, "payload": dict(payload), **extra})

    def encoded(self) -> str:
        return json.dumps(self.body, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Claimed:
    id: int
    key: str
    body: str  # the JSON document as stored
    attempts: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    pending: int
    sent: int
    rejected: int
    oldest_pending_age_s: float  # 0 when nothing is pending


async def add(connection: Any, request: OutboxRequest, *, table: str = DEFAULT_TABLE) -> bool:
    """Put ``request`` in the outbox on ``connection`` (asyncpg), in whatever transaction it is in.

    True when it was added now; False when the same key and body were already there."""
    check_table(table)
    body = request.encoded()
    added = await connection.fetchval(
        f"""INSERT INTO {table} (idempotency_key, body) VALUES ($1, $2::jsonb)
            ON CONFLICT (idempotency_key) DO NOTHING RETURNING id""",
        request.key,
        body,
    )
    if added is not None:
        return True
    same = await connection.fetchval(
        f"SELECT body = $2::jsonb FROM {table} WHERE idempotency_key = $1", request.key, body
    )
    if not same:
        raise OutboxConflict(f"idempotency key {request.key!r} is already in the outbox with another body")
    return False


async def status(connection: Any, *, table: str = DEFAULT_TABLE) -> OutboxStatus:
    check_table(table)
    row = await connection.fetchrow(
        f"""SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
                   count(*) FILTER (WHERE state = 'sent') AS sent,
                   count(*) FILTER (WHERE state = 'rejected') AS rejected,
                   coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0)
                       AS oldest_s
            FROM {table}"""
    )
    return OutboxStatus(
        pending=row["pending"], sent=row["sent"], rejected=row["rejected"], oldest_pending_age_s=float(row["oldest_s"])
    )


async def claim(connection: Any, *, table: str, limit: int) -> list[Claimed]:
    """Due pending rows, oldest first, locked until the caller's transaction ends; others skip them."""
    assert 1 <= limit <= CLAIM_MAX, limit
    rows = await connection.fetch(
        f"""SELECT id, idempotency_key, body::text AS body, attempts FROM {table}
            WHERE state = 'pending' AND next_attempt_at <= now()
            ORDER BY next_attempt_at, id LIMIT $1 FOR UPDATE SKIP LOCKED""",
        limit,
    )
    return [Claimed(id=r["id"], key=r["idempotency_key"], body=r["body"], attempts=r["attempts"]) for r in rows]


async def mark_sent(connection: Any, *, table: str, rows: Sequence[tuple[int, int, str | None]]) -> None:
    """(id, status, the API's request id) of rows the API accepted."""
    await connection.executemany(
        f"""UPDATE {table} SET state = 'sent', finished_at = now(), attempts = attempts + 1,
                response_status = $2, request_id = $3, last_error = NULL
            WHERE id = $1 AND state = 'pending'""",
        rows,
    )


async def mark_rejected(connection: Any, *, table: str, rows: Sequence[tuple[int, int, str]]) -> None:
    """(id, status, the problem document as JSON) of rows the API refused for what they are."""
    await connection.executemany(
        f"""UPDATE {table} SET state = 'rejected', finished_at = now(), attempts = attempts + 1,
                response_status = $2, problem = $3::jsonb
            WHERE id = $1 AND state = 'pending'""",
        rows,
    )


async def mark_retry(connection: Any, *, table: str, rows: Sequence[tuple[int, int | None, str, float]]) -> None:
    """(id, status or None, what went wrong, seconds to wait) of rows to try again later."""
    await connection.executemany(
        f"""UPDATE {table} SET attempts = attempts + 1, response_status = $2, last_error = $3,
                next_attempt_at = now() + make_interval(secs => $4)
            WHERE id = $1 AND state = 'pending'""",
        [(row_id, code, error[:ERROR_CHARS_MAX], delay_s) for row_id, code, error, delay_s in rows],
    )
