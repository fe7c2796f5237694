"""Purge: tombstones past their retention leave the store, and events past theirs leave the log.

A done or discarded message is kept as a tombstone (its idempotency key answers a repeat) until
its `purge_ms`; a Purge, which the maintenance driver proposes, deletes the oldest that are due, up
to its limit, with their payloads, attempts and keys, and then the oldest events past the event
retention, a prefix of the log, so a reader's gap is always at its start. Run by the machine's
`_Apply` inside the entry's transaction, with the entry's time.

Must never: read a clock, delete a message that is not terminal, or delete an event that is not
in the log's prefix past its retention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queues.lifecycle import TERMINAL
from queues.model import EVENTS_PURGE_MAX, BatchResult, Code, EventType, Phase, Purge, state_of

if TYPE_CHECKING:
    from queues.machine import _Apply


def purge(apply: _Apply, command: Purge) -> BatchResult:
    rows = apply.conn.execute(
        "SELECT id, kind, idempotency_key, phase FROM messages INDEXED BY messages_purge"
        " WHERE purge_ms <= ? ORDER BY purge_ms, id LIMIT ?",
        (apply.now_ms, command.limit),
    ).fetchall()
    for message_id, kind, key, phase in rows:
        assert state_of(Phase(phase), 0, apply.now_ms) in TERMINAL
        apply.batch.move(kind, Phase(phase), None)
        apply.conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
        apply.conn.execute("DELETE FROM bodies WHERE id = ?", (message_id,))
        apply.conn.execute("DELETE FROM attempts WHERE message_id = ?", (message_id,))
        apply.conn.execute("DELETE FROM idempotency WHERE key = ? AND message_id = ?", (key, message_id))
        apply.emit(EventType.PURGED, message_id, kind, {})
    return BatchResult(code=Code.OK, ids=tuple(int(row[0]) for row in rows), events_purged=purge_events(apply))


def purge_events(apply: _Apply) -> int:
    """Delete the oldest events past their retention, at most EVENTS_PURGE_MAX: a prefix of the
    log, so a reader's gap is always at its start. O(EVENTS_PURGE_MAX): the stamped clock never
    goes backwards, so the events past their retention are the first ones by seq."""
    cutoff = apply.now_ms - apply.machine.retention(apply.conn)[1]
    last = None
    for seq, ts_ms in apply.conn.execute("SELECT seq, ts_ms FROM events ORDER BY seq LIMIT ?", (EVENTS_PURGE_MAX,)):
        if ts_ms > cutoff:
            break
        last = seq
    if last is None:
        return 0
    return int(apply.conn.execute("DELETE FROM events WHERE seq <= ?", (last,)).rowcount)
