"""The operator audit log: an append-only hash chain of every operator action, in the replicated state.

Why here: an action and its record must never part. Each entry is written by the same replicated
command that performs the action, inside the same apply and so the same SQLite transaction: a
redrive without its entry, or an entry without its redrive, cannot exist on any replica, before or
after a crash. Every replica applies the same commands with the same leader time, so every
replica computes the same entries and the same hashes.

Why a chain: entries are kept forever (never purged, unlike events), and a person with write
access to one replica's files could change one. Each entry's hash covers the previous entry's
hash, so changing, removing or inserting an entry breaks every link after it; `verify` recomputes
the chain and names the first entry that does not hold, and `audit_meta` holds the head (the
count and the last hash), so cutting entries off the end is seen too. What it cannot see is a
rewrite of the whole chain and its head on one replica: the other replicas' heads are the anchor
(`compensator audit verify` compares them).

The hash of entry n is SHA-256 of the UTF-8 bytes of the JSON array

    [seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash_hex]

written with no spaces (`separators=(",", ":")`, `ensure_ascii=False`), where `before` and
`after` are the stored canonical JSON strings (keys sorted, no spaces) and `prev_hash_hex` is
the previous entry's hash in lower-case hex (64 zeros for the first entry, seq 1).

Owns: the `audit`, `audit_messages` (message id -> entry, for a request's timeline) and
`audit_meta` tables, appending, reading and verifying. Must never: read a clock, or delete or
update an entry.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from queues.model import AuditEntry, AuditFilter, EventValue

GENESIS: Final = bytes(32)
"""The previous hash of the first entry."""
AUDIT_PAGE_MAX: Final = 1000

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS audit (
        seq INTEGER PRIMARY KEY, log_index INTEGER NOT NULL, ts_ms INTEGER NOT NULL, actor TEXT NOT NULL,
        action TEXT NOT NULL, target TEXT NOT NULL, reason TEXT NOT NULL, before TEXT NOT NULL,
        after TEXT NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS audit_messages (
        message_id INTEGER NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (message_id, seq)) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS audit_meta (id INTEGER PRIMARY KEY, count INTEGER NOT NULL, head BLOB NOT NULL)",
    "INSERT OR IGNORE INTO audit_meta VALUES (0, 0, zeroblob(32))",
)

_COLUMNS: Final = "seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash, hash"

Detail = dict[str, EventValue]


def create_tables(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


def canonical_json(value: Detail) -> str:
    """Keys sorted, no spaces, non-ASCII kept: one text for one value, on every replica."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def entry_hash(
    *,
    seq: int,
    log_index: int,
    ts_ms: int,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: str,
    after: str,
    prev_hash: bytes,
) -> bytes:
    """The hash of one entry over its fields and the previous entry's hash (the module docstring
    gives the encoding, so anyone can recompute it without this code)."""
    fields = [seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash.hex()]
    encoded = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(encoded).digest()


@dataclass(frozen=True, slots=True)
class Head:
    count: int
    """Entries written (the last seq)."""
    hash: bytes
    """The last entry's hash (GENESIS when there is none)."""


def head(conn: sqlite3.Connection) -> Head:
    count, head_hash = conn.execute("SELECT count, head FROM audit_meta WHERE id = 0").fetchone()
    return Head(int(count), bytes(head_hash))


def append(
    conn: sqlite3.Connection,
    *,
    log_index: int,
    ts_ms: int,
    actor: str,
    action: str,
    target: str,
    reason: str,
    before: Detail,
    after: Detail,
    message_ids: Sequence[int] = (),
) -> int:
    """Write the next entry (inside the apply of the command that performs the action) and index
    it under each message it concerns. Returns its seq."""
    current = head(conn)
    seq = current.count + 1
    before_text, after_text = canonical_json(before), canonical_json(after)
    digest = entry_hash(
        seq=seq, log_index=log_index, ts_ms=ts_ms, actor=actor, action=action, target=target, reason=reason,
        before=before_text, after=after_text, prev_hash=current.hash,
    )  # fmt: skip
    conn.execute(
        f"INSERT INTO audit ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (seq, log_index, ts_ms, actor, action, target, reason, before_text, after_text, current.hash, digest),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO audit_messages (message_id, seq) VALUES (?, ?)",
        [(message_id, seq) for message_id in sorted(set(message_ids))],
    )
    conn.execute("UPDATE audit_meta SET count = ?, head = ? WHERE id = 0", (seq, digest))
    return seq


def _entry(row: Any) -> AuditEntry:
    return AuditEntry(
        seq=int(row[0]), log_index=int(row[1]), ts_ms=int(row[2]), actor=row[3], action=row[4], target=row[5],
        reason=row[6], before=row[7], after=row[8], prev_hash=bytes(row[9]), hash=bytes(row[10]),
    )  # fmt: skip


def _selection(selected: AuditFilter | None) -> tuple[str, list[object]]:
    """The filter as SQL conditions (ANDed after the page's seq bound) and their parameters.

    Prefixes are compared with `substr`, not LIKE: a target holds `_` and `%` as plain characters."""
    if selected is None:
        return "", []
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (("actor = ?", selected.actor), ("target = ?", selected.target),
                          ("ts_ms >= ?", selected.from_ms), ("ts_ms < ?", selected.to_ms),
                          ("seq IN (SELECT seq FROM audit_messages WHERE message_id = ?)", selected.message_id)):  # fmt: skip
        if value is not None:
            clauses.append(clause)
            params.append(value)
    if selected.actions:
        clauses.append(f"action IN ({','.join('?' * len(selected.actions))})")
        params.extend(selected.actions)
    if selected.target_prefix is not None:
        clauses.append("substr(target, 1, ?) = ?")
        params.extend((len(selected.target_prefix), selected.target_prefix))
    for prefix in selected.exclude_target_prefixes:
        clauses.append("substr(target, 1, ?) != ?")
        params.extend((len(prefix), prefix))
    return "".join(f" AND {clause}" for clause in clauses), params


def entries_after(
    conn: sqlite3.Connection, seq: int, *, limit: int = AUDIT_PAGE_MAX, selected: AuditFilter | None = None
) -> list[AuditEntry]:
    """Entries with seq above `seq` that the filter selects, oldest first: a verifier pages forward
    with this (unfiltered)."""
    assert 0 < limit <= AUDIT_PAGE_MAX
    where, params = _selection(selected)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit WHERE seq > ?{where} ORDER BY seq LIMIT ?", (seq, *params, limit)
    )
    return [_entry(row) for row in rows]


def entries_before(
    conn: sqlite3.Connection, seq: int | None, *, limit: int = AUDIT_PAGE_MAX, selected: AuditFilter | None = None
) -> list[AuditEntry]:
    """Entries with seq below `seq` (None: the newest) that the filter selects, newest first: the
    global view's pages, which pass the last seq shown back as `seq`."""
    assert 0 < limit <= AUDIT_PAGE_MAX
    bound = seq if seq is not None else (1 << 62)
    where, params = _selection(selected)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit WHERE seq < ?{where} ORDER BY seq DESC LIMIT ?", (bound, *params, limit)
    )
    return [_entry(row) for row in rows]


def message_index(conn: sqlite3.Connection, message_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(seq, message id) of every entry indexed under these messages, in chain order: which of
    them each entry concerns (an edit concerns both versions, a proposal each of its targets)."""
    ids = sorted(set(message_ids))
    found: list[tuple[int, int]] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        rows = conn.execute(
            f"SELECT seq, message_id FROM audit_messages WHERE message_id IN ({','.join('?' * len(chunk))})", chunk
        )
        found.extend((int(seq), int(message_id)) for seq, message_id in rows)
    return sorted(found)


def entries_at(conn: sqlite3.Connection, seqs: Sequence[int]) -> list[AuditEntry]:
    """The entries with these seqs, in chain order."""
    ordered = sorted(set(seqs))
    found: list[AuditEntry] = []
    for start in range(0, len(ordered), 500):
        chunk = ordered[start : start + 500]
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM audit WHERE seq IN ({','.join('?' * len(chunk))}) ORDER BY seq", chunk
        )
        found.extend(_entry(row) for row in rows)
    return found


def message_entries(conn: sqlite3.Connection, message_ids: Sequence[int]) -> list[AuditEntry]:
    """Every entry that concerns these messages, in chain order: a request's timeline."""
    return entries_at(conn, [seq for seq, _ in message_index(conn, message_ids)])


# ---- verification -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Broken:
    """The first entry of a chain that does not hold, and how."""

    seq: int
    problem: str
    entry: AuditEntry | None = None

    def describe(self) -> str:
        if self.entry is None:
            return f"audit entry {self.seq}: {self.problem}"
        e = self.entry
        return f"audit entry {self.seq} ({e.action} of {e.target} by {e.actor} at ts_ms {e.ts_ms}): {self.problem}"


@dataclass(slots=True)
class ChainVerifier:
    """Feed entries in seq order (`feed`), then `finish` with the stored head: the first break,
    or None. Pages of a large chain go through one verifier, so nothing holds the whole chain."""

    count: int = 0
    last_hash: bytes = GENESIS
    broken: Broken | None = None

    def feed(self, entries: Iterable[AuditEntry]) -> Broken | None:
        for entry in entries:
            if self.broken is not None:
                break
            self.broken = self._check(entry)
            self.count = entry.seq
            self.last_hash = entry.hash
        return self.broken

    def _check(self, entry: AuditEntry) -> Broken | None:
        expected = self.count + 1
        if entry.seq != expected:
            return Broken(expected, f"missing: the chain goes from entry {self.count} to entry {entry.seq}")
        if entry.prev_hash != self.last_hash:
            return Broken(
                entry.seq,
                f"its previous hash {entry.prev_hash.hex()[:16]}... is not entry {self.count}'s hash"
                f" {self.last_hash.hex()[:16]}... (entry {self.count} or this link was altered)",
                entry,
            )
        recomputed = entry_hash(
            seq=entry.seq, log_index=entry.log_index, ts_ms=entry.ts_ms, actor=entry.actor, action=entry.action,
            target=entry.target, reason=entry.reason, before=entry.before, after=entry.after,
            prev_hash=entry.prev_hash,
        )  # fmt: skip
        if recomputed != entry.hash:
            return Broken(entry.seq, "its content does not match its hash (the entry was altered)", entry)
        return None

    def finish(self, stored: Head) -> Broken | None:
        """The break found, or a head that disagrees with the entries (entries cut off the end)."""
        if self.broken is not None:
            return self.broken
        if stored.count != self.count:
            return Broken(self.count + 1, f"missing: the head says {stored.count} entries, the chain has {self.count}")
        if stored.hash != self.last_hash:
            return Broken(
                self.count, "the head's hash is not the last entry's hash (the head or the entry was altered)"
            )
        return None


def verify(conn: sqlite3.Connection, *, page: int = AUDIT_PAGE_MAX) -> tuple[int, Broken | None]:
    """(entries checked, the first break or None) for the chain in this store."""
    verifier = ChainVerifier()
    after = 0
    while verifier.broken is None:
        entries = entries_after(conn, after, limit=page)
        if not entries:
            break
        verifier.feed(entries)
        after = entries[-1].seq
    return verifier.count, verifier.finish(head(conn))
