"""The contract between a worker and the handler of a kind: an attempt in, a decision out.

A handler builds its kind's downstream call, has the gateway send it, and classifies the answer
into a value. It never retries across attempts, acks, fails or decides a delay, and sleeps only to
wait out an earlier delivery's requests that may still take effect (the transfer handler against
a downstream that enforces expiry, for at most `IN_DOUBT_WAIT_MAX_S`): the worker
executes the decision, and the kind's retry policy in the store picks the next due time. So
"what happened downstream" (here) and "what to do about it" (delay/policy.py) stay apart, and a
handler is a function of its attempt and the downstream's answers, tested against real stand-ins.

Decisions, in the order a worker cares about them:
- `Succeeded`: the effect exists downstream now, whether this attempt made it or an earlier one did
  (`detail` says which: "transferred", "already transferred", "superseded by version 9").
- `Retryable`: try again later; `retry_after_s` is the downstream's own Retry-After, honoured as
  the earliest next attempt. `outcome_unknown` marks an answer lost after the request was sent
  (a timeout, a connection cut, a 5xx): the next attempt must find out before it repeats a
  non-idempotent effect.
- `Permanent`: no retry can succeed (insufficient funds, an account closed, a malformed request):
  the message goes to the dead-letter tier for finance.

Must never: raise for an expected downstream outcome (a timeout is a `Retryable`, not an
exception), or log a payload, a secret or a signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from handlers.lease_time import LeaseTime
from ledger.kinds import Kind, Payload

EXCERPT_CHARS_MAX: Final = 500
"""How much of a downstream's answer is kept with an attempt (the review page shows it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One delivery of one message, as the worker hands it to the kind's handler."""

    message_id: int
    kind: Kind
    ref_key: str
    idempotency_key: str
    """The producer's key, namespaced by producer (``red-packet:k-1``): stable across attempts."""
    payload: Payload
    attempt: int
    """1 for the first delivery."""
    previous_error_class: str | None
    """How the delivery before this one ended (None for the first): a handler checks downstream
    before it repeats an effect whose earlier outcome is unknown."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Trace context (traceparent, tracestate) to pass downstream."""
    in_doubt_ms: int | None = None
    """From the grant (queues.model.Grant.in_doubt_ms): how long after the grant, by the store's
    clock, a request an earlier delivery sent may still take effect; negative once passed; None
    when no earlier delivery may have sent one."""
    budget_attempt: int = 1
    """From the grant: 1 for the first delivery after an enqueue or a redrive."""
    lease: LeaseTime | None = None
    """The lease's time (handlers/lease_time.py), from the worker; None outside a worker (a
    handler then uses `LeaseTime.standalone()`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Succeeded:
    detail: str
    status: int | None = None
    """The downstream's HTTP status, when one answered."""
    excerpt: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Retryable:
    error_class: str
    detail: str
    status: int | None = None
    retry_after_s: float | None = None
    outcome_unknown: bool = False
    excerpt: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Permanent:
    error_class: str
    detail: str
    status: int | None = None
    excerpt: str = ""


Decision = Succeeded | Retryable | Permanent

UNKNOWN_OUTCOME: Final = "unknown_outcome"
"""A money-moving request whose outcome stayed unknown where the downstream guarantees nothing
(`none`): looked up, looked up again after the in-flight horizon, never found. Retryable while the
second lookup waits; then permanent: a dead letter for finance to redrive (the transfer is sent
again) or discard (four eyes either way)."""
REQUEST_EXPIRED: Final = "request_expired"
"""The downstream refused a request that arrived after its `expires_at`: nothing was applied."""
LOOKUP_FAILED: Final = "lookup_failed"
"""A lookup before a re-send got no usable answer, where nothing earlier was in doubt."""
IN_DOUBT_WAIT_MAX_S: Final = 60.0
"""The longest an attempt waits, holding its slot, for an earlier delivery's requests to expire;
longer, it goes back to the store with a Retry-After (the store's due time normally covers it)."""

UNKNOWN_OUTCOME_CLASSES: Final = frozenset(
    {"timeout", "connection_lost", "server_error", "lease_expired", "interrupted", "handler_error", UNKNOWN_OUTCOME}
)
"""Error classes after which an earlier delivery may have taken effect: a transfer asks the payment
system before it sends again. `lease_expired`: the worker died or stalled mid-attempt;
`interrupted`: a draining worker cut it off (queues.model.ERROR_CLASS_INTERRUPTED); `handler_error`:
the handler raised, perhaps after it sent; `unknown_outcome`: still unknown after a lookup."""


class Handler(Protocol):
    """One per kind; holds no state between attempts but its gateway's connection pool."""

    @property
    def kind(self) -> Kind: ...

    @property
    def downstream(self) -> str:
        """The system it calls ("payment", "red_packet", "callback"): the unit of concurrency
        limits, classification tables and circuit breakers."""
        ...

    async def handle(self, attempt: Attempt) -> Decision: ...
