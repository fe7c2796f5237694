"""Users, their passwords, their sessions and their logins, as documents in the replicated store.

Why the store (queues/documents.py) and not a database or a file: every API process then sees the
same users, a change survives the loss of any node like the requests it guards, and each change is
a `document_put` in the audit chain with who made it and why. Four namespaces:

- ``users``: one document per user (role, disabled and why, when created and by whom). Its body
  goes into the audit entry whole, so a role change reads as before -> after;
- ``passwords``: the user's argon2id hash, in a document of its own padded past what the store
  copies into events and audit entries (documents.EVENT_BODY_CHARS_MAX, 2 KiB; `PADDED_BYTES`
  here), so those keep only the body's SHA-256. A hash in the audit chain would be readable by
  every observer, for ever, and offline guessing needs nothing more;
- ``sessions``: one document per live session, named by the SHA-256 of its id (the id itself is
  only ever in the browser's cookie), with its user and its creation and last-seen times;
- ``logins``: per user, failed logins in a row, a lock's end, the last login and a count: the
  lockout every process must agree on, and the login record the audit chain keeps.

A namespace holds at most 1000 documents (the store's limit): 1000 users and 1000 live sessions.

Must never: log or print a password or a hash, or put a hash in a body the audit shows.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

import msgspec
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from api.web.rights import WEB_ROLES
from queues import Code, QueueClient, Role

USERS: Final = "users"
PASSWORDS: Final = "passwords"
SESSIONS: Final = "sessions"
LOGINS: Final = "logins"
PASSWORD_LENGTH_MIN: Final = 12
PASSWORD_LENGTH_MAX: Final = 1024
"""argon2 hashes any length; a megabyte "password" is only a way to make a login expensive."""
PADDED_BYTES: Final = 4096
NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
"""A principal's name, as a token's (queues.model.PrincipalName)."""

_hasher: Final = PasswordHasher()  # argon2id, RFC 9106's second recommended profile (64 MiB, t=3, p=4)
_DUMMY_HASH: Final = _hasher.hash("not anyone's password: verified when there is no user")


T = TypeVar("T")


class AccountError(ValueError):
    """One line for the operator (or the page); nothing was changed."""


class User(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    name: str
    role: Role
    created_ms: int
    created_by: str
    disabled_ms: int | None = None
    disabled_reason: str = ""

    @property
    def disabled(self) -> bool:
        return self.disabled_ms is not None


class Session(msgspec.Struct, frozen=True, kw_only=True):
    user: str
    created_ms: int
    seen_ms: int
    """Last seen, written back at most once a minute (sessions.SEEN_WRITE_EVERY_MS)."""
    role: str = ""
    """The user's role when they logged in: a session whose user has another role now has ended
    (a role change ends the sessions; this makes the very next request see it). Empty in sessions
    from before it was recorded."""


class Logins(msgspec.Struct, frozen=True, kw_only=True):
    failures: int = 0
    """Failed logins in a row since the last success or lock."""
    locked_until_ms: int | None = None
    last_failure_ms: int | None = None
    last_login_ms: int | None = None
    logins: int = 0


class _Password(msgspec.Struct, frozen=True, kw_only=True):
    argon2: str
    pad: str = ""


def session_name(session_id: str) -> str:
    """The session's document name: what the store knows of a session id."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(encoded: str | None, password: str) -> bool:
    """argon2 verification, of a dummy hash when there is no user, so an unknown name costs what
    a wrong password costs (the answer's time says nothing about who exists)."""
    try:
        return _hasher.verify(encoded or _DUMMY_HASH, password) and encoded is not None
    except (VerificationError, InvalidHashError):
        return False


def checked_password(password: str) -> str:
    if len(password) < PASSWORD_LENGTH_MIN:
        raise AccountError(f"the password is too short: at least {PASSWORD_LENGTH_MIN} characters")
    if len(password) > PASSWORD_LENGTH_MAX:
        raise AccountError(f"the password is too long: at most {PASSWORD_LENGTH_MAX} characters")
    return password


def _password_body(encoded: str) -> bytes:
    body = msgspec.json.encode(_Password(argon2=encoded))
    return msgspec.json.encode(_Password(argon2=encoded, pad="." * max(0, PADDED_BYTES - len(body))))


def _decoded(kind: type[T], body: bytes) -> T | None:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError:
        return None  # a document another version wrote: as if absent, never a crash


class Accounts:
    """The store's side of users: what `compensator user`, the login page and `make run` change."""

    def __init__(self, queue: QueueClient, *, clock_ms: Callable[[], int]) -> None:
        self.queue = queue
        self.clock_ms = clock_ms

    async def _namespace(self, namespace: str, kind: type[T]) -> dict[str, T]:
        answer = (await self.queue.documents(namespace)).value
        found = {doc.name: _decoded(kind, doc.body) for doc in answer.documents}
        return {name: value for name, value in found.items() if value is not None}

    async def users(self) -> dict[str, User]:
        return await self._namespace(USERS, User)

    async def logins(self) -> dict[str, Logins]:
        return await self._namespace(LOGINS, Logins)

    async def sessions(self) -> dict[str, Session]:
        return await self._namespace(SESSIONS, Session)

    async def password_hash(self, name: str) -> str | None:
        found = await self._namespace(PASSWORDS, _Password)
        return found[name].argon2 if name in found else None

    async def put(self, namespace: str, name: str, body: bytes | None, *, actor: str, reason: str) -> None:
        result = await self.queue.put_document(namespace, name, body, actor=actor, reason=reason)
        if result.code is not Code.OK:
            raise AccountError(f"the store refused it ({result.code.name}): at most 1000 {namespace} are kept")

    async def user(self, name: str) -> User:
        found = (await self.users()).get(name)
        if found is None:
            raise AccountError(f"no user named {name!r}")
        return found

    async def add(self, name: str, role: Role, password: str, *, actor: str) -> User:
        if NAME.match(name) is None:
            raise AccountError(f"{name!r} is not a user name: 1-32 of a-z 0-9 _ . - starting with a letter or digit")
        _web_role(role)
        encoded = await asyncio.to_thread(hash_password, checked_password(password))
        if name in await self.users():
            raise AccountError(f"a user named {name!r} exists already (user passwd changes the password)")
        user = User(name=name, role=role, created_ms=self.clock_ms(), created_by=actor)
        await self.put(PASSWORDS, name, _password_body(encoded), actor=actor, reason="password set")
        await self.put(USERS, name, msgspec.json.encode(user), actor=actor, reason="user added")
        return user

    async def set_password(self, name: str, password: str, *, actor: str, reason: str = "password changed") -> int:
        """The new password; the user's sessions end (a stolen session must not outlive it)."""
        encoded = await asyncio.to_thread(hash_password, checked_password(password))
        await self.user(name)
        await self.put(PASSWORDS, name, _password_body(encoded), actor=actor, reason=reason)
        return await self.end_sessions(name, actor=actor, reason=reason)

    async def set_role(self, name: str, role: Role, *, actor: str, reason: str = "") -> int:
        user = await self.user(name)
        await self._replace(msgspec.structs.replace(user, role=_web_role(role)), actor, reason or f"role {role.value}")
        return await self.end_sessions(name, actor=actor, reason="role changed")

    async def disable(self, name: str, *, actor: str, reason: str) -> int:
        user = await self.user(name)
        await self._replace(msgspec.structs.replace(user, disabled_ms=self.clock_ms(), disabled_reason=reason),
                            actor, reason or "disabled")  # fmt: skip
        return await self.end_sessions(name, actor=actor, reason="user disabled")

    async def enable(self, name: str, *, actor: str, reason: str = "") -> None:
        user = await self.user(name)
        await self._replace(msgspec.structs.replace(user, disabled_ms=None, disabled_reason=""),
                            actor, reason or "enabled")  # fmt: skip
        await self.put(LOGINS, name, None, actor=actor, reason="enabled: lock and failures cleared")

    async def unlock(self, name: str, *, actor: str, reason: str = "") -> bool:
        """Lift a login lock and forget the failures (the login history stays); whether it was locked."""
        await self.user(name)
        record = (await self.logins()).get(name, Logins())
        locked = record.locked_until_ms is not None and record.locked_until_ms > self.clock_ms()
        unlocked = msgspec.structs.replace(record, failures=0, locked_until_ms=None)
        await self.put(LOGINS, name, msgspec.json.encode(unlocked), actor=actor, reason=reason or "unlocked by an admin")
        return locked

    async def _replace(self, user: User, actor: str, reason: str) -> None:
        await self.put(USERS, user.name, msgspec.json.encode(user), actor=actor, reason=reason)

    async def end_sessions(self, name: str, *, actor: str, reason: str) -> int:
        ended = [key for key, session in (await self.sessions()).items() if session.user == name]
        await self.delete_sessions(ended, actor=actor, reason=reason)
        return len(ended)

    async def delete_sessions(self, names: Iterable[str], *, actor: str, reason: str) -> None:
        for key in names:
            await self.put(SESSIONS, key, None, actor=actor, reason=reason)

    async def ensure(self, name: str, role: Role, password: str, *, actor: str) -> None:
        """Create the user, or give an existing one this role and password and enable it (make run's
        demo users, new passwords at every start)."""
        users = await self.users()
        if name not in users:
            await self.add(name, role, password, actor=actor)
            return
        if users[name].role is not role:
            await self.set_role(name, role, actor=actor)
        if users[name].disabled:
            await self.enable(name, actor=actor)
        await self.set_password(name, password, actor=actor, reason="password reset")


def _web_role(role: Role) -> Role:
    if role not in WEB_ROLES:
        names = ", ".join(r.value for r in WEB_ROLES)
        raise AccountError(f"role {role.value} has no web login; a user is one of: {names}")
    return role
