"""Enqueue and its deduplication by idempotency key.

The key maps to a message while the message is not terminal, and for the retention in force
after it became done or discarded (each tombstone keeps the purge time it was given). "Same"
means same kind, ref key and payload (headers are trace context and may differ per retry): same
is EXISTS with the original id and its current state, different is CONFLICT. A repeat whose
client-drawn `request_id` is the original's is the client's own retry after a lost answer
(enqueues travel without a session lane) and is answered OK, as the first application was.

A set fenced at route epoch N (`RouteFence`, docs/sets.md) refuses a key it does not hold when
the enqueue was routed by an older epoch (ROUTE_STALE); a key it holds is answered as always.

Must never: read a clock, or let a key have two live holders.
"""

from __future__ import annotations

from typing import Final

from delay.policy import DELAY_MAX_MS
from queues import codec
from queues.core import keys, messages
from queues.core.entry import Entry
from queues.core.port import Table
from queues.core.records import MessageRecord
from queues.model import (
    Code,
    Enqueue,
    EnqueueResult,
    ErrorResult,
    EventType,
    Phase,
    QueueResult,
    RouteResult,
    content_hash,
    state_of,
)

WAITING: Final = Phase.WAITING


def enqueue(entry: Entry, command: Enqueue) -> QueueResult:
    if command.kind not in entry.catalog.kinds(entry.tx):
        return EnqueueResult(code=Code.UNKNOWN_KIND)
    now_ms = entry.now_ms
    due_ms = command.due_ms if command.due_ms is not None else now_ms + command.delay_ms
    if due_ms > now_ms + DELAY_MAX_MS:
        return ErrorResult(code=Code.INVALID, detail="due time beyond DELAY_MAX_MS")
    digest = content_hash(command.kind, command.ref_key, command.payload)
    hashed = keys.key_hash(command.idempotency_key)
    meta = entry.meta
    message_id = meta.next_message_id
    # The key is claimed for the new message by the lookup itself (one B-tree descent, not two):
    # None when it was free, else its holder, and then nothing was written.
    existing = messages.claim(entry.tx, command.idempotency_key, hashed, message_id)
    if existing is not None and (existing.purge_ms is None or existing.purge_ms > now_ms):
        if existing.content_hash != digest:
            code = Code.CONFLICT
        elif command.request_id and existing.request_id == command.request_id:
            code = Code.OK  # the same request retried by its client: answered as the first time
        else:
            code = Code.EXISTS
        state = state_of(existing.phase, existing.due_ms, now_ms)
        return EnqueueResult(code=code, message_id=existing.id, state=state, due_ms=existing.due_ms)
    if command.route_epoch < entry.catalog.min_route_epoch(entry.tx):
        # A new key routed by an epoch older than this set's fence: the key's home may be another
        # set by the newer epoch; the client re-reads the set table (docs/sets.md, "Fencing").
        if existing is None:
            entry.tx.delete(Table.KEYS, hashed)  # the claim given back: the key stays free
        return RouteResult(code=Code.ROUTE_STALE, min_route_epoch=entry.catalog.min_route_epoch(entry.tx))
    meta.next_message_id = message_id + 1
    # Positional, in the layout's order (id, kind, idempotency_key, ref_key, content_hash, headers,
    # created_ms, phase, due_ms, attempts, budget_attempts, budget_start_ms, token, token_open,
    # payload_len, request_id): a third of the keyword call's cost, once per enqueue per replica.
    record = MessageRecord(
        message_id, command.kind, command.idempotency_key, command.ref_key, digest,
        codec.encode_headers(command.headers), now_ms, WAITING, due_ms, 0, 0, now_ms, 0, False, len(command.payload),
        command.request_id or None,
    )  # fmt: skip
    messages.insert(entry, record, command.payload, hashed, claimed=existing is None)
    entry.emit(
        EventType.ENQUEUED, message_id, command.kind,
        {"idempotency_key": command.idempotency_key, "ref_key": command.ref_key, "due_ms": due_ms},
    )  # fmt: skip
    return EnqueueResult(
        code=Code.OK, message_id=message_id, state=state_of(Phase.WAITING, due_ms, now_ms), due_ms=due_ms
    )
