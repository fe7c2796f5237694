"""The messages table and every index that follows from a message's row.

A row is a `MessageRecord`; the rules change a message by writing a new record (`save(before,
after)`), and this module moves the message between the indexes its fields put it in:

    DUE      kind, due_ms, id      while WAITING      the lease scan and "ready": O(log N + batch)
    LEASES   deadline, id          while LEASED       expiry, earliest deadline first
    DEAD     group, dead_ms, id    while DEAD         the dead-letter tier, by (kind, error class,
                                                      currency, has an amount), with its aggregate
    DEAD_AMOUNTS group, bucket, dead_ms, id           the same letters with an amount, by amount
                                                      bucket, with the buckets' aggregates
                                                      (queues.core.dead_amounts)
    PURGE    purge_ms, id          while a tombstone  the purge, oldest first
    REFS     hash(ref key), id     always             a business id's requests
    KEYS     hash(idempotency key) -> id              the key's current holder (claimed at enqueue:
                                                      `claim`, one lookup that inserts a free key)

and counts each move between phases into the entry's per-(kind, phase) counts. Every scan the
rules make goes through one of these indexes, with a bound.

Must never: read a clock, or decide a transition (the rules do; this keeps the indexes true).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import msgspec

from queues.core import dead_amounts, keys
from queues.core.entry import Entry
from queues.core.money import money_of
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import (
    DeadEntry,
    DeadGroup,
    MessageRecord,
    dead_entry_decoder,
    encode,
    group_decoder,
    message_decoder,
    sum_of,
    to_sum,
)
from queues.model import Phase

WAITING: Final = Phase.WAITING
LEASED: Final = Phase.LEASED
DEAD: Final = Phase.DEAD
_group_encoder: Final = msgspec.msgpack.Encoder()

GroupName = tuple[str, str, str | None, bool]
"""(kind, dead error class, currency, has an integer amount): one group of the dead-letter tier."""


def load(view: KvRead, message_id: int) -> MessageRecord | None:
    stored = view.get(Table.MESSAGES, keys.u64(message_id))
    return None if stored is None else message_decoder.decode(stored)


def payload(view: KvRead, record: MessageRecord) -> bytes:
    """The current payload: the edited one if an operator redrove with one, else the original."""
    table = Table.EDITED if record.edited else Table.BODIES
    stored = view.get(table, keys.u64(record.id))
    assert stored is not None, f"message {record.id} has no payload"
    return stored


def holder(view: KvRead, idempotency_key: str) -> MessageRecord | None:
    """The message that holds the key (a live request or its tombstone), if any."""
    return _holder(view, idempotency_key, view.get(Table.KEYS, keys.key_hash(idempotency_key)))


def claim(tx: KvWrite, idempotency_key: str, hashed: bytes, message_id: int) -> MessageRecord | None:
    """Claim the key (its `keys.key_hash`, `hashed`) for a new message `message_id`, unless a
    message holds it: then that holder (a live request or its tombstone), and nothing written.
    None: the key now maps to `message_id`, whose row `insert(..., claimed=True)` must write in
    the same entry (or the claim is given back with a delete of the KEYS row)."""
    return _holder(tx, idempotency_key, tx.claim(Table.KEYS, hashed, keys.u64(message_id)))


def _holder(view: KvRead, idempotency_key: str, stored: bytes | None) -> MessageRecord | None:
    """The row of the message whose id the key's KEYS row holds (`stored`)."""
    if stored is None:
        return None
    record = load(view, keys.u64_of(stored))
    assert record is not None and record.idempotency_key == idempotency_key, (
        f"idempotency key {idempotency_key!r} maps to message {keys.u64_of(stored)}, which is not its holder"
    )
    return record


def group_name(record: MessageRecord) -> GroupName:
    assert record.dead_error_class is not None
    return record.kind, record.dead_error_class, record.currency, record.amount is not None


def insert(
    entry: Entry, record: MessageRecord, body: bytes, hashed: bytes | None = None, *, claimed: bool = False
) -> None:
    """A new message (always WAITING): its row, its payload, and its key claimed (`hashed`: the
    key's `keys.key_hash`, when the caller has it already; `claimed`: `claim` wrote the key's row)."""
    tx = entry.tx
    key = keys.u64(record.id)
    tx.put(Table.MESSAGES, key, encode(record), append=True)
    tx.put(Table.BODIES, key, body, append=True)
    if not claimed:
        tx.put(Table.KEYS, keys.key_hash(record.idempotency_key) if hashed is None else hashed, key)
    tx.put(Table.REFS, keys.ref_prefix(record.ref_key) + key, b"")
    tx.put(Table.DUE, keys.kind_prefix(record.kind) + keys.pair(record.due_ms, record.id), b"")
    entry.move(record.kind, None, record.phase)


def save(entry: Entry, before: MessageRecord, after: MessageRecord) -> None:
    """Write `after` over `before` (the same message) and move it between the indexes."""
    tx = entry.tx
    message_id = after.id
    tx.put(Table.MESSAGES, keys.u64(message_id), encode(after))
    was, now = before.phase, after.phase
    if was is not now:
        entry.move(after.kind, was, now)
    if was is WAITING or now is WAITING:
        due_before = before.due_ms if was is WAITING else None
        due_after = after.due_ms if now is WAITING else None
        if due_before != due_after:
            if due_before is not None:
                tx.delete(Table.DUE, keys.kind_prefix(before.kind) + keys.pair(due_before, message_id))
            if due_after is not None:
                tx.put(Table.DUE, keys.kind_prefix(after.kind) + keys.pair(due_after, message_id), b"")
    if was is LEASED or now is LEASED:
        deadline_before = before.lease_deadline_ms if was is LEASED else None
        deadline_after = after.lease_deadline_ms if now is LEASED else None
        if deadline_before != deadline_after:
            if deadline_before is not None:
                tx.delete(Table.LEASES, keys.pair(deadline_before, message_id))
            if deadline_after is not None:
                tx.put(Table.LEASES, keys.pair(deadline_after, message_id), b"")
    if was is DEAD or now is DEAD:
        _move_dead(tx, entry, before, after)
    if before.purge_ms != after.purge_ms:
        if before.purge_ms is not None:
            tx.delete(Table.PURGE, keys.pair(before.purge_ms, message_id))
        if after.purge_ms is not None:
            tx.put(Table.PURGE, keys.pair(after.purge_ms, message_id), b"")


def remove(entry: Entry, record: MessageRecord) -> None:
    """A tombstone past its retention leaves the store (and its key, if it still holds it)."""
    tx = entry.tx
    key = keys.u64(record.id)
    tx.delete(Table.MESSAGES, key)
    tx.delete(Table.BODIES, key)
    if record.edited:
        tx.delete(Table.EDITED, key)
    hashed = keys.key_hash(record.idempotency_key)
    if tx.get(Table.KEYS, hashed) == key:
        tx.delete(Table.KEYS, hashed)
    tx.delete(Table.REFS, keys.ref_prefix(record.ref_key) + key)
    if record.purge_ms is not None:
        tx.delete(Table.PURGE, keys.pair(record.purge_ms, record.id))
    entry.move(record.kind, record.phase, None)


def with_money(view: KvRead, record: MessageRecord) -> MessageRecord:
    """The record as it enters the dead-letter tier: with its current payload's amount and currency."""
    amount, currency = money_of(payload(view, record))
    return msgspec.structs.replace(record, amount=amount, currency=currency)


# ---- the dead-letter tier ----------------------------------------------------------------------------
def _group_key(name: GroupName) -> bytes:
    return _group_encoder.encode(name)


def _group(tx: KvWrite, entry: Entry, name: GroupName) -> tuple[bytes, DeadGroup]:
    key = _group_key(name)
    stored = tx.get(Table.DEAD_GROUPS, key)
    if stored is not None:
        return key, group_decoder.decode(stored)
    group = DeadGroup(entry.meta.next_group)
    entry.meta.next_group += 1
    return key, group


def _move_dead(tx: KvWrite, entry: Entry, before: MessageRecord, after: MessageRecord) -> None:
    was, now = before.phase is DEAD, after.phase is DEAD
    if was and now and group_name(before) == group_name(after) and before.dead_ms == after.dead_ms:
        if before.attempts != after.attempts:
            key, group = _group(tx, entry, group_name(after))
            _put_dead(tx, group.group, after)
        return
    if was:
        key, group = _group(tx, entry, group_name(before))
        tx.delete(Table.DEAD, keys.group_key(group.group, before.dead_ms or 0, before.id))
        if before.amount is not None:
            dead_amounts.remove(tx, group.group, before.dead_ms or 0, before.id, before.amount)
        total = sum_of(group.total) - (before.amount or 0)
        tx.put(Table.DEAD_GROUPS, key, encode(DeadGroup(group.group, group.count - 1, to_sum(total))))
    if now:
        key, group = _group(tx, entry, group_name(after))
        _put_dead(tx, group.group, after)
        total = sum_of(group.total) + (after.amount or 0)
        tx.put(Table.DEAD_GROUPS, key, encode(DeadGroup(group.group, group.count + 1, to_sum(total))))


def _put_dead(tx: KvWrite, group: int, record: MessageRecord) -> None:
    """The letter in the DEAD index and, with an amount, in the amount index (queues.core.dead_amounts)."""
    dead = DeadEntry(record.amount, record.attempts)
    tx.put(Table.DEAD, keys.group_key(group, record.dead_ms or 0, record.id), encode(dead))
    if record.amount is not None:
        dead_amounts.add(tx, group, record.dead_ms or 0, record.id, dead)


def dead_groups(view: KvRead) -> Iterator[tuple[GroupName, DeadGroup]]:
    """Every group the tier has had (empty ones too), in no particular order."""
    for key, value in view.scan(Table.DEAD_GROUPS):
        kind, error_class, currency, has_amount = msgspec.msgpack.decode(key)
        yield (kind, error_class, currency, has_amount), group_decoder.decode(value)


def dead_in_group(view: KvRead, group: int, after: tuple[int, int] | None) -> Iterator[tuple[bytes, DeadEntry]]:
    """(dead_ms + id as bytes, entry) of the group's dead letters after (dead_ms, id), in that order."""
    prefix = keys.group_prefix(group)
    start = prefix if after is None else keys.group_key(group, after[0], after[1] + 1)
    for key, value in view.scan(Table.DEAD, start, keys.after(prefix)):
        yield key[4:], dead_entry_decoder.decode(value)


# ---- scans over the time indexes -----------------------------------------------------------------------
def due(view: KvRead, kind: str, now_ms: int) -> Iterator[tuple[int, int]]:
    """(due_ms, id) of the kind's ready messages, oldest due first."""
    prefix = keys.kind_prefix(kind)
    size = len(prefix)
    for key, _ in view.scan(Table.DUE, prefix, prefix + keys.u64(now_ms + 1)):
        yield keys.pair_of(key, size)


def next_due(view: KvRead, kind: str, now_ms: int) -> int | None:
    """When the kind's next delayed message becomes ready (None: none is delayed)."""
    prefix = keys.kind_prefix(kind)
    for key, _ in view.scan(Table.DUE, prefix + keys.u64(now_ms + 1), keys.after(prefix)):
        return keys.u64_of(key, len(prefix))
    return None


def oldest_due(view: KvRead, kind: str, now_ms: int) -> int | None:
    for due_ms, _ in due(view, kind, now_ms):
        return due_ms
    return None


def expired_leases(view: KvRead, now_ms: int, limit: int) -> list[int]:
    """Ids of leased messages whose deadline is at or before now, earliest deadline first."""
    found: list[int] = []
    for key, _ in view.scan(Table.LEASES, b"", keys.u64(now_ms + 1)):
        found.append(keys.pair_of(key)[1])
        if len(found) == limit:
            break
    return found


def purgeable(view: KvRead, now_ms: int, limit: int) -> list[int]:
    """Ids of tombstones whose retention ended, oldest purge time first."""
    found: list[int] = []
    for key, _ in view.scan(Table.PURGE, b"", keys.u64(now_ms + 1)):
        found.append(keys.pair_of(key)[1])
        if len(found) == limit:
            break
    return found


def first_key_time(view: KvRead, table: Table) -> int | None:
    """The time of a time-ordered index's first key (the next lease deadline, purge time)."""
    for key, _ in view.scan(table):
        return keys.u64_of(key)
    return None


def by_ref(view: KvRead, ref_key: str, limit: int) -> list[MessageRecord]:
    """A business id's messages, oldest first."""
    prefix = keys.ref_prefix(ref_key)
    found: list[MessageRecord] = []
    for key, _ in view.scan(Table.REFS, prefix, keys.after(prefix)):
        record = load(view, keys.u64_of(key, len(prefix)))
        if record is not None and record.ref_key == ref_key:
            found.append(record)
            if len(found) == limit:
                break
    return found
