"""Order-preserving key encodings for the port's byte-ordered tables.

Integers are 8-byte big-endian (the queue's ids, sequence numbers and times are never negative),
so byte order is numeric order. A string that other components follow is its UTF-8 with each NUL
written as NUL 0x01 and a NUL NUL terminator: a prefix scan of one string never reaches another
that merely starts with it, and order between strings is their byte order. Kind names cannot hold
a NUL (their pattern), so a kind is its bytes and one NUL.

Idempotency keys are up to 136 characters (544 UTF-8 bytes: more than LMDB's 511-byte keys), so
the key table holds their 16-byte BLAKE2b; the message row holds the key itself, and a lookup
checks it. Ref keys are indexed by an 8-byte BLAKE2b prefix, many messages per ref key: a scan
of the prefix reads the candidates, and the rows say which are the ref key's.

Must never: read state, clocks or anything but its arguments.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

_U64: Final = struct.Struct(">Q")
_U64_U64: Final = struct.Struct(">QQ")
_U32_U64_U64: Final = struct.Struct(">IQQ")
U64_MAX: Final = (1 << 64) - 1
STATE: Final = b"queue"
"""The META table's one key."""


u64: Final = _U64.pack
"""An integer as 8 big-endian bytes (the struct's own method: the hottest call of the core)."""


def u64_of(key: bytes, offset: int = 0) -> int:
    return int(_U64.unpack_from(key, offset)[0])


pair: Final = _U64_U64.pack
"""Two integers as 16 big-endian bytes."""


def pair_of(key: bytes, offset: int = 0) -> tuple[int, int]:
    first, second = _U64_U64.unpack_from(key, offset)
    return int(first), int(second)


def group_key(group: int, dead_ms: int, message_id: int) -> bytes:
    return _U32_U64_U64.pack(group, dead_ms, message_id)


def group_key_of(key: bytes) -> tuple[int, int, int]:
    group, dead_ms, message_id = _U32_U64_U64.unpack(key)
    return int(group), int(dead_ms), int(message_id)


def group_prefix(group: int) -> bytes:
    return group.to_bytes(4, "big")


def text(value: str) -> bytes:
    """A string as the leading part of a compound key (see the module docstring)."""
    return value.encode().replace(b"\x00", b"\x00\x01") + b"\x00\x00"


def kind_prefix(kind: str) -> bytes:
    return kind.encode() + b"\x00"


def key_hash(idempotency_key: str) -> bytes:
    return hashlib.blake2b(idempotency_key.encode(), digest_size=16).digest()


def ref_prefix(ref_key: str) -> bytes:
    return hashlib.blake2b(ref_key.encode(), digest_size=8).digest()


def after(prefix: bytes) -> bytes | None:
    """The first key above every key that starts with `prefix` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
