"""Who is logged in: server-side sessions in the store, their cookie, CSRF, and the pages' guards.

A session is a document in the store's ``sessions`` namespace named by the SHA-256 of a random id
(api/web/accounts.py); the id itself lives only in the ``cmp_session`` cookie (HttpOnly,
SameSite=Strict, Path=/, Secure where configured). So logging out, disabling a user or changing
their role or password deletes documents, and every API process stops taking the session within
its next poll (`refresh_interval_s`, 1 s), exactly as a revoked token (api/auth.py): each process
mirrors the ``users`` and ``sessions`` namespaces, polls their versions, and reads them again when
a cookie names a session it does not know (a login on another process a moment ago), at most
every MISS_REFRESH_MIN_S however many unknown cookies arrive.

A session ends after `idle_timeout_s` without a request or `lifetime_s` after the login,
whichever comes first. Its last-seen time is written back to the store at most once a minute
(SEEN_WRITE_EVERY_MS), not per request: each write is a replicated command and an audit entry,
and a minute is nothing against a 15-minute idle timeout. Expired sessions are deleted when they
are next presented, and swept every SWEEP_EVERY_S by each process.

CSRF: the synchronizer token is HMAC-SHA256(key = the session id, "csrf"). It needs no storage
and no server secret: a secret kept in the store would be a document, and a document's body goes
into the audit chain every observer reads; a token kept by hash in the session document would cost
a write per login for nothing the HMAC does not give. Only someone who holds the cookie can compute
it, it dies with the session, and it is compared in constant time. Every state-changing page
request carries it (form field ``csrf_token``, or ``X-CSRF-Token`` from htmx), and its ``Origin``
and ``Sec-Fetch-Site`` must say same-origin when the browser sends them.

Must never: log a session id, a password or a CSRF token; accept a session after its user was
disabled or its document deleted (beyond one poll); change anything on a request that fails CSRF.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar
from urllib.parse import quote, urlsplit

import msgspec
from fastapi import Request
from starlette.responses import Response

from api.auth import ReadsAfter, start_polling, stop_polling
from api.web.accounts import (
    LOGINS,
    NAME,
    SESSIONS,
    USERS,
    AccountError,
    Accounts,
    Logins,
    Session,
    User,
    session_name,
    verify_password,
)
from api.web.rights import Right, allowed
from api.web.throttle import LoginThrottle
from queues import ClientError, QueueClient, QueueError, Role

log = logging.getLogger("api.web.sessions")
COOKIE: Final = "cmp_session"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
LOGIN_PATH: Final = "/review/login"
HOME_PATH: Final = "/review"
SEEN_WRITE_EVERY_MS: Final = 60_000
SWEEP_EVERY_S: Final = 300.0
VERIFICATIONS_AT_ONCE: Final = 2
"""argon2 verifications running at once per process (each takes 64 MiB and tens of ms of CPU): a
burst of logins queues instead of starving the API."""
SYSTEM_ACTOR: Final = "web"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WebUser:
    """The person behind a page request."""

    name: str
    role: Role
    csrf_token: str


class LoginRequired(Exception):
    """No live session: a page answers 303 to the login page (401 with HX-Redirect for htmx)."""


class LoginThrottled(Exception):
    """This client failed too many logins lately: refused before any verification (a 429 page)."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class StoreUnreachable(Exception):
    """Who is logged in could not be read from the store: a 503 page, never a login page."""


class Forbidden(Exception):
    """The user may not do this (or the request failed CSRF): a 403 page, nothing changed."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSettings:
    idle_timeout_s: float = 15 * 60
    lifetime_s: float = 12 * 3600
    cookie_secure: bool = False
    lockout_failures: int = 5
    lockout_s: float = 15 * 60
    client_failures_max: int = 20
    """Failed logins a client address may make across accounts per `lockout_s` (api/web/throttle.py)."""
    refresh_interval_s: float = 1.0
    public_origin: str = ""
    """The origin people use (scheme://host[:port]); a POST's Origin may also be the request's own."""


class _Mirror(Generic[T]):
    """One namespace of documents as this process last read it, newer only."""

    def __init__(self, queue: QueueClient, namespace: str, kind: type[T]) -> None:
        self._queue = queue
        self.namespace = namespace
        self._kind = kind
        self.items: dict[str, T] = {}
        self.version = -1
        self._floor = 0
        """The version of this process's own last write: an answer older than it (a read that
        began before the write) must not bring back what the write changed."""

    async def refresh(self, *, stale_ok: bool = True) -> None:
        answer = (await self._queue.documents(self.namespace, known_version=self.version, stale_ok=stale_ok)).value
        if not answer.changed or answer.version <= self.version or answer.version < self._floor:
            return
        items: dict[str, T] = {}
        for document in answer.documents:
            with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                items[document.name] = msgspec.json.decode(document.body, type=self._kind)
        self.items, self.version = items, answer.version

    def wrote(self, name: str, value: T | None, version: int) -> None:
        """This process's own write, seen at once here (others see it at their next poll)."""
        if value is None:
            self.items.pop(name, None)
        else:
            self.items[name] = value
        self._floor = max(self._floor, version)


def csrf_token_of(session_id: str) -> str:
    digest = hmac.new(session_id.encode(), b"csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class WebAuth:
    """Users and sessions for one API process: logins, logouts, and who a cookie belongs to."""

    def __init__(
        self, queue: QueueClient, settings: WebSettings, *, clock_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.settings = settings
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.accounts = Accounts(queue, clock_ms=self._clock_ms)
        self._users = _Mirror(queue, USERS, User)
        self._sessions = _Mirror(queue, SESSIONS, Session)
        self._seen: dict[str, int] = {}
        """Session name -> the last request this process served for it."""
        self._misses = ReadsAfter(self._read_both, monotonic)
        self._fresh_users = ReadsAfter(lambda: self._users.refresh(stale_ok=False), monotonic, spacing_s=0.0)
        """Every request's read of the users' version (the leader's, linearizable: only the version
        comes back while it is unchanged), shared by the requests that arrive before it starts."""
        self._monotonic = monotonic
        self.throttle = LoginThrottle(
            per_account=settings.lockout_failures - 1, per_client=settings.client_failures_max,
            window_ms=int(settings.lockout_s * 1000), clock_ms=self._clock_ms,
        )  # fmt: skip
        self._verifying = asyncio.Semaphore(VERIFICATIONS_AT_ONCE)
        self._task: asyncio.Task[None] | None = None
        self._swept_s = float("-inf")

    # ---- the mirror ------------------------------------------------------------------------
    async def _read_both(self) -> None:
        await asyncio.gather(self._users.refresh(), self._sessions.refresh())

    async def refresh(self) -> None:
        """One poll (and, every SWEEP_EVERY_S, the deletion of sessions that ended)."""
        await self._read_both()
        if self._monotonic() - self._swept_s >= SWEEP_EVERY_S:
            self._swept_s = self._monotonic()
            await self._sweep()

    async def start(self) -> None:
        self._task = await start_polling(self._task, self.refresh, self.settings.refresh_interval_s, "sessions", 5.0)

    async def close(self) -> None:
        await stop_polling(self._task)
        self._task = None

    def _ended(self, name: str, session: Session, now_ms: int, seen_slack_ms: int = 0) -> bool:
        seen = max(session.seen_ms, self._seen.get(name, 0))
        return (now_ms - session.created_ms >= self.settings.lifetime_s * 1000
                or now_ms - seen >= self.settings.idle_timeout_s * 1000 + seen_slack_ms)  # fmt: skip

    async def _sweep(self) -> None:
        """Delete the sessions that ended; the idle ones a minute late, since another process may
        have seen them since their last write-back."""
        now_ms = self._clock_ms()
        ended = [name for name, s in self._sessions.items.items() if self._ended(name, s, now_ms, SEEN_WRITE_EVERY_MS)]
        await self._delete(ended, actor=SYSTEM_ACTOR, reason="session expired")

    async def _delete(self, names: Iterable[str], *, actor: str, reason: str) -> None:
        for name in names:
            result = await self.accounts.queue.put_document(SESSIONS, name, None, actor=actor, reason=reason)
            self._sessions.wrote(name, None, result.version)
            self._seen.pop(name, None)

    # ---- who is this -----------------------------------------------------------------------
    async def user_of(self, session_id: str | None) -> WebUser | None:
        """The live session's user, or None (unknown, ended, or its user disabled or gone).

        The users are read again if their version changed since this process last read them, in
        a read that starts after the request arrived: a role change or a disable committed before
        the request was sent is what the request sees (the poll alone left a second of the old
        role). Raises StoreUnreachable when that read fails."""
        if not session_id or len(session_id) > 128:
            return None
        try:
            await self._fresh_users.after(self._monotonic(), raising=True)
        except (ClientError, QueueError) as error:
            raise StoreUnreachable(str(error)) from None
        name = session_name(session_id)
        session = self._sessions.items.get(name)
        if session is None or session.user not in self._users.items:
            await self._misses.after(self._monotonic())
            session = self._sessions.items.get(name)
        if session is None:
            return None
        user = self._users.items.get(session.user)
        if user is None or user.disabled:
            return None
        if session.role and session.role != user.role.value:
            return None  # its user's role changed since the login: ended (the change deletes it too)
        now_ms = self._clock_ms()
        if self._ended(name, session, now_ms):
            with contextlib.suppress(ClientError, QueueError):
                await self._delete([name], actor=SYSTEM_ACTOR, reason="session expired")
            return None
        self._seen[name] = now_ms
        if now_ms - session.seen_ms >= SEEN_WRITE_EVERY_MS:
            with contextlib.suppress(ClientError, QueueError):  # the next request writes it again
                await self._put_session(name, msgspec.structs.replace(session, seen_ms=now_ms), reason="seen")
        return WebUser(user.name, user.role, csrf_token_of(session_id))

    async def _put_session(self, name: str, session: Session, *, reason: str) -> None:
        body = msgspec.json.encode(session)
        result = await self.accounts.queue.put_document(SESSIONS, name, body, actor=session.user, reason=reason)
        if result.code.name != "OK":
            raise AccountError("too many open sessions: try again later, or ask an admin")
        self._sessions.wrote(name, session, result.version)

    # ---- logging in and out ----------------------------------------------------------------
    async def login(self, name: str, password: str, *, client: str = "") -> tuple[str, WebUser] | None:
        """A new session's id and user, or None: a wrong password, an unknown, disabled or locked
        user all answer None after the same work (an argon2 verification and one store write).
        A client that failed too often lately (api/web/throttle.py) is refused first, with
        LoginThrottled, before any of that."""
        retry_after_s = self.throttle.retry_after_s(client, name)
        if retry_after_s is not None:
            log.info("login throttled: %s from %s for %d s", name if NAME.match(name) else "(no name)", client,
                     retry_after_s)  # fmt: skip
            raise LoginThrottled(retry_after_s)
        found = await self._login(name, password)
        if found is None:
            self.throttle.failed(client, name)
        else:
            self.throttle.succeeded(client, name)
        return found

    async def _login(self, name: str, password: str) -> tuple[str, WebUser] | None:
        now_ms = self._clock_ms()
        valid = NAME.match(name) is not None
        user: User | None = None
        encoded: str | None = None
        record = Logins()
        if valid:
            users, logins, encoded = await asyncio.gather(
                self.accounts.users(), self.accounts.logins(), self.accounts.password_hash(name))
            user, record = users.get(name), logins.get(name, Logins())
        async with self._verifying:
            matched = await asyncio.to_thread(verify_password, encoded if user is not None else None, password)
        if not valid:
            return None  # never a user's name: nothing to record or lock
        locked = record.locked_until_ms is not None and record.locked_until_ms > now_ms
        if user is None:
            await self.accounts.put(LOGINS, name, None, actor=SYSTEM_ACTOR, reason="failed login")
            return None
        if locked or user.disabled or not matched:
            await self._failed(name, record, now_ms, locked=locked, disabled=user.disabled)
            return None
        session_id = secrets.token_urlsafe(32)
        await self._put_session(session_name(session_id), Session(user=name, created_ms=now_ms, seen_ms=now_ms,
                                                                   role=user.role.value), reason="login")  # fmt: skip
        self._users.items.setdefault(name, user)
        done = Logins(last_login_ms=now_ms, logins=record.logins + 1, last_failure_ms=record.last_failure_ms)
        await self.accounts.put(LOGINS, name, msgspec.json.encode(done), actor=name, reason="login")
        log.info("login: %s (%s)", name, user.role.value)
        return session_id, WebUser(name, user.role, csrf_token_of(session_id))

    async def _failed(self, name: str, record: Logins, now_ms: int, *, locked: bool, disabled: bool) -> None:
        if not locked and record.last_failure_ms is not None and now_ms - record.last_failure_ms >= self.settings.lockout_s * 1000:
            record = msgspec.structs.replace(record, failures=0)  # failures in a row, within lockout_s of each other
        if locked:
            after, reason = msgspec.structs.replace(record, last_failure_ms=now_ms), "failed login: locked"
        elif record.failures + 1 >= self.settings.lockout_failures:
            until = now_ms + int(self.settings.lockout_s * 1000)
            after, reason = Logins(failures=0, locked_until_ms=until, last_failure_ms=now_ms,
                                   last_login_ms=record.last_login_ms, logins=record.logins), "failed login: locked now"  # fmt: skip
        else:
            after = msgspec.structs.replace(record, failures=record.failures + 1, last_failure_ms=now_ms)
            reason = "failed login: user disabled" if disabled else "failed login"
        await self.accounts.put(LOGINS, name, msgspec.json.encode(after), actor=SYSTEM_ACTOR, reason=reason)
        log.info("%s: %s", reason, name)

    async def logout(self, session_id: str) -> None:
        name = session_name(session_id)
        session = self._sessions.items.get(name)
        await self._delete([name], actor=session.user if session else SYSTEM_ACTOR, reason="logout")


# ---- the pages' guards ------------------------------------------------------------------------
def _auth(request: Request) -> WebAuth:
    web: WebAuth | None = getattr(request.app.state.services, "web", None)
    if web is None:
        raise LoginRequired
    return web


async def current_user(request: Request) -> WebUser:
    """The logged-in user (a FastAPI dependency), or LoginRequired (StoreUnreachable when the store
    could not say who it is)."""
    try:
        user = await _auth(request).user_of(request.cookies.get(COOKIE))
    except (ClientError, QueueError):
        user = None  # a miss's read failed: no user
    if user is None:
        raise LoginRequired
    request.state.personal_data = allowed(user.role, Right.VIEW_PERSONAL_DATA)  # api.services.of reads it
    return user


def check_origin(request: Request) -> None:
    """Refuse a request another site made the browser send: `Sec-Fetch-Site` must be same-origin
    and `Origin` this site's, whenever the browser sends them (every current one does on a POST)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        raise Forbidden("this request came from another site (Sec-Fetch-Site)")
    origin = request.headers.get("origin")
    if origin is None:
        return
    own = {f"{request.url.scheme}://{request.headers.get('host', '')}"}
    configured = _auth(request).settings.public_origin
    if configured:
        own.add(configured)
    if origin not in own:
        raise Forbidden("this request came from another site (Origin)")


async def checked_csrf(request: Request) -> WebUser:
    """`current_user` for a state-changing request: same origin, and the session's CSRF token in
    the form field `csrf_token` or the `X-CSRF-Token` header."""
    user = await current_user(request)
    check_origin(request)
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()
        field = form.get(CSRF_FIELD)
        sent = field if isinstance(field, str) else None
    if not sent or not hmac.compare_digest(sent.encode(), user.csrf_token.encode()):
        raise Forbidden("the form was stale or not ours (CSRF token missing or wrong): reload the page and try again")
    return user


def require(user: WebUser, right: Right) -> None:
    """Raise Forbidden unless the user's role has `right` (api/web/rights.py)."""
    if not allowed(user.role, right):
        raise Forbidden(f"role {user.role.value} may not {right.value.replace('_', ' ')}")


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this site, never another site (no open redirect)."""
    if not target:
        return HOME_PATH
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return HOME_PATH
    return target


def return_path(request: Request) -> str:
    """The page to come back to: for htmx, the page it was on (HX-Current-URL), not the fragment."""
    current = request.headers.get("hx-current-url")
    if current:
        parts = urlsplit(current)
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def login_url(next_path: str) -> str:
    return f"{LOGIN_PATH}?next={quote(safe_next(next_path), safe='/')}"


def set_cookie(response: Response, session_id: str, settings: WebSettings) -> None:
    response.set_cookie(COOKIE, session_id, max_age=int(settings.lifetime_s), path="/", secure=settings.cookie_secure,
                        httponly=True, samesite="strict")  # fmt: skip


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
