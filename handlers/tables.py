"""The default classification tables of the three downstreams: data an operator may replace.

Each reads top to bottom, first match wins, and ends with a catch-all that sends an answer nobody
expected to a person (permanent) rather than guessing. Why the less obvious rows are as they are:
- A 5xx is retried as `server_error`, an unknown outcome: the server may have failed after it
  committed, so the next transfer attempt asks the payment system before it sends again.
- 408 (the server gave up waiting for our request) is retried: it never read the whole request.
- 429 retries no earlier than its Retry-After.
- A 3xx is refused, never followed: where a payment or a signed body goes is configuration.
- The red-packet service's `stale_version` (a newer version is there) is a success: the receive list
  already holds something newer than this update, which is what the update wanted.
- The payment system's 200 is a replay of a transfer it already made under this key.
- The payment system's `request_expired` (a payment system that enforces `expires_at` refused a
  request that arrived late) is retried: it wrote nothing, so the outcome is known. A table that
  leaves it out makes such a refusal a dead letter (`rejected`), never a second payment.

Must never: do I/O. Tests check that each table validates and round-trips through JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from handlers.classification import STATUS_MAX, STATUS_MIN, Action, ClassificationTable, Rule

PAYMENT: Final = "payment"
RED_PACKET: Final = "red_packet"
CALLBACK: Final = "callback"


def _rule(low: int, high: int, action: Action, error_class: str, *, code: str | None = None, detail: str = "") -> Rule:
    return Rule(status_min=low, status_max=high, code=code, action=action, error_class=error_class, detail=detail)


_CATCH_ALL: Final = _rule(STATUS_MIN, STATUS_MAX, Action.PERMANENT, "unexpected_status")
_REDIRECT: Final = _rule(300, 399, Action.PERMANENT, "redirect_refused", detail="redirects are never followed")
_COMMON_TAIL: Final = (
    _rule(408, 408, Action.RETRY, "request_timeout"),
    _rule(429, 429, Action.RETRY_AFTER, "rate_limited"),
    _rule(400, 499, Action.PERMANENT, "rejected"),
    _rule(500, 599, Action.RETRY, "server_error"),
    _CATCH_ALL,
)

PAYMENT_TABLE: Final = ClassificationTable(downstream=PAYMENT, rules=(
    _rule(201, 201, Action.SUCCESS, "transferred", detail="transferred"),
    _rule(200, 200, Action.SUCCESS, "already_transferred", detail="already transferred"),
    _rule(409, 409, Action.PERMANENT, "idempotency_conflict", code="idempotency_conflict",
          detail="the transfer id is taken by a transfer with other content"),
    _rule(422, 422, Action.PERMANENT, "insufficient_funds", code="insufficient_funds"),
    _rule(422, 422, Action.PERMANENT, "account_closed", code="account_closed"),
    _rule(422, 422, Action.RETRY, "request_expired", code="request_expired",
          detail="arrived after its expires_at: refused, nothing applied"),
    _REDIRECT,
    *_COMMON_TAIL,
))  # fmt: skip

RED_PACKET_TABLE: Final = ClassificationTable(downstream=RED_PACKET, rules=(
    _rule(200, 200, Action.SUCCESS, "applied", detail="applied"),
    _rule(409, 409, Action.SUCCESS, "superseded", code="stale_version", detail="superseded by a newer version"),
    _rule(409, 409, Action.PERMANENT, "version_conflict", code="version_conflict",
          detail="this version holds other content"),
    _rule(422, 422, Action.PERMANENT, "red_packet_closed", code="red_packet_closed"),
    _REDIRECT,
    *_COMMON_TAIL,
))  # fmt: skip

CALLBACK_TABLE: Final = ClassificationTable(downstream=CALLBACK, rules=(
    _rule(200, 299, Action.SUCCESS, "delivered", detail="delivered"),
    _REDIRECT,
    _rule(401, 401, Action.PERMANENT, "signature_refused"),
    _rule(403, 403, Action.PERMANENT, "forbidden"),
    _rule(404, 404, Action.PERMANENT, "not_found"),
    _rule(409, 409, Action.PERMANENT, "idempotency_conflict"),
    _rule(410, 410, Action.PERMANENT, "gone"),
    *_COMMON_TAIL,
))  # fmt: skip

DEFAULT_TABLES: Final[Mapping[str, ClassificationTable]] = {
    table.downstream: table for table in (PAYMENT_TABLE, RED_PACKET_TABLE, CALLBACK_TABLE)
}
