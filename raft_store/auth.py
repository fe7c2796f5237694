"""Who may talk to a node: the holders of the cluster secret, optionally over mutual TLS.

Anyone who can open a connection to a node could otherwise propose commands (mint admin tokens,
add approvers) or pose as a peer and feed it Raft messages. So every connection, a client's or a
peer's, proves in its first round trips that it holds the cluster secret (raft_store/handshake.py),
without sending it: an HMAC over nonces from both sides, so a recorded handshake proves nothing on
the next connection. TLS, when configured, adds encryption and a CA's say over who connects.

The secret file holds one secret per line (blank lines and `#` comments aside): the first is the
one this process presents, every line is accepted. That is how a secret is rotated with no
downtime: add the next secret as a second line everywhere, then move it first everywhere, then
drop the old one (docs/security.md). The file is read again when it changes, so a process picks up
each step at its next connection without a restart.

A secret file readable by group or others is refused, as ssh and libpq refuse such key and
password files: a secret everybody on the machine can read guards nothing.

Must never: log, print or repr a secret; accept a handshake against an empty set of secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets as random_secrets
import ssl
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger("raft_store.auth")

SECRET_CHARS_MIN: Final = 32
"""At least 32 printable characters: `openssl rand -base64 32` makes 44, `make run` 43."""
SECRET_CHARS_MAX: Final = 1024
KEY_ID_BYTES: Final = 8
_KEY_ID_LABEL: Final = b"raft-store cluster secret id v1"
_PROOF_KEY_LABEL: Final = b"raft-store handshake key v1"


class AuthConfigError(ValueError):
    """A secret file or a TLS file is missing, unreadable, too open or malformed: one line."""


@dataclass(frozen=True, slots=True)
class Key:
    """One cluster secret, as the handshake uses it: an id both sides can name it by (a hash that
    reveals nothing of it) and the HMAC key derived from it."""

    id: bytes
    mac_key: bytes = field(repr=False)

    @classmethod
    def from_secret(cls, secret: bytes) -> Key:
        return cls(
            id=hmac.new(secret, _KEY_ID_LABEL, hashlib.sha256).digest()[:KEY_ID_BYTES],
            mac_key=hmac.new(secret, _PROOF_KEY_LABEL, hashlib.sha256).digest(),
        )


def parse_secrets(text: str, where: str) -> tuple[Key, ...]:
    """The keys of a secret file's text, the presented one first; AuthConfigError naming the line."""
    keys: list[Key] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not SECRET_CHARS_MIN <= len(line) <= SECRET_CHARS_MAX or not all(33 <= ord(c) <= 126 for c in line):
            raise AuthConfigError(
                f"{where}: line {number} is not a secret ({SECRET_CHARS_MIN}..{SECRET_CHARS_MAX} printable characters"
                " without spaces, e.g. `openssl rand -base64 32`)"
            )
        key = Key.from_secret(line.encode())
        if any(known.id == key.id for known in keys):
            raise AuthConfigError(f"{where}: line {number} repeats a secret")
        keys.append(key)
    if not keys:
        raise AuthConfigError(f"{where}: holds no secret")
    return tuple(keys)


def read_secret_file(path: Path) -> tuple[Key, ...]:
    """The file's keys; refuses a file that is not a regular file or that others may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as error:
        raise AuthConfigError(f"cluster secret {path}: cannot read: {error.strerror or error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AuthConfigError(f"cluster secret {path}: not a regular file")
        if info.st_mode & 0o077:
            raise AuthConfigError(
                f"cluster secret {path}: mode {stat.S_IMODE(info.st_mode):04o} lets others read it; chmod 600 it"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(64 * 1024)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise AuthConfigError(f"cluster secret {path}: not text (one secret per line)") from None
    return parse_secrets(text, f"cluster secret {path}")


def new_secret() -> str:
    """A fresh cluster secret: 256 random bits, 43 characters."""
    return random_secrets.token_urlsafe(32)


def write_secret_file(path: Path, *lines: str) -> None:
    """Create `path` (mode 0600, its folder 0700 if new) holding `lines`, or one new secret; never
    overwrites: a secret in use is replaced only by the rotation steps, on purpose."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = "".join(f"{line}\n" for line in (lines or (new_secret(),)))
    parse_secrets(text, str(path))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def replace_secret_file(path: Path, *lines: str) -> None:
    """Write `lines` to `path` atomically (a new 0600 file renamed over it): a rotation step. A
    process reading the file meanwhile sees the old set or the new one, never half of either."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
    temporary.unlink(missing_ok=True)
    write_secret_file(temporary, *lines)
    os.replace(temporary, path)


class SecretFile:
    """The cluster secrets of one file, read again whenever the file changes.

    A change that does not parse (a half-written file, a mode too open) keeps the secrets read
    before, logged, so a slip during a rotation does not lock every connection out; at start the
    file must be good."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._keys = read_secret_file(path)

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode

    def keys(self) -> tuple[Key, ...]:
        signature = self._stat()
        if signature is not None and signature != self._signature:
            with self._lock:
                if signature != self._signature:
                    try:
                        self._keys = read_secret_file(self.path)
                        log.info("cluster secret %s read again: %d accepted", self.path, len(self._keys))
                    except AuthConfigError as error:
                        log.warning("%s; keeping the %d secrets read before", error, len(self._keys))
                    self._signature = signature
        return self._keys

    def presented(self) -> Key:
        return self.keys()[0]

    def accepted(self, key_id: bytes) -> Key | None:
        for key in self.keys():
            if hmac.compare_digest(key.id, key_id):
                return key
        return None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Mutual TLS: this process's certificate and key, and the CA both sides' certificates must
    chain to. A node requires a client certificate; a client checks the node's name."""

    ca: Path
    cert: Path
    key: Path

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(purpose, cafile=str(self.ca))
            context.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as error:
            raise AuthConfigError(f"TLS ({self.ca}, {self.cert}, {self.key}): {error}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def server_context(self) -> ssl.SSLContext:
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_context(self) -> ssl.SSLContext:
        context = self._context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = True
        return context


class StoreAuth:
    """What a node or a client needs to open authenticated connections: the cluster secrets and,
    optionally, TLS. Built once per process from files; bad files fail here, at start."""

    def __init__(self, secrets: SecretFile, tls: TlsFiles | None = None) -> None:
        self.secrets = secrets
        self.tls = tls
        self.server_ssl: ssl.SSLContext | None = tls.server_context() if tls is not None else None
        self.client_ssl: ssl.SSLContext | None = tls.client_context() if tls is not None else None

    @classmethod
    def from_files(
        cls, secret_file: Path, *, tls_ca: Path | None = None, tls_cert: Path | None = None, tls_key: Path | None = None
    ) -> StoreAuth:
        given = [value for value in (tls_ca, tls_cert, tls_key) if value is not None]
        if given and len(given) != 3:
            raise AuthConfigError("TLS needs all three of the CA, the certificate and its key")
        tls = TlsFiles(tls_ca, tls_cert, tls_key) if tls_ca and tls_cert and tls_key else None
        return cls(SecretFile(secret_file), tls)

    def __repr__(self) -> str:
        return f"StoreAuth(secret_file={str(self.secrets.path)!r}, tls={self.tls is not None})"
