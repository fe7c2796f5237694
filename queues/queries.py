"""Read-only queries over the queue's tables.

Owns: the views the API, the workers' long-poll and the projections read: a message by id, every
message of a business id (ref key) with its attempt history, dead letters with filters and cursor
pagination, counts per kind and state, the oldest due age per kind (the lateness metric), the
event log after a sequence number, and the registered kinds.

Must never: write, or be called inside an apply with another meaning than the machine's (the
machine uses `dead_letter_ids` to resolve a redrive filter, inside its transaction). Time is the
caller's `now_ms` (for "delayed" versus "ready"), never a clock read here.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from delay.policy import RetryPolicy
from queues import codec, due_index
from queues.model import (
    OPERATOR_EVENT_TYPES,
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
TABLE: Final = "messages"

_MESSAGE_COLUMNS: Final = (
    "id, kind, idempotency_key, ref_key, (SELECT payload FROM bodies WHERE bodies.id = messages.id),"
    " edited_payload, headers, created_ms, phase, due_ms,"
    " attempts, last_error_class, last_error_text, token, lease_worker, lease_deadline_ms, dead_ms,"
    " dead_reason, terminal_ms, version, previous_id, superseded_by"
)

_policy_decoder: Final = msgspec.msgpack.Decoder(RetryPolicy)
_OPERATOR_EVENT_NAMES: Final = ", ".join(f"'{t.value}'" for t in OPERATOR_EVENT_TYPES)


class DeadLetterPage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[MessageView, ...]
    next_cursor: str | None
    """Pass back to get the next page; None on the last page. Stable while new letters arrive."""


class KindStateCount(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    state: State
    count: int


def _history(conn: sqlite3.Connection, message_id: int) -> tuple[AttemptView, ...]:
    rows = conn.execute(
        "SELECT attempt, token, worker_id, leased_ms, ended_ms, outcome, error_class, error_text"
        " FROM attempts WHERE message_id = ? ORDER BY attempt",
        (message_id,),
    ).fetchall()
    return tuple(
        AttemptView(
            attempt=r[0],
            token=r[1],
            worker_id=r[2],
            leased_ms=r[3],
            ended_ms=r[4],
            outcome=r[5],
            error_class=r[6],
            error_text=r[7],
        )
        for r in rows
    )


def _view(conn: sqlite3.Connection, row: tuple[Any, ...], now_ms: int, with_history: bool) -> MessageView:
    r = row
    message_id = int(r[0])
    return MessageView(
        message_id=message_id,
        kind=r[1],
        idempotency_key=r[2],
        ref_key=r[3],
        payload=r[4],
        edited_payload=r[5],
        headers=codec.decode_headers(r[6]),
        created_ms=r[7],
        state=state_of(Phase(r[8]), r[9], now_ms),
        due_ms=r[9],
        attempts=r[10],
        last_error_class=r[11],
        last_error_text=r[12],
        token=r[13],
        lease_worker=r[14],
        lease_deadline_ms=r[15],
        dead_ms=r[16],
        dead_reason=r[17],
        terminal_ms=r[18],
        history=_history(conn, message_id) if with_history else (),
        version=int(r[19] or 1),
        previous_id=r[20],
        superseded_by=r[21],
    )


def get_message(
    conn: sqlite3.Connection, message_id: int, *, now_ms: int, with_history: bool = True
) -> MessageView | None:
    row = conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
    return None if row is None else _view(conn, row, now_ms, with_history)


def by_ref_key(
    conn: sqlite3.Connection, ref_key: str, *, now_ms: int, limit: int = REF_KEY_MESSAGES_MAX
) -> list[MessageView]:
    """Every request of one business id, oldest first, each with its full attempt history."""
    assert 0 < limit <= REF_KEY_MESSAGES_MAX
    rows = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE ref_key = ? ORDER BY id LIMIT ?", (ref_key, limit)
    ).fetchall()
    return [_view(conn, row, now_ms, True) for row in rows]


_PAYLOAD_TEXT: Final = (
    "SELECT id AS dead_id, dead_ms AS dead_at, CAST(coalesce(edited_payload, (SELECT payload FROM bodies WHERE bodies.id = messages.id)) AS TEXT)"
    " AS payload_text"
)
"""The current payload (the edited one, if any) as text: CAST, because newer SQLites read a BLOB
given to their JSON functions as JSONB."""
_MONEY: Final = (
    "SELECT *, iif(json_valid(payload_text), json_extract(payload_text, '$.amount_minor', '$.currency'), NULL)"
    " AS money"
)
"""`[amount_minor, currency]` as a JSON array, NULL when the payload is not JSON: one parse for both."""
_AMOUNT_CURRENCY: Final = (
    "SELECT *, iif(typeof(json_extract(money, '$[0]')) = 'integer', json_extract(money, '$[0]'), NULL) AS amount,"
    " iif(typeof(json_extract(money, '$[1]')) = 'text', json_extract(money, '$[1]'), NULL) AS currency"
)


def _money_clauses(dead_filter: DeadLetterFilter) -> list[tuple[str, object]]:
    return [
        ("currency = ?", dead_filter.currency),
        ("amount >= ?", dead_filter.amount_min_minor),
        ("amount <= ?", dead_filter.amount_max_minor),
    ]


def _money_filtered(dead_filter: DeadLetterFilter) -> bool:
    return any(value is not None for _, value in _money_clauses(dead_filter))


def _where(first: str, clauses: list[tuple[str, object]]) -> tuple[str, list[object]]:
    """`first` and each clause whose value is set, ANDed, with the values as parameters."""
    given = [(clause, value) for clause, value in clauses if value is not None]
    return " AND ".join([first, *(clause for clause, _ in given)]), [value for _, value in given]


def _dead_where(dead_filter: DeadLetterFilter, after: tuple[int, int] | None) -> tuple[str, list[object]]:
    """The clauses of a filter that the message row answers (amount and currency: `_money_clauses`)."""
    where, params = _where(f"phase = {int(Phase.DEAD)}", [
        ("kind = ?", dead_filter.kind),
        ("dead_error_class = ?", dead_filter.error_class),
        ("ref_key = ?", dead_filter.ref_key),
        ("dead_ms >= ?", dead_filter.dead_from_ms),
        ("dead_ms < ?", dead_filter.dead_to_ms),
        ("attempts >= ?", dead_filter.attempts_min),
        ("attempts <= ?", dead_filter.attempts_max),
    ])  # fmt: skip
    if after is None:
        return where, params
    return f"{where} AND (dead_ms, id) > (?, ?)", [*params, *after]


def _dead_select(
    columns: str, dead_filter: DeadLetterFilter, after: tuple[int, int] | None, *, joined: bool = True
) -> tuple[str, list[object]]:
    """`SELECT columns` over the dead letters matching the filter, in (dead_ms, id) order, as a
    statement and its parameters. Not `joined`, the statement is over the dead letters' `dead_id`,
    `dead_at`, `amount` and `currency` (the current payload's) alone, and `columns` name only those.

    The payload is parsed once per dead letter the other clauses leave: each step is a subquery of
    its own, kept apart by `LIMIT -1` (SQLite does not flatten a subquery with a LIMIT into an
    outer one, and would otherwise repeat the read and the parse at every use of its column: three
    times slower, measured). SQLite runs them as co-routines that yield rows in the innermost
    ORDER BY's order, which the pages, the redrive filter and the tests rely on; an outer ORDER BY
    would sort the whole match set for every page."""
    where, params = _dead_where(dead_filter, after)
    if joined and not _money_filtered(dead_filter):
        return f"SELECT {columns} FROM messages WHERE {where} ORDER BY dead_ms, id", params
    money_where, money_params = _where("1", _money_clauses(dead_filter))
    inner = f"{_PAYLOAD_TEXT} FROM messages INDEXED BY messages_dead WHERE {where} ORDER BY dead_ms, id LIMIT -1"
    layered = f"{_AMOUNT_CURRENCY} FROM ({_MONEY} FROM ({inner}) LIMIT -1) LIMIT -1"
    if not joined:
        return f"SELECT {columns} FROM ({layered}) WHERE {money_where}", [*params, *money_params]
    # CROSS JOIN: SQLite keeps the left side as the outer loop, so the rows stay in its order.
    statement = f"SELECT {columns} FROM ({layered}) CROSS JOIN messages ON messages.id = dead_id WHERE {money_where}"
    return statement, [*params, *money_params]


def dead_letter_ids(
    conn: sqlite3.Connection,
    dead_filter: DeadLetterFilter,
    *,
    limit: int,
    after: tuple[int, int] | None = None,
) -> list[int]:
    """Ids of dead letters matching the filter, ordered by (dead_ms, id): deterministic."""
    assert 0 < limit <= PAGE_LIMIT_MAX
    statement, params = _dead_select("id", dead_filter, after)
    rows = conn.execute(f"{statement} LIMIT ?", (*params, limit)).fetchall()
    return [int(row[0]) for row in rows]


def _parse_cursor(cursor: str) -> tuple[int, int]:
    dead_ms, _, message_id = cursor.partition(".")
    if not (dead_ms.isdigit() and message_id.isdigit()):
        raise ValueError(f"bad dead-letter cursor {cursor!r}")
    return int(dead_ms), int(message_id)


def dead_letters(
    conn: sqlite3.Connection,
    dead_filter: DeadLetterFilter,
    *,
    now_ms: int,
    cursor: str | None = None,
    limit: int = 100,
) -> DeadLetterPage:
    """A page of dead letters, oldest first. The cursor is the last (dead_ms, id) returned."""
    assert 0 < limit <= PAGE_LIMIT_MAX
    after = None if cursor is None else _parse_cursor(cursor)
    statement, params = _dead_select(_MESSAGE_COLUMNS, dead_filter, after)
    rows = conn.execute(f"{statement} LIMIT ?", (*params, limit + 1)).fetchall()
    items = tuple(_view(conn, row, now_ms, True) for row in rows[:limit])
    next_cursor = None
    if len(rows) > limit:
        last = items[-1]
        next_cursor = f"{last.dead_ms}.{last.message_id}"
    return DeadLetterPage(items=items, next_cursor=next_cursor)


def kinds(conn: sqlite3.Connection) -> list[KindView]:
    """Every registered kind (at most KINDS_MAX), its policy and its pauses, by name."""
    pauses: dict[str, list[PauseView]] = {}
    for kind, holder, reason, since_ms in conn.execute(
        "SELECT kind, holder, reason, since_ms FROM kind_pauses ORDER BY kind, holder"
    ):
        pauses.setdefault(kind, []).append(PauseView(holder=holder, reason=reason, since_ms=since_ms))
    return [
        KindView(kind=kind, policy=_policy_decoder.decode(policy), pauses=tuple(pauses.get(kind, ())))
        for kind, policy in conn.execute("SELECT kind, policy FROM kinds ORDER BY kind")
    ]


def message_events(conn: sqlite3.Connection, message_ids: Sequence[int]) -> list[Event]:
    """The operator events of these messages (OPERATOR_EVENT_TYPES), in log order, through the
    partial index `events_operator` (the query repeats its predicate so the planner can use it)."""
    ids = list(dict.fromkeys(message_ids))
    found: list[Event] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        rows = conn.execute(
            "SELECT seq, log_index, ts_ms, type, message_id, kind, data FROM events"
            f" WHERE message_id IN ({','.join('?' * len(chunk))}) AND type IN ({_OPERATOR_EVENT_NAMES})",
            chunk,
        ).fetchall()
        found.extend(_event_of(row) for row in rows)
    return sorted(found, key=lambda event: event.seq)


def _event_of(r: Any) -> Event:
    return Event(
        seq=r[0], log_index=r[1], ts_ms=r[2], type=EventType(r[3]), message_id=r[4], kind=r[5],
        data=codec.decode_event_data(r[6]),
    )  # fmt: skip


def counts(conn: sqlite3.Connection, *, now_ms: int) -> list[KindStateCount]:
    """Messages per (kind, state), sorted; zero counts are left out.

    Every stored phase comes from the replicated `phase_counts` table (O(kinds)); the waiting
    messages of a kind split into ready (one range count on the due index: O(ready)) and delayed
    (the rest), so a dashboard can ask this of a store with ten million delayed messages.
    """
    found: dict[tuple[str, State], int] = {}
    waiting: dict[str, int] = {}
    for kind, phase, count in conn.execute("SELECT kind, phase, count FROM phase_counts WHERE count != 0"):
        if phase == int(Phase.WAITING):
            waiting[kind] = int(count)
        else:
            found[(kind, state_of(Phase(phase), 0, now_ms))] = int(count)
    for kind, total in waiting.items():
        ready = due_index.count_ready(conn, TABLE, kind=kind, now_ms=now_ms)
        found[(kind, State.READY)] = ready
        found[(kind, State.DELAYED)] = total - ready
    return [
        KindStateCount(kind=kind, state=state, count=count)
        for (kind, state), count in sorted(found.items(), key=lambda item: (item[0][0], item[0][1].value))
        if count
    ]


def oldest_due_age_ms(conn: sqlite3.Connection, *, now_ms: int) -> dict[str, int]:
    """Per kind with ready messages: how long its oldest ready message has been due (lateness)."""
    ages: dict[str, int] = {}
    for view in kinds(conn):
        oldest = due_index.oldest_due_ms(conn, TABLE, kind=view.kind, now_ms=now_ms)
        if oldest is not None:
            ages[view.kind] = now_ms - oldest
    return ages


class WorkDueView(msgspec.Struct, frozen=True, kw_only=True):
    ready: dict[str, int]
    next_due_ms: int | None
    paused: dict[str, tuple[str, ...]]
    paused_ready: tuple[str, ...]


def work_due(conn: sqlite3.Connection, kinds: Sequence[str], *, now_ms: int) -> WorkDueView:
    """Which kinds asked (all when none) have a message ready (the oldest's due time), the next due
    time after now among the unpaused ones, and each paused kind's holders: index probes, O(kinds)."""
    paused: dict[str, list[str]] = {}
    for kind, holder in conn.execute("SELECT kind, holder FROM kind_pauses ORDER BY kind, holder"):
        paused.setdefault(kind, []).append(holder)
    registered = [row[0] for row in conn.execute("SELECT kind FROM kinds ORDER BY kind")]
    wanted = [kind for kind in registered if not kinds or kind in kinds]
    ready: dict[str, int] = {}
    paused_ready: list[str] = []
    next_due: int | None = None
    for kind in wanted:
        oldest = due_index.oldest_due_ms(conn, TABLE, kind=kind, now_ms=now_ms)
        if kind in paused:
            if oldest is not None:
                paused_ready.append(kind)
            continue
        if oldest is not None:
            ready[kind] = oldest
        later = due_index.next_due_ms(conn, TABLE, kind=kind, now_ms=now_ms)
        if later is not None and (next_due is None or later < next_due):
            next_due = later
    return WorkDueView(
        ready=ready, next_due_ms=next_due, paused={k: tuple(v) for k, v in paused.items() if k in wanted},
        paused_ready=tuple(paused_ready),
    )  # fmt: skip


def maintenance_due(conn: sqlite3.Connection) -> tuple[int | None, int | None, int | None]:
    """(earliest lease deadline, earliest tombstone purge time, oldest event's time): one probe each."""
    deadline = conn.execute(
        f"SELECT min(lease_deadline_ms) FROM {TABLE} INDEXED BY {TABLE}_lease_deadline WHERE phase = {int(Phase.LEASED)}"
    ).fetchone()[0]
    purge = conn.execute(
        f"SELECT min(purge_ms) FROM {TABLE} INDEXED BY {TABLE}_purge WHERE purge_ms IS NOT NULL"
    ).fetchone()[0]
    oldest = conn.execute("SELECT ts_ms FROM events ORDER BY seq LIMIT 1").fetchone()
    return deadline, purge, None if oldest is None else int(oldest[0])


def retention_in_force(conn: sqlite3.Connection, *, retention_ms: int, event_retention_ms: int) -> tuple[int, int]:
    """(tombstone retention, event retention) in force: SetRetention's values, else the defaults given."""
    stored = dict(conn.execute("SELECT name, value FROM settings").fetchall())
    return (
        int(stored.get("retention_ms", retention_ms)),
        int(stored.get("event_retention_ms", event_retention_ms)),
    )


def first_event_seq(conn: sqlite3.Connection) -> int:
    """The oldest event still kept, or the next to be written when none is: a reader whose last
    seq is below this minus one has missed events that Purge deleted past their retention."""
    row = conn.execute("SELECT min(seq) FROM events").fetchone()
    if row[0] is not None:
        return int(row[0])
    return int(conn.execute("SELECT next_event_seq FROM queue_meta WHERE id = 0").fetchone()[0])


_digest_encoder: Final = msgspec.msgpack.Encoder()


def events_digest(conn: sqlite3.Connection, after: int, through: int) -> tuple[int, bytes]:
    """(count, 16-byte BLAKE2b) of the events with seq in (after, through], exactly as stored.

    Every column is covered, the event data as its stored bytes, so two replicas agree on a
    range only if they wrote the same events there."""
    rows = conn.execute(
        "SELECT seq, log_index, ts_ms, type, message_id, kind, data FROM events WHERE seq > ? AND seq <= ? ORDER BY seq",
        (after, through),
    ).fetchall()
    return len(rows), hashlib.blake2b(_digest_encoder.encode(rows), digest_size=16).digest()


def last_event_seq(conn: sqlite3.Connection) -> int:
    """The newest event written (0 when none ever was), purged or not."""
    return int(conn.execute("SELECT next_event_seq FROM queue_meta WHERE id = 0").fetchone()[0]) - 1


def scrub_payloads(conn: sqlite3.Connection, after: int, through: int) -> tuple[int, list[int]]:
    """(messages checked, ids whose payload no longer matches their content hash) for ids in
    (after, through]. A message whose payload row is missing counts as corrupt too, and so does an
    edited payload that no longer matches the hash stored with the edit."""
    rows = conn.execute(
        "SELECT m.id, m.kind, m.ref_key, m.content_hash, b.payload, m.edited_payload, m.edited_hash"
        " FROM messages m LEFT JOIN bodies b ON b.id = m.id WHERE m.id > ? AND m.id <= ? ORDER BY m.id",
        (after, through),
    ).fetchall()
    corrupt = [int(r[0]) for r in rows if not _payloads_intact(r)]
    return len(rows), corrupt


def _payloads_intact(row: Any) -> bool:
    kind, ref_key = str(row[1]), str(row[2])
    if row[4] is None or content_hash(kind, ref_key, bytes(row[4])) != bytes(row[3]):
        return False
    # An edit written before edits stored their hash has none: nothing to check it against.
    return row[5] is None or row[6] is None or content_hash(kind, ref_key, bytes(row[5])) == bytes(row[6])


def last_message_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT next_message_id FROM queue_meta WHERE id = 0").fetchone()[0]) - 1


def events_after(conn: sqlite3.Connection, seq: int, *, limit: int = 1000) -> list[Event]:
    """The events with a sequence number above `seq`, in order: what a projection tails."""
    assert 0 < limit <= PAGE_LIMIT_MAX * 10
    rows = conn.execute(
        "SELECT seq, log_index, ts_ms, type, message_id, kind, data FROM events"
        " WHERE seq > ? ORDER BY seq LIMIT ?",
        (seq, limit),
    ).fetchall()
    return [_event_of(r) for r in rows]


def dead_letter_summary(conn: sqlite3.Connection, dead_filter: DeadLetterFilter) -> DeadLetterSummary:
    """How many dead letters match, their amounts per currency and the oldest: one aggregate over
    the dead index (each payload parsed once) and, when any matched, one probe of that index for
    the oldest's id, so finance can size a redrive of 10,000s before proposing it.

    A match counts under its currency when its payload has both an integer amount and a currency,
    else in `without_amount`. Totals are summed in two parts (whole billions and the rest), so no
    sum of many large amounts can overflow SQLite's 64-bit integers; Python joins them exactly."""
    statement, params = _dead_select("amount, currency, dead_at AS dead_ms", dead_filter, None, joined=False)
    counted = "amount IS NOT NULL AND currency IS NOT NULL"
    rows = conn.execute(
        f"SELECT iif({counted}, currency, NULL) AS cur, count(*), sum(iif({counted}, amount / 1000000000, 0)),"
        f" sum(iif({counted}, amount % 1000000000, 0)), min(dead_ms) FROM ({statement}) GROUP BY cur ORDER BY cur",
        params,
    ).fetchall()
    by_currency: list[tuple[str, int, int]] = []
    count = without_amount = 0
    oldest_ms: int | None = None
    for currency, matched, billions, rest, dead_ms in rows:
        count += int(matched)
        if currency is None:
            without_amount = int(matched)
        else:
            by_currency.append((str(currency), int(matched), int(billions) * 1_000_000_000 + int(rest)))
        oldest_ms = int(dead_ms) if oldest_ms is None else min(oldest_ms, int(dead_ms))
    oldest_id = None
    if oldest_ms is not None:  # the first match at that time, by id: ties in dead_ms are common in a bulk failure
        (oldest_id,) = dead_letter_ids(conn, dead_filter, limit=1, after=(oldest_ms, 0))
    return DeadLetterSummary(
        count=count, by_currency=tuple(by_currency), without_amount=without_amount, oldest_dead_ms=oldest_ms,
        oldest_id=oldest_id,
    )  # fmt: skip
