"""The ``list_update`` kind: put one receiver's entry of a red packet's receive list, at its version.

    PUT /red-packets/{red_packet_id}/receivers/{receiver}   Idempotency-Key: <the request's key>
    {version, amount_minor, currency}

The red-packet service applies only a newer version, so the version is the idempotency: repeating
an update is harmless, and an update that arrives after a newer one is refused as
``stale_version``. That refusal is a success here (the table says so): the list already holds what
came later, which is all an older update could have wanted. The detail names the version found.

Must never: drop the version, or treat a stale version as an error to retry.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec

from handlers.answers import Answer, Outcome
from handlers.classification import ClassificationTable, decide
from handlers.contract import Attempt, Decision, Succeeded
from handlers.gateway import Outbound, Sender
from handlers.tables import RED_PACKET
from ledger.kinds import Kind, ListUpdatePayload, canonical_json


def success_detail(outcome: Outcome) -> str | None:
    """What the service's answer says happened, in words: which version is there now."""
    if not isinstance(outcome, Answer):
        return None
    try:
        said = msgspec.json.decode(outcome.body, type=dict[str, Any])
    except msgspec.DecodeError:
        return None
    if said.get("code") == "stale_version":
        return f"superseded by version {said.get('current_version')}"
    if said.get("repeat") is True:
        return f"version {said.get('version')} already applied"
    if said.get("applied") is True:
        return f"applied version {said.get('version')}"
    return None


class ListUpdateHandler:
    def __init__(self, *, sender: Sender, table: ClassificationTable) -> None:
        self._sender = sender
        self._table = table

    def use(self, table: ClassificationTable) -> None:
        """An operator's edited table (a settings document in the store), from the next answer on."""
        self._table = table

    def __repr__(self) -> str:
        return "ListUpdateHandler()"

    @property
    def kind(self) -> Kind:
        return Kind.LIST_UPDATE

    @property
    def downstream(self) -> str:
        return RED_PACKET

    async def handle(self, attempt: Attempt) -> Decision:
        payload = attempt.payload
        if not isinstance(payload, ListUpdatePayload):
            raise TypeError(f"a list update attempt carries a {type(payload).__name__}")
        url = f"/red-packets/{quote(payload.red_packet_id, safe='')}/receivers/{quote(payload.receiver, safe='')}"
        body = {"version": payload.version, "amount_minor": payload.amount_minor, "currency": payload.currency}
        outcome = await self._sender.send(Outbound(
            method="PUT", url=url, body=canonical_json(body), trace=attempt.headers,
            headers=(("content-type", "application/json"), ("idempotency-key", attempt.idempotency_key)),
            send_by=attempt.lease.send_by() if attempt.lease is not None else None,
        ))  # fmt: skip
        decision = decide(self._table, outcome)
        detail = success_detail(outcome) if isinstance(decision, Succeeded) else None
        if detail is not None:
            assert isinstance(decision, Succeeded)
            return Succeeded(detail=detail, status=decision.status, excerpt=decision.excerpt)
        return decision
