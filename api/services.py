"""What the routers use, built by the composition root and handed to `create_app`.

Must never: build its parts from configuration (compensator/wiring/api.py does), or hold a
module-level instance: every app gets its own, so tests run several side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

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
from queues import ClientError, QueueClient, QueueError, QueueResult, SetsClient, UnknownSet, cluster_settings

T = TypeVar("T")

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
    settings_repair_s: float = 30.0
    """With several sets: how often the settings repair compares every set with the intended
    settings (store.sets_refresh_s; docs/sets.md)."""


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
    `queue` stays the home set's client; tokens, users and sessions live in the control set
    (`control_services`, set 0 of the audit list)."""
    summaries: SummaryReads = dataclasses.field(init=False)
    """The dead-letter list's counts and totals: one read of a filter at a time, shared."""
    background: list[asyncio.Task[None]] = dataclasses.field(init=False, default_factory=list, repr=False)
    """With several sets: the settings repair task (started by `start`, cancelled by `close`)."""
    masked: ApiServices = dataclasses.field(init=False, repr=False)
    """The same services with a store that masks every answer's personal data and writes nothing
    (api/masked_reads.py): what a caller without personal-data rights is given (`of`)."""
    cluster_reader: list[int] = dataclasses.field(default_factory=list, repr=False)
    """With several sets: the set `cluster_read` last had an answer from (shared by the twins)."""
    per_set: dict[int, ApiServices] = dataclasses.field(init=False, repr=False)
    """With several sets: the services of each other set (`in_set`), made once, shared by the twins."""

    def __post_init__(self) -> None:
        if isinstance(self.queue, MaskedQueueClient):
            return  # the masked twin: its summaries and `masked` are set by the one that made it
        object.__setattr__(self, "summaries", SummaryReads(self.queue))
        object.__setattr__(self, "per_set", {})
        twin = dataclasses.replace(self, queue=MaskedQueueClient(self.queue))
        object.__setattr__(twin, "summaries", self.summaries)  # totals hold no personal data: one shared read
        object.__setattr__(twin, "per_set", self.per_set)
        object.__setattr__(twin, "masked", twin)
        object.__setattr__(self, "masked", twin)

    async def in_set(self, set_id: int) -> ApiServices | None:
        """These services as the review uses them for one set's requests, proposals and jobs: `queue`
        that set's client (masked as this caller's is) and `settings.set_id` that set's, so every
        id read from it is public as `{set}-{message}`. Itself for its own set; None for a set that
        does not exist (the caller answers 404). One set: only its own set exists."""
        if set_id == self.settings.set_id:
            return self
        if self.sets is None:
            return None
        try:
            plain = await self.sets.client_of(set_id)
        except UnknownSet:
            return None
        found = self.per_set.get(set_id)
        if found is None or found.queue is not plain:  # new, or the set's addresses changed
            found = dataclasses.replace(self, queue=plain, settings=dataclasses.replace(self.settings, set_id=set_id))
            object.__setattr__(found, "per_set", self.per_set)
            object.__setattr__(found.masked, "per_set", self.per_set)
            self.per_set[set_id] = found
        return found.masked if isinstance(self.queue, MaskedQueueClient) else found

    async def cluster_read(self, read: Callable[[QueueClient], Awaitable[T]]) -> T:
        """A read of what every set holds alike once fanned out (kinds, pauses, policies, breakers'
        documents, classification tables, retention): the home set's answer; with several sets, when
        it does not answer, the next set's that does (the one that answered last is asked first
        next time, so a home set that is down costs one deadline, not one per read)."""
        if self.sets is None:
            return await read(self.queue)
        order = [self.settings.set_id, *(s for s in self.sets.set_ids if s != self.settings.set_id)]
        preferred = self.cluster_reader[0] if self.cluster_reader else self.settings.set_id
        order.sort(key=lambda set_id: set_id != preferred)
        first: ClientError | None = None
        for set_id in order:
            queue = await self.queue_of(set_id)
            if queue is None:
                continue
            try:
                answer = await read(queue)
            except ClientError as error:
                first = first or error
                continue
            self.cluster_reader[:] = [set_id]
            return answer
        assert first is not None
        raise first

    def control_services(self) -> ApiServices | None:
        """These services over the control set (set 0: its audit chain holds the set table's and the
        intended settings' writes, tokens and users), read as this caller may; None with one set."""
        if self.sets is None or self.sets.control is None:
            return None
        plain = self.sets.control.queue
        found = self.per_set.get(0)
        if found is None:
            found = dataclasses.replace(self, queue=plain, settings=dataclasses.replace(self.settings, set_id=0))
            object.__setattr__(found, "per_set", self.per_set)
            object.__setattr__(found.masked, "per_set", self.per_set)
            self.per_set[0] = found
        return found.masked if isinstance(self.queue, MaskedQueueClient) else found

    async def every_set(self) -> list[ApiServices]:
        """`in_set` of every set of the table, in set order (one set: itself)."""
        if self.sets is None:
            return [self]
        await self.sets.refresh_if_due()
        found = [await self.in_set(set_id) for set_id in self.sets.set_ids]
        return [services for services in found if services is not None]

    async def start(self) -> None:
        if self.sets is not None:
            await self.sets.refresh()  # unreachable: intake answers 503 until a refresh reads the table
            self.background.append(asyncio.create_task(
                self.sets.repair_settings_forever(self.settings.settings_repair_s, self.metrics.observe_repair)))
        await self.tokens.start()
        if self.web is not None:
            await self.web.start()

    async def close(self) -> None:
        for task in self.background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.background.clear()
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

    async def fan_out(self, setting: cluster_settings.Setting, *, actor: str) -> cluster_settings.BroadcastOutcome:
        """A cluster-wide setting written to every set (several sets only), or the problem that says
        which sets did not apply it: never a partial success answered as done."""
        assert self.sets is not None
        retry = {"Retry-After": RETRY_AFTER_S}
        try:
            outcome = await self.sets.broadcast(setting, actor=actor)
        except cluster_settings.IntentUnavailable as error:
            if error.refused:
                raise Problem("conflict", str(error)) from None
            raise Problem("not-ready", f"{error}. Repeating the same call is safe.", headers=retry) from None
        if outcome.unreachable:
            raise Problem(
                "partially-applied",
                f"{outcome.summary()}. Repeating the same call is safe (each set's write is idempotent); the settings"
                f" repair also applies it to those sets once they answer.",
                headers=retry, extra={"applied_sets": outcome.applied, "unapplied_sets": outcome.unreachable},
            )  # fmt: skip
        return outcome

    async def write_setting(self, setting: cluster_settings.Setting, *, actor: str) -> QueueResult:
        """A cluster-wide setting written: to every set with several (`fan_out`; a set's refusal is
        the invalid-request problem naming the sets), else to the one store. Answers a set's result."""
        if self.sets is not None:
            outcome = await self.fan_out(setting, actor=actor)
            if outcome.refused:
                raise Problem("invalid-request", f"the store refused it in sets {', '.join(map(str, outcome.refused))};"
                              f" applied in sets {', '.join(map(str, outcome.applied)) or 'none'}")  # fmt: skip
            first = outcome.first()
            assert first is not None  # every set answered, and none refused
            return first
        try:
            result = await cluster_settings.apply(self.queue, setting, actor=actor)
        except ClientError as error:
            raise self.read_failure(error) from None
        except QueueError as error:
            raise Problem("invalid-request", f"the store refused it: {error}") from None
        if cluster_settings.settled(setting, result) is None:
            raise Problem("invalid-request", f"the store refused it: {getattr(result, 'code', result)!r}")
        return result

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
