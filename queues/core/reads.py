"""The queue's read-only views: what the API, the workers' long-poll, the projections and the
replica audit read, from a consistent view of the state at one applied index.

Owns: a message by id, every message of a business id with its attempt history, dead letters with
filters and cursor pages and their summary (queues.core.dead_letters), counts per kind and state,
the oldest due age per kind (the lateness metric), what is due for a worker or for maintenance,
the event log after a sequence number and its digests, the payload scrub, and the registered kinds.

Must never: write. Time is the caller's `now_ms` (for "delayed" versus "ready"), never a clock
read here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import msgspec

from delay.policy import RetryPolicy
from queues import codec
from queues.core import dead_letters as tier
from queues.core import keys, messages
from queues.core.config import QueueConfig
from queues.core.entry import load_meta, retention_in_force
from queues.core.port import KvRead, Table
from queues.core.records import MessageRecord, event_decoder, int_decoder, message_decoder, pause_decoder
from queues.model import (
    AttemptView,
    DeadLetterFilter,
    DeadLetterSummary,
    Event,
    EventType,
    MessageView,
    Phase,
    State,
    content_hash,
    state_of,
)
from queues.query_codec import KindView, PauseView

PAGE_LIMIT_MAX: Final = 1000
REF_KEY_MESSAGES_MAX: Final = 1000

_policy_decoder: Final = msgspec.msgpack.Decoder(RetryPolicy)
_digest_encoder: Final = msgspec.msgpack.Encoder()


class DeadLetterPage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[MessageView, ...]
    next_cursor: str | None
    """Pass back to get the next page; None on the last page. Stable while new letters arrive."""


class KindStateCount(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    state: State
    count: int


class WorkDueView(msgspec.Struct, frozen=True, kw_only=True):
    ready: dict[str, int]
    next_due_ms: int | None
    paused: dict[str, tuple[str, ...]]
    paused_ready: tuple[str, ...]


def view_of(view: KvRead, record: MessageRecord, now_ms: int, with_history: bool) -> MessageView:
    key = keys.u64(record.id)
    return MessageView(
        message_id=record.id, kind=record.kind, idempotency_key=record.idempotency_key, ref_key=record.ref_key,
        payload=view.get(Table.BODIES, key) or b"", edited_payload=view.get(Table.EDITED, key) if record.edited else None,
        headers=codec.decode_headers(record.headers), created_ms=record.created_ms,
        state=state_of(record.phase, record.due_ms, now_ms), due_ms=record.due_ms, attempts=record.attempts,
        last_error_class=record.last_error_class, last_error_text=record.last_error_text, token=record.token,
        lease_worker=record.lease_worker, lease_deadline_ms=record.lease_deadline_ms, dead_ms=record.dead_ms,
        dead_reason=record.dead_reason, terminal_ms=record.terminal_ms,
        history=tuple(
            AttemptView(attempt=a.attempt, token=a.token, worker_id=a.worker_id, leased_ms=a.leased_ms,
                        ended_ms=a.ended_ms, outcome=a.outcome, error_class=a.error_class, error_text=a.error_text)
            for a in record.history
        ) if with_history else (),
        version=record.version or 1, previous_id=record.previous_id, superseded_by=record.superseded_by,
    )  # fmt: skip


def get_message(view: KvRead, message_id: int, *, now_ms: int, with_history: bool = True) -> MessageView | None:
    record = messages.load(view, message_id)
    return None if record is None else view_of(view, record, now_ms, with_history)


def by_idempotency_keys(view: KvRead, keys_: Sequence[str], *, now_ms: int, with_history: bool) -> list[MessageView]:
    found: list[MessageView] = []
    for key in dict.fromkeys(keys_):
        record = messages.holder(view, key)
        if record is not None:
            found.append(view_of(view, record, now_ms, with_history))
    return found


def by_ref_key(view: KvRead, ref_key: str, *, now_ms: int, limit: int = REF_KEY_MESSAGES_MAX) -> list[MessageView]:
    """Every request of one business id, oldest first, each with its full attempt history."""
    assert 0 < limit <= REF_KEY_MESSAGES_MAX
    return [view_of(view, record, now_ms, True) for record in messages.by_ref(view, ref_key, limit)]


def dead_letter_ids(view: KvRead, selected: DeadLetterFilter, *, limit: int, after: tuple[int, int] | None = None) -> list[int]:
    assert 0 < limit <= PAGE_LIMIT_MAX
    return tier.ids(view, selected, limit=limit, after=after)


def _parse_cursor(cursor: str) -> tuple[int, int]:
    dead_ms, _, message_id = cursor.partition(".")
    if not (dead_ms.isdigit() and message_id.isdigit()):
        raise ValueError(f"bad dead-letter cursor {cursor!r}")
    return int(dead_ms), int(message_id)


def dead_letters(
    view: KvRead, selected: DeadLetterFilter, *, now_ms: int, cursor: str | None = None, limit: int = 100
) -> DeadLetterPage:
    """A page of dead letters, oldest first. The cursor is the last (dead_ms, id) returned."""
    assert 0 < limit <= PAGE_LIMIT_MAX
    after = None if cursor is None else _parse_cursor(cursor)
    found = tier.ids(view, selected, limit=limit + 1, after=after)
    items = []
    for message_id in found[:limit]:
        record = messages.load(view, message_id)
        assert record is not None
        items.append(view_of(view, record, now_ms, True))
    next_cursor = None
    if len(found) > limit:
        last = items[-1]
        next_cursor = f"{last.dead_ms}.{last.message_id}"
    return DeadLetterPage(items=tuple(items), next_cursor=next_cursor)


def kinds(view: KvRead) -> list[KindView]:
    """Every registered kind (at most KINDS_MAX), its policy and its pauses, by name."""
    pauses: dict[str, list[PauseView]] = {}
    for key, value in view.scan(Table.PAUSES):
        kind, _, holder = key.partition(b"\x00")
        row = pause_decoder.decode(value)
        pauses.setdefault(kind.decode(), []).append(PauseView(holder=holder.decode(), reason=row.reason, since_ms=row.since_ms))
    return [
        KindView(kind=key.decode(), policy=_policy_decoder.decode(value), pauses=tuple(pauses.get(key.decode(), ())))
        for key, value in view.scan(Table.KINDS)
    ]


def message_events(view: KvRead, message_ids: Sequence[int]) -> list[Event]:
    """The operator events of these messages (OPERATOR_EVENT_TYPES), in log order."""
    seqs: list[int] = []
    for message_id in dict.fromkeys(message_ids):
        prefix = keys.u64(message_id)
        seqs.extend(keys.u64_of(key, 8) for key, _ in view.scan(Table.OPERATOR_EVENTS, prefix, keys.after(prefix)))
    found = []
    for seq in sorted(seqs):
        stored = view.get(Table.EVENTS, keys.u64(seq))
        if stored is not None:
            found.append(_event(seq, stored))
    return found


def _event(seq: int, stored: bytes) -> Event:
    row = event_decoder.decode(stored)
    return Event(seq=seq, log_index=row.log_index, ts_ms=row.ts_ms, type=EventType(row.type),
                 message_id=row.message_id, kind=row.kind, data=codec.decode_event_data(row.data))  # fmt: skip


def counts(view: KvRead, *, now_ms: int) -> list[KindStateCount]:
    """Messages per (kind, state), sorted; zero counts are left out. Every stored phase comes from
    the replicated counts (O(kinds)); the waiting messages of a kind split into ready (a scan of
    the due index up to now: O(ready)) and delayed (the rest)."""
    found: dict[tuple[str, State], int] = {}
    for key, value in view.scan(Table.PHASE_COUNTS):
        kind, phase = key[:-2].decode(), Phase(key[-1])
        count = int_decoder.decode(value)
        if phase is Phase.WAITING:
            ready = sum(1 for _ in messages.due(view, kind, now_ms))
            found[(kind, State.READY)] = ready
            found[(kind, State.DELAYED)] = count - ready
        else:
            found[(kind, state_of(phase, 0, now_ms))] = count
    return [
        KindStateCount(kind=kind, state=state, count=count)
        for (kind, state), count in sorted(found.items(), key=lambda item: (item[0][0], item[0][1].value))
        if count
    ]


def dead_letter_summary(view: KvRead, selected: DeadLetterFilter) -> DeadLetterSummary:
    """How many dead letters match, their amounts per currency and the oldest (queues.core.dead_letters)."""
    return tier.summary(view, selected)


def kind_names(view: KvRead) -> list[str]:
    """The registered kinds, by name."""
    return [key.decode() for key, _ in view.scan(Table.KINDS)]


def oldest_due_age_ms(view: KvRead, *, now_ms: int) -> dict[str, int]:
    """Per kind with ready messages: how long its oldest ready message has been due (lateness)."""
    ages: dict[str, int] = {}
    for kind in kind_names(view):
        oldest = messages.oldest_due(view, kind, now_ms)
        if oldest is not None:
            ages[kind] = now_ms - oldest
    return ages


def work_due(view: KvRead, wanted_kinds: Sequence[str], *, now_ms: int) -> WorkDueView:
    """Which kinds asked (all when none) have a message ready (the oldest's due time), the next due
    time after now among the unpaused ones, and each paused kind's holders: O(kinds) probes."""
    paused: dict[str, list[str]] = {}
    for key, _ in view.scan(Table.PAUSES):
        held, _, holder = key.partition(b"\x00")
        paused.setdefault(held.decode(), []).append(holder.decode())
    wanted = [kind for kind in kind_names(view) if not wanted_kinds or kind in wanted_kinds]
    ready: dict[str, int] = {}
    paused_ready: list[str] = []
    next_due: int | None = None
    for kind in wanted:
        oldest = messages.oldest_due(view, kind, now_ms)
        if kind in paused:
            if oldest is not None:
                paused_ready.append(kind)
            continue
        if oldest is not None:
            ready[kind] = oldest
        later = messages.next_due(view, kind, now_ms)
        if later is not None and (next_due is None or later < next_due):
            next_due = later
    return WorkDueView(
        ready=ready, next_due_ms=next_due, paused={k: tuple(v) for k, v in paused.items() if k in wanted},
        paused_ready=tuple(paused_ready),
    )  # fmt: skip


def maintenance_due(view: KvRead) -> tuple[int | None, int | None, int | None]:
    """(earliest lease deadline, earliest tombstone purge time, oldest event's time): one key each."""
    oldest = None
    for _, value in view.scan(Table.EVENTS):
        oldest = event_decoder.decode(value).ts_ms
        break
    return messages.first_key_time(view, Table.LEASES), messages.first_key_time(view, Table.PURGE), oldest


def retention(view: KvRead, config: QueueConfig) -> tuple[int, int]:
    return retention_in_force(view, config)


def first_event_seq(view: KvRead) -> int:
    """The oldest event still kept, or the next to be written when none is: a reader whose last
    seq is below this minus one has missed events that Purge deleted past their retention."""
    for key, _ in view.scan(Table.EVENTS):
        return keys.u64_of(key)
    return load_meta(view).next_event_seq


def last_event_seq(view: KvRead) -> int:
    """The newest event written (0 when none ever was), purged or not."""
    return load_meta(view).next_event_seq - 1


def events_after(view: KvRead, seq: int, *, limit: int = 1000) -> list[Event]:
    """The events with a sequence number above `seq`, in order: what a projection tails."""
    assert 0 < limit <= PAGE_LIMIT_MAX * 10
    found = []
    for key, value in view.scan(Table.EVENTS, keys.u64(seq + 1)):
        found.append(_event(keys.u64_of(key), value))
        if len(found) == limit:
            break
    return found


def events_digest(view: KvRead, after: int, through: int) -> tuple[int, bytes]:
    """(count, 16-byte BLAKE2b) of the events with seq in (after, through], exactly as stored:
    every field, the event data as its stored bytes, so two replicas agree on a range only if they
    wrote the same events there (the same digest as the SQL store's, field for field)."""
    rows = []
    for key, value in view.scan(Table.EVENTS, keys.u64(after + 1), keys.u64(through + 1)):
        row = event_decoder.decode(value)
        rows.append((keys.u64_of(key), row.log_index, row.ts_ms, row.type, row.message_id, row.kind, row.data))
    return len(rows), hashlib.blake2b(_digest_encoder.encode(rows), digest_size=16).digest()


def last_message_id(view: KvRead) -> int:
    return load_meta(view).next_message_id - 1


def scrub_payloads(view: KvRead, after: int, through: int) -> tuple[int, list[int]]:
    """(messages checked, ids whose payload no longer matches their content hash) for ids in
    (after, through]. A message whose payload is missing counts as corrupt too, and so does an
    edited payload that no longer matches the hash stored with the edit."""
    checked = 0
    corrupt: list[int] = []
    for key, value in view.scan(Table.MESSAGES, keys.u64(after + 1), keys.u64(through + 1)):
        record = message_decoder.decode(value)
        checked += 1
        body = view.get(Table.BODIES, key)
        intact = body is not None and content_hash(record.kind, record.ref_key, body) == record.content_hash
        if intact and record.edited and record.edited_hash is not None:
            edited = view.get(Table.EDITED, key)
            intact = edited is not None and content_hash(record.kind, record.ref_key, edited) == record.edited_hash
        if not intact:
            corrupt.append(record.id)
    return checked, corrupt
