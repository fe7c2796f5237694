"""The relay: pending outbox rows to ``POST /v1/requests``, each under its own Idempotency-Key.

Owns: one round (claim due rows ``FOR UPDATE SKIP LOCKED``, send them with bounded concurrency,
settle each by :func:`outbox.outcome.classify` in the same transaction, commit), and the loop of
rounds with its waits. A row is marked only after the API answered, in the transaction that held its
lock: a relay killed mid-round leaves its rows pending, and the next send of the same key is
answered 200 (a replay), so the effect is once. Several relays may run: each claims other rows.

When a send cannot be settled (no answer, 5xx, 429, a bad token), the round stops sending: the rest
of its rows stay untouched for a later round, and the relay waits the Retry-After, or a backoff that
doubles with each failed round in a row, before it tries again. An unreachable API thus costs one
probe per wait, not one per row.

Must never: log, print or store the token; reject a row for anything but the API's verdict on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from typing import Any, Final

import asyncpg
import httpx
import msgspec
from opentelemetry import propagate, trace

from outbox import rows
from outbox.metrics import RelayMetrics
from outbox.outcome import Outcome, Rejected, Retry, Sent, backoff_s, classify, parse_retry_after
from outbox.schema import DEFAULT_TABLE, check_table

log = logging.getLogger("outbox.relay")
REQUESTS_PATH: Final = "/v1/requests"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ApiTarget:
    """Where requests go and the bearer token (a producer's) that lets them in; never in a repr."""

    url: str
    token: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("the compensation API's URL must start with http:// or https://")
        if not self.token or any(c.isspace() for c in self.token):
            raise ValueError("the compensation API needs a bearer token (one word)")


class RelaySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A relay's limits; also the fields of the service's ``[outbox]`` configuration section."""

    table: str = DEFAULT_TABLE
    """The outbox table in the producer's database (schema-qualified if need be)."""
    batch_max: int = 100
    """Rows claimed per round (and locked for its length)."""
    concurrency: int = 8
    """Sends in flight at once within a round."""
    poll_interval_s: float = 0.5
    """How long an idle relay waits before it looks for due rows again."""
    http_timeout_s: float = 10.0
    """One POST to the API; past it the row is retried with the same key (harmless)."""
    backoff_min_s: float = 0.5
    """The first wait after a failed send (5xx, 429 without Retry-After, no answer), doubling with jitter..."""
    backoff_max_s: float = 60.0
    """...up to this."""
    retry_after_max_s: float = 300.0
    """A Retry-After is honoured up to this long."""

    def validate(self) -> None:
        check_table(self.table)
        if not 1 <= self.batch_max <= rows.CLAIM_MAX:
            raise ValueError(f"batch_max must be in 1..{rows.CLAIM_MAX}")
        if not 1 <= self.concurrency <= 256:
            raise ValueError("concurrency must be in 1..256")
        if not 0.01 <= self.poll_interval_s <= 60:
            raise ValueError("poll_interval_s must be in 0.01..60")
        if not 0.1 <= self.http_timeout_s <= 300:
            raise ValueError("http_timeout_s must be in 0.1..300")
        if not 0 < self.backoff_min_s <= self.backoff_max_s <= 3600:
            raise ValueError("backoff must satisfy 0 < backoff_min_s <= backoff_max_s <= 3600")
        if not 0 <= self.retry_after_max_s <= 3600:
            raise ValueError("retry_after_max_s must be in 0..3600")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RoundResult:
    claimed: int = 0
    sent: int = 0
    rejected: int = 0
    retried: int = 0
    wait_s: float = 0.0
    """How long to wait before the next round: 0 to go on at once."""

    def __add__(self, other: RoundResult) -> RoundResult:
        return RoundResult(
            claimed=self.claimed + other.claimed, sent=self.sent + other.sent, rejected=self.rejected + other.rejected,
            retried=self.retried + other.retried, wait_s=other.wait_s,
        )  # fmt: skip


class Relay:
    """Sends one producer database's outbox; use as ``async with Relay(...) as relay``."""

    def __init__(
        self, pool: Any, target: ApiTarget, settings: RelaySettings | None = None, *,
        metrics: RelayMetrics | None = None, rng: random.Random | None = None,
    ) -> None:  # fmt: skip
        settings = settings if settings is not None else RelaySettings()
        settings.validate()
        self._pool = pool
        self._target = target
        self._settings = settings
        self.metrics = metrics if metrics is not None else RelayMetrics()
        self._rng = rng if rng is not None else random.Random()
        self._failures = 0  # failed rounds in a row
        self._client: httpx.AsyncClient | None = None
        self._tracer = trace.get_tracer("compensator.outbox")

    async def __aenter__(self) -> Relay:
        self._client = httpx.AsyncClient(
            base_url=self._target.url.rstrip("/"), timeout=self._settings.http_timeout_s,
            limits=httpx.Limits(max_connections=self._settings.concurrency),
        )  # fmt: skip
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def run(self, stop: asyncio.Event) -> RoundResult:
        """Rounds until ``stop`` is set; the totals."""
        total = RoundResult()
        while not stop.is_set():
            result = await self._guarded_round()
            total += result
            if result.wait_s > 0 or result.claimed < self._settings.batch_max:
                wait_s = result.wait_s or self._settings.poll_interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait_s)
        return total

    async def drain(self) -> RoundResult:
        """Rounds while rows are due and the API answers: what ``--once`` runs."""
        total = RoundResult()
        while True:
            result = await self.round()
            total += result
            if result.wait_s > 0 or result.claimed < self._settings.batch_max:
                return total

    async def refresh_gauges(self) -> rows.OutboxStatus:
        async with self._pool.acquire() as connection:
            found = await rows.status(connection, table=self._settings.table)
        self.metrics.pending.set(found.pending)
        self.metrics.oldest_pending_age.set(found.oldest_pending_age_s)
        return found

    async def _guarded_round(self) -> RoundResult:
        """A round whose database failure is a wait, not the end of the relay."""
        try:
            result = await self.round()
            await self.refresh_gauges()
            return result
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            self.metrics.round_errors.inc()
            self._failures += 1
            wait_s = self._backoff_s()
            log.warning("outbox round failed on the database (%s); next round in %.1f s", type(error).__name__, wait_s)
            return RoundResult(wait_s=wait_s)

    async def round(self) -> RoundResult:
        settings = self._settings
        async with self._pool.acquire() as connection, connection.transaction():
            claimed = await rows.claim(connection, table=settings.table, limit=settings.batch_max)
            if not claimed:
                return RoundResult()
            outcomes = await self._send_all(claimed)
            return await self._settle(connection, claimed, outcomes)

    async def _send_all(self, claimed: list[rows.Claimed]) -> list[Outcome | None]:
        """Each row's outcome in order; None for rows not sent because an earlier send failed."""
        gate = asyncio.Semaphore(self._settings.concurrency)
        halted = False

        async def one(row: rows.Claimed) -> Outcome | None:
            nonlocal halted
            async with gate:
                if halted:
                    return None
                outcome = await self._send(row)
                if isinstance(outcome, Retry):
                    halted = True
                return outcome

        return list(await asyncio.gather(*(one(row) for row in claimed)))

    async def _send(self, row: rows.Claimed) -> Outcome:
        assert self._client is not None, "use the relay as an async context manager"
        with self._tracer.start_as_current_span(
            "outbox.send", kind=trace.SpanKind.CLIENT, attributes={"compensator.outbox.attempt": row.attempts + 1}
        ) as span:
            headers = {
                "Content-Type": "application/json",
                "Idempotency-Key": row.key,
                "Authorization": f"Bearer {self._target.token}",
            }
            propagate.inject(headers)
            try:
                response = await self._client.post(REQUESTS_PATH, content=row.body.encode(), headers=headers)
            except httpx.HTTPError as error:
                span.set_attribute("error.type", type(error).__name__)
                return Retry(None, f"no answer: {type(error).__name__}")
            span.set_attribute("http.response.status_code", response.status_code)
            try:
                document = response.json()
            except ValueError:
                document = None
            retry_after_s = parse_retry_after(response.headers.get("Retry-After"), now_s=time.time())
            return classify(response.status_code, document, text=response.text, retry_after_s=retry_after_s)

    async def _settle(
        self, connection: Any, claimed: list[rows.Claimed], outcomes: list[Outcome | None]
    ) -> RoundResult:
        table = self._settings.table
        sent = [
            (row.id, o.status, o.request_id) for row, o in zip(claimed, outcomes, strict=True) if isinstance(o, Sent)
        ]
        rejected = [(row, o) for row, o in zip(claimed, outcomes, strict=True) if isinstance(o, Rejected)]
        retries = [(row, o) for row, o in zip(claimed, outcomes, strict=True) if isinstance(o, Retry)]
        wait_s = 0.0
        if retries:
            self._failures += 1
            after = [o.retry_after_s for _, o in retries if o.retry_after_s is not None]
            wait_s = min(max(after), self._settings.retry_after_max_s) if after else self._backoff_s()
            if self._failures == 1:
                log.warning(
                    "outbox: the API did not take a request (%s); retrying in %.1f s", retries[0][1].error, wait_s
                )
        elif self._failures:
            log.info("outbox: the API takes requests again after %d failed rounds", self._failures)
            self._failures = 0
        await rows.mark_sent(connection, table=table, rows=sent)
        await rows.mark_rejected(
            connection, table=table, rows=[(row.id, o.status, json.dumps(o.problem)) for row, o in rejected]
        )
        await rows.mark_retry(connection, table=table, rows=[(row.id, o.status, o.error, wait_s) for row, o in retries])
        for _, outcome in [*zip(claimed, outcomes, strict=True)]:
            if isinstance(outcome, Sent):
                self.metrics.sent.labels(str(outcome.status)).inc()
            elif isinstance(outcome, Retry):
                self.metrics.retries.labels(outcome.reason).inc()
        for row, o in rejected:
            self.metrics.rejected.labels(str(o.status)).inc()
            log.warning("outbox: the API rejected key %r with %d %s", row.key, o.status, o.problem.get("type", ""))
        return RoundResult(
            claimed=len(claimed), sent=len(sent), rejected=len(rejected), retried=len(retries), wait_s=wait_s
        )

    def _backoff_s(self) -> float:
        settings = self._settings
        return backoff_s(
            failures=max(1, self._failures), rng=self._rng, min_s=settings.backoff_min_s, max_s=settings.backoff_max_s
        )
