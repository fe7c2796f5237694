"""The one way a handler reaches a downstream: a pooled HTTP client that knows what was sent.

Owns, per downstream: one `httpx.AsyncClient` (a bounded connection pool, a timeout per phase:
connect, write, read, pool; an overall deadline per attempt; no redirects followed; no proxy or
certificate settings taken from the environment), passing on the attempt's trace context, reading
at most `BODY_BYTES_MAX` of an answer, and turning every ending of a call into an `Outcome` value.

The rule that makes this safe for payments: inside one attempt the gateway repeats a request only
when it *certainly was not sent*: a connect error or connect timeout, or no pooled connection free
within the pool timeout. It knows because httpcore reports each phase (the ``trace`` extension):
a failure counts as not sent only if no byte of the request headers was written yet. Everything
after that (a read timeout, a connection cut, even a write error) may have reached the downstream
and been applied, so it is returned as `OutcomeUnknown` and never repeated here: whether and when
to try again is the next attempt's business, and the transfer handler looks before it repeats.

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
from typing import Annotated, Any, Final, Protocol

import httpx
import msgspec
from opentelemetry import propagate, trace
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from handlers.answers import BODY_BYTES_MAX, Answer, NotSent, NotSentClass, Outcome, OutcomeUnknown, UnknownClass

log = logging.getLogger(__name__)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""W3C trace context: the only headers of an attempt that are passed downstream."""
USER_AGENT: Final = "compensator/1"
"""Sent with ``Accept-Encoding: identity``: answers are small, and the body limit counts real bytes."""
CONNECT_TRIES_LIMIT: Final = 10
TIMEOUT_S_LIMIT: Final = 120.0
CONNECTIONS_LIMIT: Final = 1024
_HEADERS_STARTED: Final = "http11.send_request_headers.started"

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
    keepalive_connections_max: Annotated[int, msgspec.Meta(ge=0, le=CONNECTIONS_LIMIT)] = 16
    """Idle connections kept open for the next call."""
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
        if self.keepalive_connections_max > self.connections_max:
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
    before each try and again just before the headers are written; past it the outcome is
    `NotSent(lease_ended)`. None: no such limit (a lookup)."""


class Sender(Protocol):
    """What a handler needs of a gateway (a port: handlers never see httpx)."""

    async def send(self, request: Outbound) -> Outcome: ...


class _Unsent(Exception):
    """A try that certainly wrote nothing: the one thing repeated inside an attempt."""

    def __init__(self, error_class: NotSentClass, detail: str) -> None:
        super().__init__(detail)
        self.error_class = error_class
        self.detail = detail


class _LeaseEnded(Exception):
    """Raised from httpcore's trace hook before the headers are written: nothing was sent."""


@dataclass(slots=True)
class _Progress:
    """Whether any try of this attempt began writing the request (from httpcore's trace events)."""

    written: bool = False
    tries: int = 0
    send_by: float | None = None

    def lease_ended(self) -> bool:
        return self.send_by is not None and time.monotonic() >= self.send_by

    async def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == _HEADERS_STARTED:
            if self.lease_ended():  # the last moment before a byte goes out
                raise _LeaseEnded
            self.written = True


def _backoff(settings: GatewaySettings, rng: random.Random) -> Callable[[RetryCallState], float]:
    """Full jitter between the bounds, doubling per try, from the gateway's own generator."""

    def wait(state: RetryCallState) -> float:
        ceiling = min(settings.connect_backoff_max_s, settings.connect_backoff_min_s * 2 ** (state.attempt_number - 1))
        return rng.uniform(settings.connect_backoff_min_s, max(settings.connect_backoff_min_s, ceiling))

    return wait


def _client(settings: GatewaySettings, base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(connect=settings.connect_timeout_s, read=settings.read_timeout_s,
                              write=settings.write_timeout_s, pool=settings.pool_timeout_s),
        limits=httpx.Limits(max_connections=settings.connections_max,
                            max_keepalive_connections=settings.keepalive_connections_max,
                            keepalive_expiry=settings.keepalive_expiry_s),
        follow_redirects=False, trust_env=False, headers={"user-agent": USER_AGENT, "accept-encoding": "identity"},
    )  # fmt: skip


class Gateway:
    """One downstream's client. `send` never raises for anything the network or the downstream
    does; it raises only for a programmer error (an invalid URL, a closed gateway)."""

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
        self._client = _client(settings, base_url)

    def __repr__(self) -> str:
        return f"Gateway(downstream={self.downstream!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

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
        progress = _Progress(send_by=request.send_by)
        outcome: Outcome
        try:
            async with asyncio.timeout(self._settings.attempt_timeout_s):
                outcome = await self._send_until_sent(request, progress)
        except _Unsent as unsent:
            outcome = NotSent(error_class=unsent.error_class, detail=unsent.detail, tries=progress.tries)
        except TimeoutError:
            limit = f"no answer within the attempt's {self._settings.attempt_timeout_s} s"
            outcome = (OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail=limit) if progress.written
                       else NotSent(error_class=NotSentClass.DEADLINE, detail=limit, tries=progress.tries))  # fmt: skip
        self._log(request, outcome)
        return outcome

    async def _send_until_sent(self, request: Outbound, progress: _Progress) -> Outcome:
        """Tries until one is sent (whatever then happens) or `connect_tries_max` were not; the last
        `_Unsent` propagates."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Unsent), stop=stop_after_attempt(self._settings.connect_tries_max),
            wait=_backoff(self._settings, self._rng), reraise=True,
        )  # fmt: skip
        async for retry in retrying:
            with retry:
                progress.tries = retry.retry_state.attempt_number
                return await self._try(request, progress)
        raise AssertionError("tenacity returns the try's value or re-raises its exception")

    async def _try(self, request: Outbound, progress: _Progress) -> Outcome:
        headers = [*request.headers, *((k, v) for k, v in request.trace.items() if k.lower() in TRACE_HEADERS)]
        if progress.lease_ended():
            return _not_sent_lease_ended(progress)
        try:
            async with self._client.stream(
                request.method, request.url, headers=headers, content=request.body,
                extensions={"trace": progress.trace},
            ) as response:  # fmt: skip
                body, truncated = await _read_limited(response)
                outcome: Outcome = Answer(
                    status=response.status_code, headers=tuple((k.lower(), v) for k, v in response.headers.multi_items()),
                    body=body, received_unix_s=self._clock(), body_truncated=truncated,
                )  # fmt: skip
        except _LeaseEnded:
            return _not_sent_lease_ended(progress)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            if progress.written:  # cannot happen with httpcore today; if it ever does, it may have been sent
                outcome = OutcomeUnknown(error_class=UnknownClass.CONNECTION_LOST, detail=_said(error))
            else:
                kind = (
                    NotSentClass.POOL_EXHAUSTED if isinstance(error, httpx.PoolTimeout) else NotSentClass.CONNECT_FAILED
                )
                raise _Unsent(kind, _said(error)) from None
        except httpx.TimeoutException as error:  # read or write timeout: the request may be applied
            outcome = OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail=_said(error))
        except (httpx.NetworkError, httpx.RemoteProtocolError) as error:
            outcome = OutcomeUnknown(error_class=UnknownClass.CONNECTION_LOST, detail=_said(error))
        except httpx.HTTPError as error:
            if not progress.written:  # an invalid URL or request: ours to fix, not the downstream's
                raise
            outcome = OutcomeUnknown(error_class=UnknownClass.CONNECTION_LOST, detail=_said(error))
        return outcome

    def _log(self, request: Outbound, outcome: Outcome) -> None:
        path = httpx.URL(request.url).path  # never the query, never a header
        if isinstance(outcome, Answer):
            log.debug("%s %s %s -> %d", self.downstream, request.method, path, outcome.status)
        else:
            log.info("%s %s %s -> %s", self.downstream, request.method, path, outcome.error_class.value)


def _not_sent_lease_ended(progress: _Progress) -> NotSent:
    return NotSent(error_class=NotSentClass.LEASE_ENDED, tries=progress.tries,
                   detail="the attempt's lease had ended before the request was written: not sent")  # fmt: skip


async def _read_limited(response: httpx.Response) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        room = BODY_BYTES_MAX - size
        if len(chunk) > room:
            chunks.append(chunk[:room])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def _said(error: httpx.HTTPError) -> str:
    """The error's type and message: httpx names the failure, never a header or a body."""
    text = str(error)
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:200]
