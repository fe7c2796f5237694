"""The compensation ledger's side of the projector: each set's lock, its cursor, and one round's rows.

Exactly once by event seq, per set: a batch's rows and the cursor's move to its last seq commit in
one PostgreSQL transaction (a round: one batch of each set that had one, every cursor moved), which first reads the cursor under FOR UPDATE and refuses to write unless
it is where this projector left it. A crash anywhere before the commit leaves neither; after it,
both. One projector per set holds a session advisory lock on its connection (released by
PostgreSQL when the connection or the process dies): a standby waits on it and takes over from
the committed cursor, so a takeover leaves no gap and writes nothing twice. The FOR UPDATE check
makes this safe even if two ever ran (a lock lost with a connection, an operator's mistake): the
second to commit finds the cursor moved and stops.

A set whose batch cannot be written (its cursor moved by another, or events that change rows the
ledger does not have) fails the whole round's transaction with a `SetStopped` naming the set: the
runner stops that set and writes the round again without it, so nothing of a round half-applies.

Must never: write a row outside a round's transaction that also moves the cursor, or move the
cursor past an event it did not write.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

import asyncpg

from services.projector.rows import AttemptEnd, AttemptRow, BatchRows, RequestChange, RequestRow

LOCK_CLASS: Final = 0x70726A74
"""The first key of the projector's advisory lock ("prjt"); the second is the set id."""

_REQUEST_COLUMNS: Final = (
    "request_id", "set_id", "message_id", "kind", "idempotency_key", "ref_key", "amount_minor", "currency", "state",
    "created_at", "finished_at", "attempt_count", "updated_at", "event_seq",
)  # fmt: skip
_ATTEMPT_COLUMNS: Final = (
    "request_id", "attempt_number", "started_at", "ended_at", "outcome", "error_class", "downstream_status",
    "worker_id", "token", "latency_ms", "lateness_ms",
)  # fmt: skip
_UPDATE_REQUEST: Final = """
UPDATE compensation_requests SET
    state = COALESCE($3, state),
    finished_at = CASE WHEN $3::text IS NULL THEN finished_at ELSE $4 END,
    attempt_count = COALESCE($5, attempt_count),
    amount_minor = CASE WHEN $6 THEN $7 ELSE amount_minor END,
    currency = CASE WHEN $6 THEN $8 ELSE currency END,
    updated_at = $9,
    event_seq = $10
WHERE set_id = $1 AND message_id = $2"""
_END_ATTEMPT: Final = """
UPDATE compensation_attempts SET
    ended_at = $3,
    outcome = $4,
    error_class = COALESCE($5, error_class),
    downstream_status = COALESCE($6, downstream_status),
    latency_ms = GREATEST(0, (extract(epoch FROM ($3 - started_at)) * 1000)::bigint)
WHERE request_id = $1 AND attempt_number = $2"""


class SetStopped(RuntimeError):
    """What stops one set's projection (the other sets go on): a person has to look at that set."""

    def __init__(self, set_id: int, message: str) -> None:
        super().__init__(message)
        self.set_id = set_id


class CursorMoved(SetStopped):
    """Another projector wrote this set's ledger since this one read the cursor: stop."""


class LedgerMismatch(SetStopped):
    """An event changes a row the ledger does not have: the ledger and the log disagree."""


_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def timestamp(ms: int) -> dt.datetime:
    """The store's milliseconds as PostgreSQL's timestamptz, exactly (no float on the way)."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


async def try_lock(connection: asyncpg.Connection, set_id: int) -> bool:
    """Take the set's projector lock for this connection's session, if nobody holds it."""
    taken: bool = await connection.fetchval("SELECT pg_try_advisory_lock($1, $2)", LOCK_CLASS, set_id)
    return taken


async def lock_held(connection: asyncpg.Connection, set_id: int) -> bool:
    """Whether any session holds the set's projector lock now (`try_lock`'s two keys, as pg_locks
    shows a two-key advisory lock: classid, objid, objsubid 2)."""
    held: bool = await connection.fetchval(
        "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2",
        LOCK_CLASS, set_id,
    )  # fmt: skip
    return held


async def cursor(connection: asyncpg.Connection, set_id: int) -> int:
    """The set's last projected seq (0 for a set never projected: its cursor row is created)."""
    await connection.execute(
        "INSERT INTO projector_cursors (set_id, last_seq) VALUES ($1, 0) ON CONFLICT (set_id) DO NOTHING", set_id
    )
    last: int = await connection.fetchval("SELECT last_seq FROM projector_cursors WHERE set_id = $1", set_id)
    return last


@dataclasses.dataclass(frozen=True, slots=True)
class SetBatch:
    """One set's share of a round: the rows of its events (after, rows.last_seq]."""

    set_id: int
    after: int
    rows: BatchRows


async def write_batch(connection: asyncpg.Connection, *, set_id: int, after: int, rows: BatchRows, owner: str) -> None:
    """Write the rows of the events (after, rows.last_seq] and move the cursor there, in one transaction."""
    await write_round(connection, [SetBatch(set_id, after, rows)], owner=owner)


async def write_round(connection: asyncpg.Connection, batches: Sequence[SetBatch], *, owner: str) -> None:
    """Every set's batch and every set's cursor move, in one transaction: each set's cursor is read
    under FOR UPDATE and must be where this projector left it (else nothing of the round is
    written). Sets in id order, so two writers of overlapping sets lock their cursors alike."""
    ordered = sorted(batches, key=lambda b: b.set_id)
    async with connection.transaction():
        for batch in ordered:
            assert batch.rows.last_seq > batch.after
            current = await connection.fetchval(
                "SELECT last_seq FROM projector_cursors WHERE set_id = $1 FOR UPDATE", batch.set_id
            )
            if current != batch.after:
                raise CursorMoved(
                    batch.set_id,
                    f"set {batch.set_id}'s ledger cursor is at {current}, not at {batch.after} where this projector"
                    " left it: another projector wrote it",
                )
            await _check_targets(connection, batch.set_id, batch.rows)
        # One statement per table for the whole round, whatever the number of sets.
        requests = [_request_record(row) for b in ordered for row in b.rows.new_requests.values()]
        if requests:
            await connection.copy_records_to_table("compensation_requests", records=requests, columns=_REQUEST_COLUMNS)
        attempts = [_attempt_record(row) for b in ordered for row in b.rows.new_attempts.values()]
        if attempts:
            await connection.copy_records_to_table("compensation_attempts", records=attempts, columns=_ATTEMPT_COLUMNS)
        changes = [_change_args(b.set_id, c) for b in ordered for c in b.rows.changes.values()]
        if changes:
            await connection.executemany(_UPDATE_REQUEST, changes)
        ends = [_end_args(end) for b in ordered for end in b.rows.attempt_ends.values()]
        if ends:
            await connection.executemany(_END_ATTEMPT, ends)
        await connection.executemany(
            "UPDATE projector_cursors SET last_seq = $2, last_event_at = $3, updated_at = now(), owner = $4"
            " WHERE set_id = $1",
            [(b.set_id, b.rows.last_seq, timestamp(b.rows.last_ts_ms), owner) for b in ordered],
        )  # fmt: skip


async def mark_stopped(connection: asyncpg.Connection, set_id: int, reason: str | None) -> None:
    """Record in the set's cursor row why its projection stopped (None: it projects again), for
    `compensator status`. The cursor itself is not touched. A clear writes only a row that is marked
    (so it never waits on a cursor row another transaction holds, unless that row was stopped)."""
    if reason is None:
        await connection.execute(
            "UPDATE projector_cursors SET stopped_at = NULL, stopped_reason = NULL"
            " WHERE set_id = $1 AND stopped_reason IS NOT NULL",
            set_id,
        )  # fmt: skip
        return
    await connection.execute(
        "UPDATE projector_cursors SET stopped_at = now(), stopped_reason = $2 WHERE set_id = $1", set_id, reason
    )


async def rebuild(connection: asyncpg.Connection, set_id: int) -> int:
    """Delete the set's requests (and their attempts) and reset its cursor to 0, in one transaction;
    the projector then writes the ledger again from the log's first event. Returns rows deleted."""
    async with connection.transaction():
        await cursor(connection, set_id)
        await connection.execute("SELECT 1 FROM projector_cursors WHERE set_id = $1 FOR UPDATE", set_id)
        deleted = await connection.execute("DELETE FROM compensation_requests WHERE set_id = $1", set_id)
        await connection.execute(
            "UPDATE projector_cursors SET last_seq = 0, last_event_at = NULL, updated_at = now(), stopped_at = NULL,"
            " stopped_reason = NULL WHERE set_id = $1",
            set_id,
        )
    return int(deleted.split()[-1])


async def _check_targets(connection: asyncpg.Connection, set_id: int, rows: BatchRows) -> None:
    """Every request and attempt the batch changes (rather than creates) is in the ledger."""
    if rows.changes:
        found = await connection.fetch(
            "SELECT message_id FROM compensation_requests WHERE set_id = $1 AND message_id = ANY($2::bigint[])",
            set_id, list(rows.changes),
        )  # fmt: skip
        _missing("request", set(rows.changes) - {int(r[0]) for r in found}, set_id)
    if rows.attempt_ends:
        keys = [(end.request_id, end.attempt) for end in rows.attempt_ends.values()]
        found = await connection.fetch(
            "SELECT a.request_id, a.attempt_number FROM compensation_attempts a"
            " JOIN unnest($1::text[], $2::integer[]) AS k (request_id, attempt_number)"
            " USING (request_id, attempt_number)",
            [k[0] for k in keys], [k[1] for k in keys],
        )  # fmt: skip
        _missing("attempt", set(keys) - {(str(r[0]), int(r[1])) for r in found}, set_id)


def _missing(what: str, missing: set[Any], set_id: int) -> None:
    if missing:
        example = sorted(missing)[0]
        raise LedgerMismatch(
            set_id,
            f"set {set_id}: events change {len(missing)} {what}(s) the ledger does not have (e.g. {example}):"
            " the ledger lost rows behind its cursor; rebuild it (docs/ledger.md)",
        )


def _request_record(row: RequestRow) -> Sequence[Any]:
    money = row.money
    return (
        row.request_id, row.set_id, row.message_id, row.kind, row.idempotency_key, row.ref_key,
        None if money is None else money.amount_minor, None if money is None else money.currency, row.state.value,
        timestamp(row.created_ms), None if row.finished_ms is None else timestamp(row.finished_ms), row.attempt_count,
        timestamp(row.updated_ms), row.event_seq,
    )  # fmt: skip


def _attempt_record(row: AttemptRow) -> Sequence[Any]:
    ended = None if row.ended_ms is None else timestamp(row.ended_ms)
    latency = None if row.ended_ms is None else max(0, row.ended_ms - row.started_ms)
    return (
        row.request_id, row.attempt, timestamp(row.started_ms), ended, row.outcome.value, row.error_class, row.status,
        row.worker_id, row.token, latency, row.lateness_ms,
    )  # fmt: skip


def _change_args(set_id: int, change: RequestChange) -> Sequence[Any]:
    money = change.money
    finished = None if change.finished_ms is None else timestamp(change.finished_ms)
    return (
        set_id, change.message_id, None if change.state is None else change.state.value, finished,
        change.attempt_count, change.money_changed, None if money is None else money.amount_minor,
        None if money is None else money.currency, timestamp(change.updated_ms), change.event_seq,
    )  # fmt: skip


def _end_args(end: AttemptEnd) -> Sequence[Any]:
    return (end.request_id, end.attempt, timestamp(end.ended_ms), end.outcome.value, end.error_class, end.status)
