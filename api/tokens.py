"""API tokens: how one is made and how it is recognised, without the web framework.

A token is ``cmp_`` followed by 256 random bits in base64url (43 characters). The prefix lets a
secret scanner find a leaked one; the bits make guessing hopeless. The store keeps only the
token's SHA-256 (queues/access.py says why a fast hash suffices for 256 random bits), and this
module is the one place that turns a presented token into that hash.

Must never: log, print or store a token; only `new_token`'s caller sees one, once.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Final

PREFIX: Final = "cmp_"
_SHAPE: Final = re.compile(r"^cmp_[A-Za-z0-9_-]{43}$")


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def well_formed(token: str) -> bool:
    """Shape only: a malformed token is refused without a lookup (and without a store refresh)."""
    return _SHAPE.match(token) is not None
