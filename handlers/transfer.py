"""The ``transfer`` kind: pay once through the payment system, keyed by the transfer id.

    POST /transfers   Idempotency-Key: <transfer_id>
    {transfer_id, payer, payee, amount_minor, currency, memo?, business_id: <the request's ref_key>}

The payment system deduplicates on the transfer id, and the handler does not rely on that alone:
when the delivery before this one ended with an unknown outcome (`UNKNOWN_OUTCOME_CLASSES`: a
timeout, a cut connection, a 5xx, an expired lease), it first asks ``GET /transfers/{id}``:
- found, with the content this request would send, and SUCCEEDED: `Succeeded("already transferred")`;
- found with other content (or not SUCCEEDED): `Permanent`, since a person must look at it;
- not found (404 ``not_found``): the transfer was never made, so it is sent now;
- no usable answer: `Retryable` *keeping the previous error class*, so the next attempt still
  knows that it must look first (a lookup's 429 must not turn "unknown" into "known not sent").

So however many attempts time out after the payment system committed, one transfer exists.

Must never: send a transfer after an unknown outcome without having looked, or log the payload.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

import msgspec

from handlers.answers import Answer
from handlers.classification import ClassificationTable, code_of, decide, excerpt_of
from handlers.contract import UNKNOWN_OUTCOME_CLASSES, Attempt, Decision, Permanent, Retryable, Succeeded
from handlers.gateway import Outbound, Sender
from handlers.tables import PAYMENT
from ledger.kinds import Kind, TransferPayload, canonical_json

CONTENT_FIELDS: Final = ("transfer_id", "business_id", "payer", "payee", "amount_minor", "currency", "memo")
"""What "the same transfer" means when one is found under our id."""
SUCCEEDED: Final = "SUCCEEDED"
NOT_FOUND_CODE: Final = "not_found"
"""Absence is believed only when the payment system says so: a bare 404 may be a wrong URL."""


def transfer_request(payload: TransferPayload, *, business_id: str) -> dict[str, Any]:
    request = payload.model_dump(exclude_none=True)
    request["business_id"] = business_id
    return request


def compare(request: dict[str, Any], found: Answer) -> Decision:
    """A transfer found under our id, against the one we would send."""
    try:
        stored = msgspec.json.decode(found.body, type=dict[str, Any])
    except msgspec.DecodeError:
        return Retryable(error_class="server_error", detail="the lookup's answer is not a JSON object",
                         status=found.status, outcome_unknown=True, excerpt=excerpt_of(found.body))  # fmt: skip
    differing = [name for name in CONTENT_FIELDS if stored.get(name) != request.get(name)]
    excerpt = excerpt_of(found.body)
    if differing:
        return Permanent(
            error_class="transfer_mismatch", status=found.status, excerpt=excerpt,
            detail=f"a transfer with this id exists with another {', '.join(differing)}: a person must look",
        )  # fmt: skip
    if stored.get("status") != SUCCEEDED:
        return Permanent(error_class="transfer_not_succeeded", status=found.status, excerpt=excerpt,
                         detail=f"the transfer exists with status {str(stored.get('status'))[:32]!r}")  # fmt: skip
    return Succeeded(detail="already transferred", status=found.status, excerpt=excerpt)


class TransferHandler:
    def __init__(self, *, sender: Sender, table: ClassificationTable) -> None:
        self._sender = sender
        self._table = table

    def use(self, table: ClassificationTable) -> None:
        """An operator's edited table (a settings document in the store), from the next answer on."""
        self._table = table

    def __repr__(self) -> str:
        return "TransferHandler()"

    @property
    def kind(self) -> Kind:
        return Kind.TRANSFER

    @property
    def downstream(self) -> str:
        return PAYMENT

    async def handle(self, attempt: Attempt) -> Decision:
        payload = attempt.payload
        if not isinstance(payload, TransferPayload):
            raise TypeError(f"a transfer attempt carries a {type(payload).__name__}")
        request = transfer_request(payload, business_id=attempt.ref_key)
        if attempt.previous_error_class in UNKNOWN_OUTCOME_CLASSES:
            looked = await self._look_up(attempt, request)
            if looked is not None:
                return looked
        outcome = await self._sender.send(Outbound(
            method="POST", url="/transfers", body=canonical_json(request), trace=attempt.headers,
            headers=(("content-type", "application/json"), ("idempotency-key", payload.transfer_id)),
        ))  # fmt: skip
        return decide(self._table, outcome)

    async def _look_up(self, attempt: Attempt, request: dict[str, Any]) -> Decision | None:
        """The decision the lookup settles, or None when the transfer certainly does not exist."""
        url = f"/transfers/{quote(request['transfer_id'], safe='')}"
        outcome = await self._sender.send(Outbound(method="GET", url=url, trace=attempt.headers))
        if isinstance(outcome, Answer) and outcome.status == 404 and code_of(outcome.body) == NOT_FOUND_CODE:
            return None
        if isinstance(outcome, Answer) and outcome.status == 200:
            return compare(request, outcome)
        decision = decide(self._table, outcome)
        if isinstance(decision, Permanent):
            return decision
        previous = attempt.previous_error_class or "timeout"
        return Retryable(
            error_class=previous, outcome_unknown=True, status=decision.status,
            retry_after_s=decision.retry_after_s if isinstance(decision, Retryable) else None,
            detail=f"still unknown whether it was transferred: the lookup got {decision.detail}",
            excerpt=decision.excerpt,
        )  # fmt: skip
