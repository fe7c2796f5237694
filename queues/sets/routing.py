"""Where a key goes: jump consistent hash within an epoch, the oldest epoch that holds it across them.

A key's candidate in epoch e is `sets_e[jump(h(key), len(sets_e))]`: h is the first 8 bytes of
BLAKE2b of the key's UTF-8 (stable across processes and versions, unlike Python's `hash`), and
jump is Lamping and Veach's jump consistent hash ("A Fast, Minimal Memory, Consistent Hash
Algorithm", 2014). Jump hash spreads keys evenly over n buckets, and going from n to n+k buckets
moves a key only into one of the k new ones: since a newer epoch's list extends the older one's,
a key keeps its candidate between epochs unless a new set took it (k/(n+k) of the keys).

A key's home is the candidate of the oldest active epoch in which it exists; a key seen nowhere
goes to the newest epoch's candidate. So a replay needs a cross-set lookup only for keys whose
candidate changed between epochs (`lookups`), and a fence (docs/sets.md) makes sure no two first
posts of one key land in two sets.

Must never: do I/O, or depend on anything but the key and the epochs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from queues.sets.table import Epoch

_MASK: Final = (1 << 64) - 1
_MULTIPLIER: Final = 2862933555777941757


def key_hash(key: str) -> int:
    """A stable 64-bit hash of the key."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def jump(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: a bucket in [0, buckets)."""
    if buckets < 1:
        raise ValueError("jump hash needs at least one bucket")
    key &= _MASK
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * _MULTIPLIER + 1) & _MASK
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def candidate(key: str, epoch: Epoch, hashed: int | None = None) -> int:
    """The set this epoch would put the key in."""
    return epoch.sets[jump(key_hash(key) if hashed is None else hashed, len(epoch.sets))]


def candidates(key: str, epochs: Sequence[Epoch]) -> list[int]:
    """The key's candidate in each epoch, oldest first."""
    hashed = key_hash(key)
    return [candidate(key, epoch, hashed) for epoch in epochs]


def lookups(key: str, epochs: Sequence[Epoch]) -> tuple[int, ...]:
    """The sets that must be asked whether they hold the key before the newest epoch's candidate
    takes it: the older epochs' candidates that differ from the newest's, oldest first, each once.
    Empty for nearly every key (those that kept their set when sets were added)."""
    found = candidates(key, epochs)
    newest = found[-1]
    asked: list[int] = []
    for set_id in found[:-1]:
        if set_id != newest and set_id not in asked:
            asked.append(set_id)
    return tuple(asked)


def home(key: str, epochs: Sequence[Epoch], holders: Sequence[int]) -> int:
    """The key's set: the candidate of the oldest epoch whose candidate holds it (`holders`: the
    sets that answered they hold it), else the newest epoch's candidate."""
    found = candidates(key, epochs)
    for set_id in found:
        if set_id in holders:
            return set_id
    return found[-1]
