"""The ``callback`` kind: POST a signed body to a registered target, by name.

The payload names a target; its URL and secret come from configuration (`CallbackTarget`), never
from the request, so a producer cannot make us sign a body for a URL of its choosing. The body is
the payload's JSON in canonical form (sorted keys), the same bytes on every attempt, signed as
``Webhook-Signature: t=<now>,v1=<HMAC>`` (handlers/signing.py) with a fresh timestamp each attempt,
and sent with the request's idempotency key so the receiver can count repeats. Redirects are
refused (the table makes a 3xx permanent), and the gateway's timeouts are the callback's tight ones.

An unknown target is `Permanent("unknown_target")`: configuration changes, not retries, fix it.

Must never: put a secret or a signature in a log line, a repr, an exception or a decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from handlers.answers import Answer
from handlers.classification import ClassificationTable, decide
from handlers.contract import Attempt, Decision, Permanent, Succeeded
from handlers.gateway import Outbound, Sender
from handlers.signing import SIGNATURE_HEADER, Secret, sign
from handlers.tables import CALLBACK
from ledger.kinds import CallbackPayload, Kind, canonical_json


@dataclass(frozen=True, slots=True, kw_only=True)
class CallbackTarget:
    name: str
    url: str
    secret: Secret = field(repr=False)


class CallbackHandler:
    def __init__(
        self, *, sender: Sender, table: ClassificationTable, targets: Mapping[str, CallbackTarget],
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._sender = sender
        self._table = table
        self._targets = dict(targets)
        self._clock = clock

    def use(self, table: ClassificationTable) -> None:
        """An operator's edited table (a settings document in the store), from the next answer on."""
        self._table = table

    def __repr__(self) -> str:
        return f"CallbackHandler(targets={sorted(self._targets)})"

    @property
    def kind(self) -> Kind:
        return Kind.CALLBACK

    @property
    def downstream(self) -> str:
        return CALLBACK

    async def handle(self, attempt: Attempt) -> Decision:
        payload = attempt.payload
        if not isinstance(payload, CallbackPayload):
            raise TypeError(f"a callback attempt carries a {type(payload).__name__}")
        target = self._targets.get(payload.target)
        if target is None:
            return Permanent(error_class="unknown_target", detail=f"no callback target is named {payload.target!r}")
        body = canonical_json(payload.body)
        signature = sign(target.secret, timestamp_s=int(self._clock()), body=body)
        outcome = await self._sender.send(Outbound(
            method="POST", url=target.url, body=body, trace=attempt.headers,
            headers=(("content-type", "application/json"), ("idempotency-key", attempt.idempotency_key),
                     (SIGNATURE_HEADER, signature)),
            send_by=attempt.lease.send_by() if attempt.lease is not None else None,
        ))  # fmt: skip
        decision = decide(self._table, outcome)
        if isinstance(decision, Succeeded) and isinstance(outcome, Answer) and _repeat(outcome.body):
            return Succeeded(detail="already delivered", status=decision.status, excerpt=decision.excerpt)
        return decision


def _repeat(body: bytes) -> bool:
    try:
        said = msgspec.json.decode(body, type=dict[str, Any])
    except msgspec.DecodeError:
        return False
    return said.get("repeat") is True
