"""The ``transfer`` kind: pay once through the payment system, keyed by the transfer id.

    POST /transfers   Idempotency-Key: <transfer_id>   [Expires-At: <RFC 3339, UTC>]
    {transfer_id, payer, payee, amount_minor, currency, memo?, business_id: <the request's ref_key>,
     expires_at?: <the same instant>}
    GET /transfers/{transfer_id}   200 the transfer | 404 {"code": "not_found"}

A transfer is a money-moving request, so what makes a repeat safe is the heart of this module, and
it depends on what the payment system guarantees (`handlers.payment.guarantee`, docs/worker.md):

**Every guarantee.** The first delivery sends. Every later one (a retry, a redrive) first asks
``GET /transfers/{id}``: found with the content this request would send and SUCCEEDED is
`Succeeded("already transferred")`; found with other content (or not SUCCEEDED) is `Permanent`, a
person must look; not found means what the guarantee below says. A lookup with no usable answer
after an unknown outcome is `Retryable` *keeping the previous error class*, so the next attempt
still knows it must look first (a lookup's 429 must not turn "unknown" into "known not sent").
No request is written once the attempt's lease has ended by this worker's monotonic clock (the
gateway checks `send_by` before every try and just before the headers go out): another delivery
may hold the message by then.

**dedup**: the payment system answers a repeated transfer id with the transfer it made. Not found
is enough to send: should an earlier request still be in flight, the two meet at the payment
system and one transfer exists. Safe while every re-send falls within the payment system's
deduplication window: a worker refuses to start while a retry policy can re-send later than
`dedup_window_s` (delay/policy.py `horizon_ms`); a redrive of an old dead letter can, and the
lookup before it is then what protects it.

**expiry**: the payment system refuses, by its own clock, a request that arrives after the
`expires_at` it carries, and writes nothing. We set it to the attempt's deadline, never later than
the lease's end, in the *store's* time (handlers/lease_time.py: the store's deadline of the lease,
or sooner the gateway's attempt timeout from an upper bound of the store's clock): a request of a
worker that lost its lease can no longer be applied, and the next delivery, on any worker, knows
from the store alone when that is: the grant carries how long the earlier deliveries' requests stay
in doubt (`Attempt.in_doubt_ms`: what each worker reported, else its lease's deadline, the one
bound that survives a kill -9). After an unknown outcome the next attempt waits until that has
passed, plus `clock_skew_ms`, on its own monotonic clock counted from when the grant arrived (the
store's clock has moved at least that far), and only then looks: "not found" is then conclusive
and a re-send is safe. The store holds the retry back until the reported deadline, so the wait
inside an attempt is normally at most the skew bound. Rests on: the store's clock and the
payment system's differ by less than `clock_skew_ms` (a log clock that jumps forward, issue 26,
counts); the payment system checks the expiry in the transaction that writes the transfer.

**none**: nothing stops a late or repeated request. After an unknown outcome a transfer is never
sent again automatically: it is looked up at once (found settles it), and if not found looked up
again once `in_flight_horizon_s` has passed since the earlier requests' in-doubt deadline (the
store holds the retry with a Retry-After); still not found, it is parked as a dead letter of class
`unknown_outcome`, with both lookups in the attempts' error texts as evidence, for finance to
redrive (the next delivery looks once more and then sends: finance decided) or discard, four eyes
either way. Rests on: no request takes effect later than the horizon after its attempt's deadline
(pauses of a worker and holds in the network shorter than that). Nothing here can make this safe
against a longer hold; the reconciliation reports a transfer paid twice.

Must never: send a transfer after an unknown outcome without having looked (and, for expiry, before
the earlier requests have expired; for none, at all until finance redrives), write a request after
the lease ended, or log the payload.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

import msgspec

from handlers.answers import Answer, NotSent, NotSentClass, Outcome, OutcomeUnknown
from handlers.classification import ClassificationTable, code_of, decide, excerpt_of
from handlers.contract import (
    IN_DOUBT_WAIT_MAX_S,
    LOOKUP_FAILED,
    REQUEST_EXPIRED,
    UNKNOWN_OUTCOME,
    UNKNOWN_OUTCOME_CLASSES,
    Attempt,
    Decision,
    Permanent,
    Retryable,
    Succeeded,
)
from handlers.gateway import Outbound, Sender
from handlers.lease_time import LeaseTime
from handlers.settings import Guarantee
from handlers.tables import PAYMENT
from ledger.kinds import Kind, TransferPayload, canonical_json

CONTENT_FIELDS: Final = ("transfer_id", "business_id", "payer", "payee", "amount_minor", "currency", "memo")
"""What "the same transfer" means when one is found under our id."""
SUCCEEDED: Final = "SUCCEEDED"
NOT_FOUND_CODE: Final = "not_found"
"""Absence is believed only when the payment system says so: a bare 404 may be a wrong URL."""
EXPIRES_AT_HEADER: Final = "expires-at"
EXPIRES_AT_FIELD: Final = "expires_at"

Events = Callable[[str], None]
"""What the handler saw, by name, for the worker's metrics: lookup, found, not_found,
lookup_failed, waited, expired_refused, lease_ended, unknown_outcome_pending, unknown_outcome."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferGuarantee:
    """The payment system's guarantee and the bounds the handler's waits rest on."""

    guarantee: Guarantee = Guarantee.DEDUP
    clock_skew_s: float = 1.0
    """`expiry`: the largest difference between the store's clock and the payment system's."""
    horizon_s: float = 300.0
    """`none`: the longest a request may still take effect after its attempt's deadline."""
    request_ttl_s: float = 10.0
    """How far ahead of now a request's deadline is set at most: the gateway's attempt timeout
    (past it the gateway has given up on the answer)."""


def transfer_request(payload: TransferPayload, *, business_id: str) -> dict[str, Any]:
    request = payload.model_dump(exclude_none=True)
    request["business_id"] = business_id
    return request


def rfc3339_ms(unix_ms: int) -> str:
    """``2026-11-25T10:11:12.345Z``: a store time as the payment system reads it."""
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


def _in_doubt(outcome: Outcome) -> bool:
    """Whether a request may have taken effect without our knowing: no answer, or a 5xx (a server
    may fail after it committed, or a proxy may answer while the payment system still works)."""
    return isinstance(outcome, OutcomeUnknown) or (isinstance(outcome, Answer) and outcome.status >= 500)


@dataclass(frozen=True, slots=True)
class _Looked:
    """A lookup that found nothing, with what it said for the evidence of a parked transfer."""

    evidence: str


class TransferHandler:
    def __init__(
        self, *, sender: Sender, table: ClassificationTable, guarantee: TransferGuarantee | None = None,
        events: Events | None = None,
    ) -> None:  # fmt: skip
        self._sender = sender
        self._table = table
        self._guarantee = guarantee or TransferGuarantee()
        self._events: Events = events or (lambda name: None)

    def use(self, table: ClassificationTable) -> None:
        """An operator's edited table (a settings document in the store), from the next answer on."""
        self._table = table

    def __repr__(self) -> str:
        return f"TransferHandler(guarantee={self._guarantee.guarantee.value})"

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
        lease = attempt.lease if attempt.lease is not None else LeaseTime.standalone()
        guarantee = self._guarantee.guarantee
        if guarantee is not Guarantee.DEDUP:
            lease.report()  # the next delivery waits (expiry) or counts its horizon (none) from it
        previous = attempt.previous_error_class
        if guarantee is Guarantee.NONE and previous == UNKNOWN_OUTCOME and attempt.budget_attempt == 1:
            # Finance redrove a parked transfer: look once more (a held request may have landed
            # since), and then send, as they decided.
            looked = await self._look_up(attempt, request, lease, in_doubt=False)
            return looked if not isinstance(looked, _Looked) else await self._send(request, attempt, lease)
        in_doubt = previous in UNKNOWN_OUTCOME_CLASSES
        inherited = attempt.in_doubt_ms is not None and attempt.in_doubt_ms > 0
        if not in_doubt and attempt.attempt == 1 and not inherited:
            return await self._send(request, attempt, lease)
        # A re-send, or the first delivery of an edited version whose predecessor's request may
        # still land (the store passes its deadline on): wait it out (expiry), look, then send.
        if guarantee is Guarantee.EXPIRY:
            held = await self._wait_out(attempt, lease, in_doubt=in_doubt)
            if held is not None:
                return held
        looked = await self._look_up(attempt, request, lease, in_doubt=in_doubt)
        if not isinstance(looked, _Looked):
            return looked
        if guarantee is Guarantee.NONE and in_doubt:
            return self._park(attempt, lease, looked)
        return await self._send(request, attempt, lease)

    # ---- the three steps -----------------------------------------------------------------------
    async def _wait_out(self, attempt: Attempt, lease: LeaseTime, *, in_doubt: bool) -> Decision | None:
        """`expiry`: wait until every earlier request has expired at the payment system (its
        deadline in the store's time, plus the skew bound), or hand the attempt back when that is
        far off. None once it has passed."""
        if attempt.in_doubt_ms is None and not in_doubt:
            return None  # no earlier delivery may have sent
        in_doubt_ms = attempt.in_doubt_ms if attempt.in_doubt_ms is not None else 0
        wait_s = in_doubt_ms / 1000 + self._guarantee.clock_skew_s - lease.elapsed_s()
        if wait_s <= 0:
            return None
        if wait_s > IN_DOUBT_WAIT_MAX_S:
            previous = attempt.previous_error_class
            return Retryable(
                error_class=previous if previous in UNKNOWN_OUTCOME_CLASSES else UNKNOWN_OUTCOME,
                retry_after_s=math.ceil(wait_s), outcome_unknown=True,
                detail=f"an earlier request may still take effect for {wait_s:.1f} s: not looked up yet",
            )  # fmt: skip
        self._events("waited")
        await asyncio.sleep(wait_s)
        return None

    async def _look_up(
        self, attempt: Attempt, request: dict[str, Any], lease: LeaseTime, *, in_doubt: bool
    ) -> Decision | _Looked:
        """The decision the lookup settles, or `_Looked` when the transfer certainly does not exist."""
        url = f"/transfers/{quote(request['transfer_id'], safe='')}"
        self._events("lookup")
        outcome = await self._sender.send(Outbound(method="GET", url=url, trace=attempt.headers))
        if isinstance(outcome, Answer) and outcome.status == 404 and code_of(outcome.body) == NOT_FOUND_CODE:
            self._events("not_found")
            return _Looked(f"GET {url} at {rfc3339_ms(lease.store_now_ms())} (store time): 404 not_found")
        if isinstance(outcome, Answer) and outcome.status == 200:
            self._events("found")
            return compare(request, outcome)
        self._events("lookup_failed")
        decision = decide(self._table, outcome)
        if isinstance(decision, Permanent):
            return decision
        after = decision.retry_after_s if isinstance(decision, Retryable) else None
        if not in_doubt:
            return Retryable(error_class=LOOKUP_FAILED, status=decision.status, retry_after_s=after,
                             detail=f"the lookup before a re-send got {decision.detail}", excerpt=decision.excerpt)  # fmt: skip
        previous = attempt.previous_error_class or "timeout"
        if self._guarantee.guarantee is Guarantee.NONE:  # should the budget run out looking, it is parked as unknown
            previous = UNKNOWN_OUTCOME
        return Retryable(
            error_class=previous, outcome_unknown=True, status=decision.status, retry_after_s=after,
            detail=f"still unknown whether it was transferred: the lookup got {decision.detail}",
            excerpt=decision.excerpt,
        )  # fmt: skip

    def _park(self, attempt: Attempt, lease: LeaseTime, looked: _Looked) -> Decision:
        """`none`: not found after an unknown outcome. Look again once the horizon has passed since
        the earlier requests' in-doubt deadline; once it has, park the transfer for finance."""
        horizon_s = self._guarantee.horizon_s
        since_ms = attempt.in_doubt_ms if attempt.in_doubt_ms is not None else 0
        remaining_s = since_ms / 1000 + horizon_s - lease.elapsed_s()
        previous = attempt.previous_error_class
        unknown = "outcome still unknown" if previous == UNKNOWN_OUTCOME else f"outcome unknown after {previous}"
        if remaining_s > 0:
            self._events("unknown_outcome_pending")
            return Retryable(
                error_class=UNKNOWN_OUTCOME, outcome_unknown=True, retry_after_s=math.ceil(remaining_s),
                detail=f"{unknown}; the payment system does not deduplicate, so it is not sent again."
                       f" Lookup: {looked.evidence}. Looking again in {math.ceil(remaining_s)} s, once the in-flight"
                       f" horizon ({horizon_s:g} s) has passed since its requests' deadline",
            )  # fmt: skip
        self._events("unknown_outcome")
        return Permanent(
            error_class=UNKNOWN_OUTCOME,
            detail=f"{unknown}, never found: {looked.evidence}, {horizon_s - remaining_s:.0f} s after its"
                   f" requests' deadline (in-flight horizon {horizon_s:g} s; the earlier lookup is in the previous"
                   " attempt). The payment system does not deduplicate: redrive sends the transfer again,"
                   " discard leaves it unpaid",
        )  # fmt: skip

    async def _send(self, request: dict[str, Any], attempt: Attempt, lease: LeaseTime) -> Decision:
        guarantee = self._guarantee.guarantee
        headers: list[tuple[str, str]] = [("content-type", "application/json"),
                                          ("idempotency-key", request["transfer_id"])]  # fmt: skip
        body = request
        expires_at_ms = None
        if guarantee is not Guarantee.DEDUP:
            expires_at_ms = lease.expires_at_ms(self._guarantee.request_ttl_s)
            lease.sending(expires_at_ms)
        if guarantee is Guarantee.EXPIRY:
            assert expires_at_ms is not None
            stamp = rfc3339_ms(expires_at_ms)
            body = {**request, EXPIRES_AT_FIELD: stamp}
            headers.append((EXPIRES_AT_HEADER, stamp))
        outcome = await self._sender.send(Outbound(
            method="POST", url="/transfers", body=canonical_json(body), trace=attempt.headers, headers=tuple(headers),
            send_by=lease.send_by(),
        ))  # fmt: skip
        if expires_at_ms is not None:
            lease.settled(in_doubt=_in_doubt(outcome))
        if isinstance(outcome, NotSent) and outcome.error_class is NotSentClass.LEASE_ENDED:
            self._events("lease_ended")
        decision = decide(self._table, outcome)
        if not isinstance(decision, Succeeded) and decision.error_class == REQUEST_EXPIRED:
            self._events("expired_refused")
        return decision
