"""What an HTTP/1.1 call is made of, apart from the socket: where it goes (`Target`), its head
as bytes, the answer as a value, the pool's limits, and the errors a call can end with, split by
the one fact the gateway needs: whether any byte of the request was written (`NotSentError`)
or may have been (`SentError`).

Must never: do I/O, or put a header value or a body in an error or a repr.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlsplit

_TOKEN: Final = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VALUE_FORBIDDEN: Final = re.compile(r"[\r\n\0]")
_TARGET_SAFE: Final = "!#$%&'()*+,/:;=?@[]~"
"""Kept as they are in a request target; anything else (a space, a control character, non-ASCII)
is percent-encoded, as httpx does."""
_COMPUTED: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Headers the client writes itself; a caller's would contradict them."""
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


# ---- errors ------------------------------------------------------------------------------------
class HttpError(Exception):
    """A call that ended without an answer. The message names the failure, never a header or a body."""


class NotSentError(HttpError):
    """Nothing of the request was written: repeating it is safe."""


class ConnectError(NotSentError):
    """No connection could be made (refused, unreachable, a name that does not resolve, TLS refused)."""


class ConnectTimeout(NotSentError):
    pass


class PoolTimeout(NotSentError):
    """Every connection stayed busy for the pool timeout."""


class DeadlineBeforeSend(NotSentError):
    """The caller's deadline passed while waiting for a connection."""


class SendByPassed(NotSentError):
    """The caller's send-by moment had passed when a connection was ready: nothing was written."""


class SentError(HttpError):
    """The request was written, or a part of it: the server may have acted on it."""


class WriteTimeout(SentError):
    pass


class ReadTimeout(SentError):
    pass


class DeadlineAfterSend(SentError):
    """The caller's deadline passed after the request was written, before the answer was whole."""


class ConnectionLost(SentError):
    """The connection ended before the answer was whole."""


class RemoteProtocolError(SentError):
    """The server's bytes are not an HTTP/1.1 answer."""


class DecodingError(SentError):
    """The answer's Content-Encoding did not decode."""


TIMEOUTS: Final = (WriteTimeout, ReadTimeout, DeadlineAfterSend)


# ---- values ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: its origin, its Host header and its request target (path and query)."""

    origin: Origin
    host_header: str
    path: str

    def relative(self, path: str) -> Target:
        """The same origin, another path (a handler's URL relative to its downstream's base)."""
        if not path.startswith("/"):
            path = "/" + path
        return Target(self.origin, self.host_header, _request_target(path))


def parse_url(url: str) -> Target:
    """An absolute http(s) URL as a `Target`; ValueError for anything else (a programmer's error:
    URLs are configuration, checked when the settings are read)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError("not an absolute http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a URL with credentials")
    host = parts.hostname
    port = parts.port or _DEFAULT_PORTS[scheme]
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(Origin(scheme, host, port), host_header, _request_target(path))


def _request_target(path: str) -> str:
    return quote(path, safe=_TARGET_SAFE)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]
    """Lower-case names, values as sent (latin-1), in the order received."""
    body: bytes
    truncated: bool
    """The body was longer than `body_max`: only its start is here, and the connection was closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLimits:
    connections_max: int
    keepalive_max: int
    keepalive_expiry_s: float
    connect_timeout_s: float
    write_timeout_s: float
    read_timeout_s: float
    pool_timeout_s: float


def encode_head(method: str, target: Target, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """The request line and headers; ValueError for a method, name or value that cannot be sent
    as it is (a CR or LF would let a value write headers of its own)."""
    if _TOKEN.match(method) is None:
        raise ValueError("an HTTP method must be a token")
    lines = [f"{method} {target.path} HTTP/1.1\r\nhost: {target.host_header}\r\n"]
    for name, value in headers:
        if _TOKEN.match(name) is None or name.lower() in _COMPUTED:
            raise ValueError(f"header name {name[:40]!r} cannot be sent")
        if _VALUE_FORBIDDEN.search(value) is not None:
            raise ValueError(f"the value of header {name!r} holds CR, LF or NUL")
        lines.append(f"{name}: {value}\r\n")
    if body or method in {"POST", "PUT", "PATCH"}:
        lines.append(f"content-length: {len(body)}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("a header holds a character outside latin-1") from None
