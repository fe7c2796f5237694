"""Who is calling: bearer tokens checked against a cache of the store's token table, and roles.

Each API process holds every token's hash in memory (a dict lookup per request, no store round
trip) and asks the store every `refresh_interval_s` whether the access version changed; if it did,
it reloads the table. So a revocation stops a token in every process within one interval, and the
store's loss of one node changes nothing. A token the cache does not know may have been created a
moment ago: the cache then reads the store again, with a read that starts after the request
arrived (so a token created before it was sent is always accepted), and such reads start at most
every `MISS_REFRESH_MIN_S`, shared by every miss that waits for them: a caller spraying random
tokens costs the store at most that many small reads, and waits up to that long for its 401. A
token that is not even shaped like one is refused without any of that.

If the store cannot be reached the cache keeps what it has (fail static): every request that
would use a token needs the store anyway, so a revoked token gains nothing from the outage.

Must never: log a token or its hash; keep a revoked token; hold the event loop during a refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.problems import Problem
from api.tokens import token_hash, well_formed
from queues import ClientError, QueueClient, QueueError, Role

log = logging.getLogger("api.auth")
MISS_REFRESH_MIN_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    rate_per_s: int | None = None
    burst: int | None = None

    def owns(self, store_key: str) -> bool:
        """Whether this principal submitted the request stored under `store_key`."""
        return store_key.startswith(self.name + ":")


class TokenCache:
    def __init__(
        self, queue: QueueClient, *, refresh_interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._queue = queue
        self._interval_s = refresh_interval_s
        self._clock = clock
        self._by_hash: dict[bytes, Principal] = {}
        self._version = -1
        self._refreshing: asyncio.Task[None] | None = None
        self._misses = ReadsAfter(self._refresh_once, clock)
        self._task: asyncio.Task[None] | None = None
        self.last_success_s: float | None = None
        """Monotonic time of the last answer from the store (None: never): readiness reads it."""

    @property
    def version(self) -> int:
        return self._version

    def __len__(self) -> int:
        return len(self._by_hash)

    async def refresh(self) -> None:
        """One poll of the store, shared by every caller who asks while it runs."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh_once())
        await asyncio.shield(self._refreshing)

    async def _refresh_once(self) -> None:
        answer = (await self._queue.tokens(known_version=self._version, stale_ok=True)).value
        self.last_success_s = self._clock()
        if not answer.changed or answer.version <= self._version:  # a lagging replica is never newer
            return
        self._by_hash = {
            view.secret_hash: Principal(view.name, view.role, view.rate_per_s, view.burst)
            for view in answer.tokens
            if view.revoked_ms is None
        }
        self._version = answer.version
        log.info("tokens reloaded: access version %d, %d live", answer.version, len(self._by_hash))

    async def start(self, first_load_timeout_s: float = 5.0) -> None:
        """Load the tokens before the first request if the store answers in time (otherwise the
        first requests find an empty cache and wait for the refresh), then poll."""
        self._task = await start_polling(self._task, self.refresh, self._interval_s, "tokens", first_load_timeout_s)

    async def close(self) -> None:
        await stop_polling(self._task)
        self._task = None

    async def principal(self, token: str) -> Principal | None:
        if not well_formed(token):
            return None
        digest = token_hash(token)
        found = self._by_hash.get(digest)
        if found is not None:
            return found
        await self._misses.after(self._clock())
        return self._by_hash.get(digest)


class ReadsAfter:
    """Store reads for callers who missed a cache: each waits for a read that starts at or after
    it arrived (so what was written before it was sent is seen), and reads start at most every
    MISS_REFRESH_MIN_S, shared by every caller waiting for them, however many miss."""

    def __init__(
        self, read: Callable[[], Awaitable[None]], clock: Callable[[], float] = time.monotonic, *,
        spacing_s: float = MISS_REFRESH_MIN_S,
    ) -> None:  # fmt: skip
        self._read = read
        self._clock = clock
        self._spacing_s = spacing_s
        self._planned: asyncio.Task[None] | None = None
        self._start_s = float("-inf")

    async def after(self, arrived_s: float, *, raising: bool = False) -> None:
        """Wait for a store read that starts at or after `arrived_s`: the next one planned, or a
        new one at least `spacing_s` after the last one started. A failed read is passed over
        (the cache keeps what it has) unless `raising`."""
        planned = self._planned
        if planned is None or self._start_s < arrived_s:
            start_s = max(arrived_s, self._start_s + self._spacing_s)
            self._start_s = start_s
            planned = self._planned = asyncio.get_running_loop().create_task(self._delayed(start_s - arrived_s))
        try:
            await asyncio.shield(planned)
        except (ClientError, QueueError):
            if raising:
                raise

    async def _delayed(self, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        await self._read()


async def start_polling(
    task: asyncio.Task[None] | None, refresh: Callable[[], Awaitable[None]], interval_s: float, what: str,
    first_load_timeout_s: float,
) -> asyncio.Task[None]:
    """One refresh awaited (if the store answers in time), then `refresh` every `interval_s` on a
    task of its own; a failed refresh keeps what the cache has (fail static) and is logged."""
    with contextlib.suppress(ClientError, QueueError, TimeoutError):
        await asyncio.wait_for(refresh(), first_load_timeout_s)
    if task is not None:
        return task

    async def poll() -> None:
        while True:
            try:
                await refresh()
            except (ClientError, QueueError) as error:
                log.warning("%s refresh failed (keeping what is cached): %s", what, error)
            await asyncio.sleep(interval_s)

    return asyncio.get_running_loop().create_task(poll())


async def stop_polling(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


_bearer: Final = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer cmp_...`.")
_CHALLENGE: Final = 'Bearer realm="compensator"'


async def authenticate(request: Request, roles: frozenset[Role]) -> Principal:
    """The caller, or a 401 without a valid token and a 403 for a role not in `roles` (admin may
    do everything).

    The intake routes call this directly; the others through `requires`. FastAPI's dependency
    solving cost about a quarter of a submission's CPU (measured in process, 2026-11-23), and the
    intake is the path that has to keep up with a producer's retry storm."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Problem("unauthenticated", "send Authorization: Bearer <token>", headers={"WWW-Authenticate": _CHALLENGE})
    tokens: TokenCache = request.app.state.services.tokens
    principal = await tokens.principal(token.strip())
    if principal is None:
        raise Problem(
            "unauthenticated", "the token is unknown, malformed or revoked",
            headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'},
        )  # fmt: skip
    if principal.role not in roles and principal.role is not Role.ADMIN:
        names = ", ".join(role_names(roles))
        raise Problem("forbidden", f"role {principal.role.value} may not do this; allowed: {names}")
    return principal


def requires(*roles: Role) -> Callable[..., Awaitable[Principal]]:
    """`authenticate` as a dependency, for routes whose body FastAPI validates: it runs first, so
    an unauthenticated caller is answered 401 before anything is said about its body."""
    allowed = frozenset(roles)

    async def authenticated(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Principal:
        principal = await authenticate(request, allowed)
        request.state.personal_data = not masks_personal_data(principal)  # api.services.of reads it
        return principal

    return authenticated


def role_names(roles: Iterable[Role]) -> list[str]:
    return sorted({role.value for role in roles} | {Role.ADMIN.value})


SUBMIT: Final = frozenset({Role.PRODUCER})
READ: Final = frozenset({Role.PRODUCER, Role.OPERATOR, Role.REVIEWER, Role.APPROVER, Role.VIEWER})
"""A producer reads only what it submitted; the others read everything (a viewer masked)."""
OBSERVE: Final = frozenset({Role.OPERATOR, Role.REVIEWER, Role.APPROVER, Role.VIEWER})
"""A viewer reads with personal data masked (ledger/masking.py): `masks_personal_data`."""
OPERATE: Final = frozenset({Role.OPERATOR})



def masks_personal_data(principal: Principal) -> bool:
    """Whether what this caller reads has its payloads' personal fields masked."""
    return principal.role is Role.VIEWER


Reader = Annotated[Principal, Depends(requires(*READ))]
Observer = Annotated[Principal, Depends(requires(*OBSERVE))]
Operator = Annotated[Principal, Depends(requires(*OPERATE))]
