"""The dead-letter tier by amount: a summary over an amount range without a scan of the range.

Each group of the tier (kind, error class, currency, has an amount; queues.core.messages) that
holds amounts is cut into buckets of two significant decimal digits: every amount below 100 in
magnitude is a bucket of its own, 100..109, 110..119, ..., 990..999, 1000..1099, ... (negative
amounts mirror the positive ones). Two tables, kept as letters enter and leave the tier, with no
row for an empty bucket:

    DEAD_BUCKETS   group, bucket            -> DeadBucket(count, total)
    DEAD_AMOUNTS   group, bucket, dead_ms, id -> DeadEntry(amount, attempts)

A summary over [min, max] reads the group's buckets that meet the range: a bucket inside it
counts whole from its aggregate, its oldest letter is the first key of its prefix in
DEAD_AMOUNTS; only the (at most two) buckets that hold a bound are read letter by letter. A
bucket is 1% to 10% of its amounts wide, so the cost is O(buckets met + the letters of the two
edge buckets), never the range's letters: at most 90 buckets a decade, and an edge holds the
letters within 10% of a bound (all of them only when every amount sits beside the bound).

Both tables follow from the DEAD index alone (`rebuild`), which is how a store written before
they existed gets them: `queues.machine` rebuilds them on open and after a snapshot is restored
when their count disagrees with the tier's. They are derived, not replicated state: the canonical
state (and its digests) does not hold them; `store_digest` does, and a rebuilt store holds the
same bytes as one that kept them from its first letter.

Must never: read a clock, or hold a row for an empty bucket.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

from queues.core import keys
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import DeadEntry, Sum, dead_entry_decoder, encode, sum_of, to_sum

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
_BIAS: Final = 1 << 63
_GROUP_BUCKET: Final = struct.Struct(">IQ")
_GROUP_BUCKET_PAIR: Final = struct.Struct(">IQQQ")


class DeadBucket(msgspec.Struct, frozen=True, array_like=True, gc=False):
    count: int
    total: Sum
    """Read through `sum_of`."""


_bucket_decoder: Final = msgspec.msgpack.Decoder(DeadBucket)


def bucket_of(amount: int) -> tuple[int, int]:
    """(lowest, highest) amount of the bucket that holds `amount`, both inclusive, within int64."""
    low, high = _magnitude_bucket(-amount)
    if amount < 0:
        return max(-high, INT64_MIN), -low
    low, high = _magnitude_bucket(amount)
    return low, min(high, INT64_MAX)


def _magnitude_bucket(magnitude: int) -> tuple[int, int]:
    if magnitude < 100:
        return magnitude, magnitude
    step = 10 ** (len(str(magnitude)) - 2)
    low = magnitude - magnitude % step
    return low, low + step - 1


def _bucket_key(group: int, low: int) -> bytes:
    return _GROUP_BUCKET.pack(group, low + _BIAS)


def _letter_key(group: int, low: int, dead_ms: int, message_id: int) -> bytes:
    return _GROUP_BUCKET_PAIR.pack(group, low + _BIAS, dead_ms, message_id)


def add(tx: KvWrite, group: int, dead_ms: int, message_id: int, entry: DeadEntry) -> None:
    """A letter with an amount entered the group (or its attempts changed: `put` replaces)."""
    assert entry.amount is not None
    low, _ = bucket_of(entry.amount)
    key = _letter_key(group, low, dead_ms, message_id)
    fresh = tx.get(Table.DEAD_AMOUNTS, key) is None
    tx.put(Table.DEAD_AMOUNTS, key, encode(entry))
    if fresh:
        _count(tx, group, low, 1, entry.amount)


def remove(tx: KvWrite, group: int, dead_ms: int, message_id: int, amount: int) -> None:
    low, _ = bucket_of(amount)
    if tx.delete(Table.DEAD_AMOUNTS, _letter_key(group, low, dead_ms, message_id)):
        _count(tx, group, low, -1, -amount)


def _count(tx: KvWrite, group: int, low: int, count: int, total: int) -> None:
    key = _bucket_key(group, low)
    stored = tx.get(Table.DEAD_BUCKETS, key)
    was = DeadBucket(0, 0) if stored is None else _bucket_decoder.decode(stored)
    now = DeadBucket(was.count + count, to_sum(sum_of(was.total) + total))
    if now.count:
        tx.put(Table.DEAD_BUCKETS, key, encode(now))
    else:
        tx.delete(Table.DEAD_BUCKETS, key)


def in_range(view: KvRead, group: int, low: int, high: int) -> tuple[int, int, tuple[int, int] | None]:
    """(count, total, oldest (dead_ms, id)) of the group's letters with low <= amount <= high."""
    count = total = 0
    oldest: tuple[int, int] | None = None
    if low > high:
        return count, total, oldest
    first, _ = bucket_of(max(low, INT64_MIN))
    last, _ = bucket_of(min(high, INT64_MAX))
    start, stop = _bucket_key(group, first), keys.after(_bucket_key(group, last))
    for key, value in view.scan(Table.DEAD_BUCKETS, start, stop):
        bucket_low = _GROUP_BUCKET.unpack(key)[1] - _BIAS
        _, bucket_high = bucket_of(bucket_low)
        prefix = key
        if low <= bucket_low and bucket_high <= high:
            bucket = _bucket_decoder.decode(value)
            count += bucket.count
            total += sum_of(bucket.total)
            for letter, _ in view.scan(Table.DEAD_AMOUNTS, prefix, keys.after(prefix)):
                oldest = _older(oldest, letter)
                break
            continue
        for letter, stored in view.scan(Table.DEAD_AMOUNTS, prefix, keys.after(prefix)):
            amount = dead_entry_decoder.decode(stored).amount
            assert amount is not None
            if low <= amount <= high:
                count += 1
                total += amount
                oldest = _older(oldest, letter)
    return count, total, oldest


def _older(oldest: tuple[int, int] | None, letter: bytes) -> tuple[int, int]:
    found = keys.pair_of(letter, _GROUP_BUCKET.size)
    return found if oldest is None or found < oldest else oldest


def letters(view: KvRead) -> int:
    """How many letters the amount index holds: O(1)."""
    return view.count(Table.DEAD_AMOUNTS)


def rebuild(tx: KvWrite, groups_with_amounts: list[int]) -> None:
    """Both tables anew from the DEAD index of these groups: what keeping them from the first
    letter on would have written."""
    for table in (Table.DEAD_AMOUNTS, Table.DEAD_BUCKETS):
        for key in [key for key, _ in tx.scan(table)]:
            tx.delete(table, key)
    for group in groups_with_amounts:
        prefix = keys.group_prefix(group)
        for key, value in list(tx.scan(Table.DEAD, prefix, keys.after(prefix))):
            _, dead_ms, message_id = keys.group_key_of(key)
            entry = dead_entry_decoder.decode(value)
            if entry.amount is not None:
                add(tx, group, dead_ms, message_id, entry)
