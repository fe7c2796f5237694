"""The one way a handler reaches a downstream: a pooled HTTP client that knows what was sent.

Owns, per downstream: one connection pool (handlers/http11.py: bounded, keep-alive, a timeout per
phase: pool, connect, write, read; an overall deadline per attempt; no redirects followed; no proxy
or certificate settings taken from the environment), passing on the attempt's trace context,
reading at most `BODY_BYTES_MAX` of an answer, and turning every ending of a call into an
`Outcome` value.

The rule that makes this safe for payments: inside one attempt the gateway repeats a request only
when it *certainly was not sent*: a connect error or connect timeout, or no pooled connection free
within the pool timeout. It knows because the client writes a request in one call and says on
which side of that call a failure happened (`http_request.NotSentError` or `SentError`).
Everything after the write (a read timeout, a connection cut, an answer that does not parse) may
have reached the downstream and been applied, so it is returned as `OutcomeUnknown` and never
repeated here: whether and when to try again is the next attempt's business, and the transfer
handler looks before it repeats.

Must never: log a header, a body, a URL's query or a secret; follow a redirect; retry after the
request may have been written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Final, Protocol

import msgspec
from opentelemetry import propagate, trace
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from handlers import http11, http_request
from handlers.answers import BODY_BYTES_MAX, Answer, NotSent, NotSentClass, Outcome, OutcomeUnknown, UnknownClass

log = logging.getLogger(__name__)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""W3C trace context: the only headers of an attempt that are passed downstream."""
USER_AGENT: Final = "compensator/1"
"""Sent with ``Accept-Encoding: identity``: answers are small, and the body limit counts real bytes."""
DEFAULT_HEADERS: Final = (("accept", "*/*"), ("accept-encoding", "identity"), ("user-agent", USER_AGENT))
CONNECT_TRIES_LIMIT: Final = 10
TIMEOUT_S_LIMIT: Final = 120.0
CONNECTIONS_LIMIT: Final = 1024
LEASE_ENDED_SAID: Final = "the attempt's lease had ended before the request was written: not sent"
TARGETS_CACHED_MAX: Final = 1024
"""Absolute URLs parsed and kept (callback targets: a configured, bounded set)."""


Seconds = Annotated[float, msgspec.Meta(gt=0, le=TIMEOUT_S_LIMIT)]


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Timeouts and limits of one downstream's client. Defaults suit a payment API on a LAN."""

    connect_timeout_s: Seconds = 1.0
    """Establishing a connection; a connect that fails was certainly not sent, so it may be tried again."""
    write_timeout_s: Seconds = 2.0
    """Sending the request; past it the outcome is unknown."""
    read_timeout_s: Seconds = 5.0
    """The longest wait for any one read of the answer: past it the outcome is unknown."""
    pool_timeout_s: Seconds = 1.0
    """Waiting for a free connection of the pool (connections_max in use)."""
    attempt_timeout_s: Seconds = 10.0
    """The whole call, connection retries included."""
    connections_max: Annotated[int, msgspec.Meta(ge=1, le=CONNECTIONS_LIMIT)] = 32
    """Connections to this downstream per worker; the worker never runs more of its calls at once."""
    keepalive_connections_max: Annotated[int, msgspec.Meta(ge=0, le=CONNECTIONS_LIMIT)] | None = None
    """Idle connections kept open for the next call; unset: as many as `connections_max`, so a
    burst of calls above a smaller number does not close the extra connections on their release
    only to open them again at the next burst (docs/benchmarks.md, "the worker's breaker window
    and its connections kept")."""
    keepalive_expiry_s: Seconds = 30.0
    """How long an idle connection is kept."""
    connect_tries_max: Annotated[int, msgspec.Meta(ge=1, le=CONNECT_TRIES_LIMIT)] = 3
    """Tries of a request that was certainly not sent, within one attempt."""
    connect_backoff_min_s: Seconds = 0.05
    """The first wait before a connection is tried again (exponential, with jitter)..."""
    connect_backoff_max_s: Seconds = 0.5
    """...and the longest."""

    def problems(self) -> list[str]:
        found: list[str] = []
        try:  # settings built in Python skipped the decoder's range checks
            msgspec.json.decode(msgspec.json.encode(self), type=GatewaySettings, strict=True)
        except msgspec.ValidationError as error:
            return [str(error)]
        if self.keepalive_connections_max is not None and self.keepalive_connections_max > self.connections_max:
            found.append("keepalive_connections_max must be at most connections_max")
        if self.connect_backoff_min_s > self.connect_backoff_max_s:
            found.append("connect_backoff_min_s must be at most connect_backoff_max_s")
        if self.attempt_timeout_s < self.connect_timeout_s:
            found.append("attempt_timeout_s must be at least connect_timeout_s (or no try can connect)")
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Outbound:
    """One request as a handler builds it; `url` is absolute or relative to the gateway's base URL."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Never in the repr: a signature is a header."""
    body: bytes = field(default=b"", repr=False)
    trace: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The attempt's headers: only the trace context (`TRACE_HEADERS`) is taken from them."""
    send_by: float | None = None
    """A moment of the monotonic clock (`time.monotonic`) after which no byte of this request may
    be written: the attempt's lease has ended and another delivery may hold the message. Checked
    before each try and again once a connection is ready, just before the request is written; past
    it the outcome is `NotSent(lease_ended)`. None: no such limit (a lookup)."""


class Sender(Protocol):
    """What a handler needs of a gateway (a port: handlers never see the HTTP client)."""

    async def send(self, request: Outbound) -> Outcome: ...


class _Unsent(Exception):
    """A try that certainly wrote nothing: the one thing repeated inside an attempt (unless `final`:
    the attempt's deadline or its lease leaves no room for another try)."""

    def __init__(self, error_class: NotSentClass, detail: str, *, final: bool = False) -> None:
        super().__init__(detail)
        self.error_class = error_class
        self.detail = detail
        self.final = final


@dataclass(slots=True)
class _Tries:
    made: int = 1


def _backoff(settings: GatewaySettings, rng: random.Random, try_number: int) -> float:
    """Full jitter between the bounds, doubling per try, from the gateway's own generator."""
    ceiling = min(settings.connect_backoff_max_s, settings.connect_backoff_min_s * 2 ** (try_number - 1))
    return rng.uniform(settings.connect_backoff_min_s, max(settings.connect_backoff_min_s, ceiling))


def _limits(settings: GatewaySettings) -> http_request.PoolLimits:
    return http_request.PoolLimits(
        connections_max=settings.connections_max,
        keepalive_max=settings.connections_max if settings.keepalive_connections_max is None else settings.keepalive_connections_max,
        keepalive_expiry_s=settings.keepalive_expiry_s, connect_timeout_s=settings.connect_timeout_s,
        write_timeout_s=settings.write_timeout_s, read_timeout_s=settings.read_timeout_s,
        pool_timeout_s=settings.pool_timeout_s,
    )  # fmt: skip


class Gateway:
    """One downstream's client. `send` never raises for anything the network or the downstream
    does; it raises only for a programmer error (an invalid URL or header, a closed gateway)."""

    def __init__(
        self, *, downstream: str, settings: GatewaySettings, base_url: str = "",
        rng: random.Random | None = None, clock: Callable[[], float] = time.time,
        tracer: trace.Tracer | None = None,
    ) -> None:  # fmt: skip
        problems = settings.problems()
        if problems:
            raise ValueError(f"{downstream} gateway: " + "; ".join(problems))
        self.downstream = downstream
        self._settings = settings
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._tracer = tracer or trace.NoOpTracer()
        self._base = http_request.parse_url(base_url) if base_url else None
        self._targets: dict[str, http_request.Target] = {}
        self._pool = http11.Pool(_limits(settings))

    def __repr__(self) -> str:
        return f"Gateway(downstream={self.downstream!r})"

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def send(self, request: Outbound) -> Outcome:
        """One call, as a CLIENT span under the attempt's; the downstream gets this span's context
        (else the attempt's trace headers, when nothing here records)."""
        with self._tracer.start_as_current_span(
            f"{request.method} {self.downstream}", kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": request.method, "compensator.downstream": self.downstream},
        ) as span:  # fmt: skip
            carrier: dict[str, str] = {}
            if span.is_recording():
                propagate.inject(carrier)
            outcome = await self._send(dataclasses.replace(request, trace=carrier) if carrier else request)
            if isinstance(outcome, Answer):
                span.set_attribute("http.response.status_code", outcome.status)
            else:
                span.set_attribute("compensator.error_class", str(outcome.error_class))
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(outcome.error_class)))
            return outcome

    async def _send(self, request: Outbound) -> Outcome:
        target = self._target(request.url)
        headers = [*DEFAULT_HEADERS, *request.headers,
                   *((k, v) for k, v in request.trace.items() if k.lower() in TRACE_HEADERS)]  # fmt: skip
        deadline = asyncio.get_running_loop().time() + self._settings.attempt_timeout_s
        tries = _Tries()
        outcome: Outcome
        try:
            try:  # the first try without tenacity: the path nearly every call takes
                outcome = await self._try(request, target, headers, deadline)
            except _Unsent as unsent:
                if unsent.final or self._settings.connect_tries_max == 1:
                    raise
                outcome = await self._send_until_sent(request, target, headers, deadline, tries)
        except _Unsent as unsent:
            outcome = NotSent(error_class=unsent.error_class, detail=unsent.detail, tries=tries.made)
        self._log(request, target, outcome)
        return outcome

    async def _send_until_sent(
        self, request: Outbound, target: http_request.Target, headers: list[tuple[str, str]], deadline: float,
        tries: _Tries,
    ) -> Outcome:  # fmt: skip
        """Tries 2 to `connect_tries_max` of a request whose first try was not sent, after a
        backoff each, until one is sent (whatever then happens); the last `_Unsent` propagates."""
        settings = self._settings

        def wait(state: RetryCallState) -> float:
            return _backoff(settings, self._rng, tries.made)

        async def pause(seconds: float) -> None:
            if asyncio.get_running_loop().time() + seconds >= deadline:
                raise _Unsent(NotSentClass.DEADLINE, self._deadline_said(), final=True)
            await asyncio.sleep(seconds)

        await pause(_backoff(settings, self._rng, tries.made))
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda error: isinstance(error, _Unsent) and not error.final),
            stop=stop_after_attempt(settings.connect_tries_max - 1), wait=wait, sleep=pause, reraise=True,
        )  # fmt: skip
        async for retry in retrying:
            with retry:
                tries.made += 1
                return await self._try(request, target, headers, deadline)
        raise AssertionError("tenacity returns the try's value or re-raises its exception")

    async def _try(
        self, request: Outbound, target: http_request.Target, headers: list[tuple[str, str]], deadline: float
    ) -> Outcome:
        if request.send_by is not None and time.monotonic() >= request.send_by:
            raise _Unsent(NotSentClass.LEASE_ENDED, LEASE_ENDED_SAID, final=True)
        try:
            response = await self._pool.request(request.method, target, headers, request.body, deadline=deadline,
                                                body_max=BODY_BYTES_MAX, send_by=request.send_by)  # fmt: skip
        except http_request.SendByPassed:
            raise _Unsent(NotSentClass.LEASE_ENDED, LEASE_ENDED_SAID, final=True) from None
        except http_request.DeadlineBeforeSend:
            raise _Unsent(NotSentClass.DEADLINE, self._deadline_said(), final=True) from None
        except http_request.PoolTimeout as error:
            raise _Unsent(NotSentClass.POOL_EXHAUSTED, _said(error)) from None
        except http_request.NotSentError as error:  # ConnectError, ConnectTimeout
            raise _Unsent(NotSentClass.CONNECT_FAILED, _said(error)) from None
        except http_request.DeadlineAfterSend:
            return OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail=self._deadline_said())
        except http_request.TIMEOUTS as error:  # a write or read timeout: the request may be applied
            return OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail=_said(error))
        except http_request.SentError as error:  # cut, or an answer that does not parse or decode
            return OutcomeUnknown(error_class=UnknownClass.CONNECTION_LOST, detail=_said(error))
        return Answer(status=response.status, headers=response.headers, body=response.body,
                      received_unix_s=self._clock(), body_truncated=response.truncated)  # fmt: skip

    def _target(self, url: str) -> http_request.Target:
        if url.startswith("/") or "://" not in url:
            if self._base is None:
                raise ValueError(f"{self.downstream} gateway: a relative URL and no base URL")
            return self._base.relative(url)
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= TARGETS_CACHED_MAX:
                self._targets.clear()
            target = self._targets[url] = http_request.parse_url(url)
        return target

    def _deadline_said(self) -> str:
        return f"no answer within the attempt's {self._settings.attempt_timeout_s} s"

    def _log(self, request: Outbound, target: http_request.Target, outcome: Outcome) -> None:
        path = target.path.partition("?")[0]  # never the query, never a header
        if isinstance(outcome, Answer):
            log.debug("%s %s %s -> %d", self.downstream, request.method, path, outcome.status)
        else:
            log.info("%s %s %s -> %s", self.downstream, request.method, path, outcome.error_class.value)


def _said(error: http_request.HttpError) -> str:
    """The error's type and message: the client names the failure, never a header or a body."""
    text = str(error)
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:200]
