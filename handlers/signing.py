"""Webhook signatures, and the type that carries their keys without ever showing them.

The scheme payment webhooks use (Stripe's, in substance): the sender puts

    Webhook-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, f"{t}.".encode() + body)>

on the request, and the receiver recomputes the HMAC over the exact bytes it received, compares in
constant time, and refuses a timestamp more than `TOLERANCE_S` from its own clock, so a captured
request cannot be replayed later. Several ``v1=`` entries may be present (a key being rotated); one
match is enough.

`Secret` holds a key: its repr, str and format print ``Secret(***)``, it refuses to be pickled, and
no message here ever includes one, so a secret cannot reach a log line, an exception or a decision
by accident. `reveal()` is the one way out, called where the HMAC is computed.

Must never: read a clock (time is an argument) or log anything.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final, NoReturn

import msgspec

SIGNATURE_HEADER: Final = "Webhook-Signature"
SCHEME: Final = "v1"
TOLERANCE_S: Final = 300
"""Five minutes, either way: the receiver's and the sender's clocks may disagree a little."""
SECRET_BYTES_MIN: Final = 16
SECRET_BYTES_MAX: Final = 1024
HEADER_CHARS_MAX: Final = 1024
"""A longer signature header is malformed: it is parsed before anything is trusted."""
_MASK: Final = "Secret(***)"


class Secret:
    """A key whose value never appears in a repr, a str, a format, a pickle or an error message."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        if not SECRET_BYTES_MIN <= len(value) <= SECRET_BYTES_MAX:
            raise ValueError(f"a secret must be {SECRET_BYTES_MIN}..{SECRET_BYTES_MAX} bytes long")
        self._value = value

    @classmethod
    def from_text(cls, text: str) -> Secret:
        return cls(text.encode())

    def reveal(self) -> bytes:
        return self._value

    def __repr__(self) -> str:
        return _MASK

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")


class Verification(enum.Enum):
    VALID = "valid"
    MISSING = "missing"
    MALFORMED = "malformed"
    MISMATCH = "mismatch"
    """No v1 entry matches: a wrong secret, or a body or timestamp changed on the way."""
    STALE = "stale"
    """The signature matches but its timestamp is outside the tolerance: a replay, or a stuck clock."""


def _digest(secret: Secret, timestamp_s: int, body: bytes) -> str:
    return hmac.new(secret.reveal(), f"{timestamp_s}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: Secret, *, timestamp_s: int, body: bytes) -> str:
    """The header value for `body` sent at `timestamp_s`."""
    return f"t={timestamp_s},{SCHEME}={_digest(secret, timestamp_s, body)}"


def _parsed(header: str) -> tuple[int, list[str]] | None:
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            return None
        if key == "t":
            if timestamp is not None or not (value.isascii() and value.isdigit()):
                return None
            timestamp = int(value)
        elif key == SCHEME:
            signatures.append(value)
    if timestamp is None or not signatures:
        return None
    return timestamp, signatures


def verify(
    secret: Secret, header: str | None, body: bytes, *, now_s: float, tolerance_s: float = TOLERANCE_S
) -> Verification:
    if header is None or not header.strip():
        return Verification.MISSING
    parsed = _parsed(header) if len(header) <= HEADER_CHARS_MAX else None
    if parsed is None:
        return Verification.MALFORMED
    timestamp_s, signatures = parsed
    expected = _digest(secret, timestamp_s, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        return Verification.MISMATCH
    if abs(now_s - timestamp_s) > tolerance_s:
        return Verification.STALE
    return Verification.VALID


class SecretsError(ValueError):
    """A secrets document that cannot be used; the message names targets, never values."""


TARGETS_MAX: Final = 256


def secrets_from_json(document: bytes, *, origin: str) -> dict[str, Secret]:
    """``{"<target>": "<secret>", ...}`` as secrets; `origin` (a path, an env variable's name) is
    what the error messages say the document came from."""
    try:
        decoded = msgspec.json.decode(document, type=dict[str, str])
    except msgspec.DecodeError:
        raise SecretsError(f"{origin}: expected a JSON object of target name to secret string") from None
    if len(decoded) > TARGETS_MAX:
        raise SecretsError(f"{origin}: more than {TARGETS_MAX} targets")
    secrets: dict[str, Secret] = {}
    for name, text in decoded.items():
        try:
            secrets[name] = Secret.from_text(text)
        except ValueError as error:
            raise SecretsError(f"{origin}: target {name!r}: {error}") from None
    return secrets


def names(secrets: Mapping[str, Secret]) -> list[str]:
    """What may be printed about a set of secrets."""
    return sorted(secrets)
