"""What the routers use, built by the composition root and handed to `create_app`.

Must never: build its parts from configuration (compensator/wiring/api.py does), or hold a
module-level instance: every app gets its own, so tests run several side by side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from api.auth import TokenCache
from api.health import Readiness
from api.intake import RETRY_AFTER_S, Intake
from api.masked_reads import MaskedQueueClient
from api.metrics import ApiMetrics
from api.problems import Problem
from api.quotas import Quotas
from api.review_policy import FourEyes
from api.summaries import SummaryReads
from api.web.sessions import WebAuth
from delay.policy import RetryPolicy
from queues import ClientError, QueueClient, QueueError, SetsClient, UnknownSet


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSettings:
    set_id: int = 1
    body_bytes_max: int = 256 * 1024 + 16 * 1024
    batch_bytes_max: int = 16 * 1024 * 1024
    batch_items_max: int = 1000
    job_rate_per_s: int = 20
    """A redrive job's rate unless its starter gives one (review.job_rate_per_s)."""
    policy_problems: Callable[[str, RetryPolicy], list[str]] = lambda kind, policy: []
    """What a kind's retry policy would break of its downstream's declared guarantee (the
    configuration's `handlers`: a re-send past a deduplication window...): such a policy is refused."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiServices:
    queue: QueueClient
    tokens: TokenCache
    quotas: Quotas
    intake: Intake
    readiness: Readiness
    metrics: ApiMetrics
    settings: ApiSettings
    four_eyes: FourEyes = dataclasses.field(default_factory=FourEyes)
    web: WebAuth | None = None
    """Users and sessions of the review pages (api/web/sessions.py); None: every page asks for a login."""
    sets: SetsClient | None = None
    """Every set of the set table (store.control_addresses, docs/sets.md); None: one set, `queue`.
    `queue` stays the home set's client: tokens, users, sessions and the review pages live there."""
    summaries: SummaryReads = dataclasses.field(init=False)
    """The dead-letter list's counts and totals: one read of a filter at a time, shared."""
    masked: ApiServices = dataclasses.field(init=False, repr=False)
    """The same services with a store that masks every answer's personal data and writes nothing
    (api/masked_reads.py): what a caller without personal-data rights is given (`of`)."""

    def __post_init__(self) -> None:
        if isinstance(self.queue, MaskedQueueClient):
            return  # the masked twin: its summaries and `masked` are set by the one that made it
        object.__setattr__(self, "summaries", SummaryReads(self.queue))
        twin = dataclasses.replace(self, queue=MaskedQueueClient(self.queue))
        object.__setattr__(twin, "summaries", self.summaries)  # totals hold no personal data: one shared read
        object.__setattr__(twin, "masked", twin)
        object.__setattr__(self, "masked", twin)

    async def start(self) -> None:
        if self.sets is not None:
            await self.sets.refresh()  # unreachable: intake answers 503 until a refresh reads the table
        await self.tokens.start()
        if self.web is not None:
            await self.web.start()

    async def close(self) -> None:
        if self.web is not None:
            await self.web.close()
        await self.tokens.close()
        await self.queue.raft.close()
        if self.sets is not None:
            await self.sets.close()

    async def queue_of(self, set_id: int) -> QueueClient | None:
        """The client of the set a request id names, read as this caller may (masked or not); None
        for a set that does not exist (the caller answers 404)."""
        if self.sets is None:
            return self.queue if set_id == self.settings.set_id else None
        try:
            plain = await self.sets.client_of(set_id)
        except UnknownSet:
            return None
        return MaskedQueueClient(plain) if isinstance(self.queue, MaskedQueueClient) else plain

    @staticmethod
    def read_failure(error: ClientError | QueueError) -> Problem:
        if isinstance(error, QueueError):
            return Problem("invalid-request", f"the store refused the query: {error}")
        return Problem("not-ready", f"the store did not answer: {error}", headers={"Retry-After": RETRY_AFTER_S})


def of(request: Request) -> ApiServices:
    """The services as this request's caller may use them: the store masked (`ApiServices.masked`)
    unless the caller's authentication said it may see personal data (`request.state.personal_data`,
    set by api.auth.requires and api.web.sessions.current_user). A route that authenticated no one
    reads masked: forgetting fails closed."""
    services: ApiServices = request.app.state.services
    return services if getattr(request.state, "personal_data", False) is True else services.masked
