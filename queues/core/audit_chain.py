"""The operator audit log: an append-only hash chain of every operator action, in the replicated state.

Why here: an action and its record must never part. Each entry is written by the same replicated
command that performs the action, inside the same apply: a redrive without its entry, or an entry
without its redrive, cannot exist on any replica, before or after a crash. Every replica applies
the same commands with the same leader time, so every replica computes the same entries and hashes.

Why a chain: entries are kept forever (never purged, unlike events), and a person with write
access to one replica's files could change one. Each entry's hash covers the previous entry's
hash, so changing, removing or inserting an entry breaks every link after it; `verify` recomputes
the chain and names the first entry that does not hold, and the head (the count and the last hash,
in the state's counters) shows entries cut off the end. What it cannot see is a rewrite of the
whole chain and its head on one replica: the other replicas' heads are the anchor
(`compensator audit verify` compares them).

The hash of entry n is SHA-256 of the UTF-8 bytes of the JSON array

    [seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash_hex]

written with no spaces (`separators=(",", ":")`, `ensure_ascii=False`), where `before` and
`after` are the stored canonical JSON strings (keys sorted, no spaces) and `prev_hash_hex` is
the previous entry's hash in lower-case hex (64 zeros for the first entry, seq 1).

Owns: the AUDIT table and its indexes (by message, actor, action and target), appending, filtered
reading and verifying. Must never: read a clock, or delete or update an entry.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from queues.audit_filter import AuditFilter
from queues.core import keys
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import AuditRow, Meta, audit_decoder, encode, meta_decoder
from queues.model import AuditEntry, EventType, EventValue, State

GENESIS: Final = bytes(32)
"""The previous hash of the first entry."""
AUDIT_PAGE_MAX: Final = 1000

Detail = dict[str, EventValue]


def canonical_json(value: Detail) -> str:
    """Keys sorted, no spaces, non-ASCII kept: one text for one value, on every replica."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def entry_hash(
    *, seq: int, log_index: int, ts_ms: int, actor: str, action: str, target: str, reason: str, before: str,
    after: str, prev_hash: bytes,
) -> bytes:  # fmt: skip
    """The hash of one entry over its fields and the previous entry's hash (the module docstring
    gives the encoding, so anyone can recompute it without this code)."""
    fields = [seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash.hex()]
    encoded = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(encoded).digest()


# ---- an operator event as an entry ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AuditFields:
    actor: str
    action: str
    target: str
    reason: str
    before: Detail
    after: Detail


_AFTER_STATE: Final = {EventType.REDRIVEN: State.READY.value, EventType.DISCARDED: State.DISCARDED.value}
_NOT_DETAIL: Final = frozenset({"actor", "reason"})


def _target(type_: EventType, message_id: int, kind: str, data: Detail) -> str:
    if message_id:
        return f"message:{message_id}"
    if type_ in (EventType.TOKEN_PUT, EventType.TOKEN_REVOKED, EventType.QUOTA_SET):
        return f"token:{data.get('name')}"
    if type_ is EventType.DOCUMENT_PUT:
        return f"document:{data.get('namespace')}/{data.get('name')}"
    if kind:
        return f"kind:{kind}"
    if type_ is EventType.ROUTE_FENCED:
        return "route_epoch"
    return "retention" if type_ is EventType.RETENTION_SET else type_.value


def audit_of_event(type_: EventType, message_id: int, kind: str, data: Detail) -> AuditFields:
    """An operator event as an audit entry: `actor` and `reason` as they are; `from_state`, `before`
    and every `<name>_before` go to before (as `state`, `body` and `<name>`), the rest to after."""
    before: Detail = {}
    after: Detail = {}
    for name, value in data.items():
        if name in _NOT_DETAIL:
            continue
        if name == "from_state":
            before["state"] = value
        elif name == "before":
            before["body"] = value
        elif name == "after":
            after["body"] = value
        elif name.endswith("_before"):
            before[name.removesuffix("_before")] = value
        else:
            after[name] = value
    if type_ in _AFTER_STATE:
        after["state"] = _AFTER_STATE[type_]
    actor = str(data.get("actor") or "system")
    return AuditFields(actor, type_.value, _target(type_, message_id, kind, data), str(data.get("reason") or ""),
                       before, after)  # fmt: skip


# ---- appending ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Head:
    count: int
    """Entries written (the last seq)."""
    hash: bytes
    """The last entry's hash (GENESIS when there is none)."""


def head(view: KvRead) -> Head:
    stored = view.get(Table.META, keys.STATE)
    meta = Meta() if stored is None else meta_decoder.decode(stored)
    return Head(meta.audit_count, meta.audit_head)


def append(
    tx: KvWrite, meta: Meta, *, log_index: int, ts_ms: int, actor: str, action: str, target: str, reason: str,
    before: Detail, after: Detail, message_ids: Sequence[int] = (),
) -> int:  # fmt: skip
    """Write the next entry (inside the apply of the command that performs the action), index it
    under each message it concerns, its actor, action and target, and move the head in `meta`
    (written with the entry's counters). Returns its seq."""
    seq = meta.audit_count + 1
    before_text, after_text = canonical_json(before), canonical_json(after)
    digest = entry_hash(
        seq=seq, log_index=log_index, ts_ms=ts_ms, actor=actor, action=action, target=target, reason=reason,
        before=before_text, after=after_text, prev_hash=meta.audit_head,
    )  # fmt: skip
    row = AuditRow(log_index, ts_ms, actor, action, target, reason, before_text, after_text, meta.audit_head, digest)
    key = keys.u64(seq)
    tx.put(Table.AUDIT, key, encode(row), append=True)
    for message_id in sorted(set(message_ids)):
        tx.put(Table.AUDIT_MESSAGES, keys.pair(message_id, seq), b"")
    tx.put(Table.AUDIT_ACTORS, keys.text(actor) + key, b"")
    tx.put(Table.AUDIT_ACTIONS, keys.text(action) + key, b"")
    tx.put(Table.AUDIT_TARGETS, keys.text(target) + key, b"")
    meta.audit_count, meta.audit_head = seq, digest
    return seq


# ---- reading ------------------------------------------------------------------------------------------
def _entry(seq: int, row: AuditRow) -> AuditEntry:
    return AuditEntry(
        seq=seq, log_index=row.log_index, ts_ms=row.ts_ms, actor=row.actor, action=row.action, target=row.target,
        reason=row.reason, before=row.before, after=row.after, prev_hash=row.prev_hash, hash=row.hash,
    )  # fmt: skip


def _row(view: KvRead, seq: int) -> AuditRow | None:
    stored = view.get(Table.AUDIT, keys.u64(seq))
    return None if stored is None else audit_decoder.decode(stored)


def _seqs(view: KvRead, table: Table, prefix: bytes, bound: int, *, reverse: bool) -> Iterator[int]:
    """Seqs indexed under `prefix` above `bound` (ascending), or below it (descending)."""
    size = len(prefix)
    if reverse:
        rows = view.scan(table, prefix, prefix + keys.u64(bound), reverse=True)
    else:
        rows = view.scan(table, prefix + keys.u64(bound + 1), keys.after(prefix))
    return (keys.u64_of(key, size) for key, _ in rows)


def driver(selected: AuditFilter | None) -> str:
    """The index a page of this filter is read through (the others' fields are checked per entry)."""
    if selected is not None:
        for field, index in (("message_id", "by message"), ("target", "by target"), ("actor", "by actor")):
            if getattr(selected, field) is not None:
                return index
        if selected.actions:
            return "by action"
    return "the chain, newest first"


def _candidates(view: KvRead, selected: AuditFilter | None, bound: int, *, reverse: bool) -> Iterator[int]:
    """The seqs a filter may select, in page order, through its most selective index."""
    if selected is not None:
        if selected.message_id is not None:
            return _seqs(view, Table.AUDIT_MESSAGES, keys.u64(selected.message_id), bound, reverse=reverse)
        if selected.target is not None:
            return _seqs(view, Table.AUDIT_TARGETS, keys.text(selected.target), bound, reverse=reverse)
        if selected.actor is not None:
            return _seqs(view, Table.AUDIT_ACTORS, keys.text(selected.actor), bound, reverse=reverse)
        if selected.actions:
            streams = [_seqs(view, Table.AUDIT_ACTIONS, keys.text(a), bound, reverse=reverse) for a in set(selected.actions)]
            return heapq.merge(*streams, reverse=reverse)
    if reverse:
        return (keys.u64_of(key) for key, _ in view.scan(Table.AUDIT, b"", keys.u64(bound), reverse=True))
    return (keys.u64_of(key) for key, _ in view.scan(Table.AUDIT, keys.u64(bound + 1)))


def _selects(view: KvRead, selected: AuditFilter, seq: int, row: AuditRow) -> bool:
    if selected.actor is not None and row.actor != selected.actor:
        return False
    if selected.target is not None and row.target != selected.target:
        return False
    if selected.from_ms is not None and row.ts_ms < selected.from_ms:
        return False
    if selected.to_ms is not None and row.ts_ms >= selected.to_ms:
        return False
    if selected.actions and row.action not in selected.actions:
        return False
    if selected.target_prefix is not None and not row.target.startswith(selected.target_prefix):
        return False
    if any(row.target.startswith(prefix) for prefix in selected.exclude_target_prefixes):
        return False
    return selected.message_id is None or view.get(Table.AUDIT_MESSAGES, keys.pair(selected.message_id, seq)) is not None


def _first_at(view: KvRead, ts_ms: int) -> int:
    """The first seq whose entry is at or after `ts_ms` (count + 1 if none): a bisection, since an
    entry's time never goes below the one before it (log time never goes backwards)."""
    low, high = 1, head(view).count + 1
    while low < high:
        middle = (low + high) // 2
        row = _row(view, middle)
        assert row is not None, f"audit entry {middle} is missing"
        if row.ts_ms < ts_ms:
            low = middle + 1
        else:
            high = middle
    return low


def _page(view: KvRead, selected: AuditFilter | None, bound: int, limit: int, *, reverse: bool) -> list[AuditEntry]:
    if selected is not None and reverse and selected.to_ms is not None:
        bound = min(bound, _first_at(view, selected.to_ms))
    if selected is not None and not reverse and selected.from_ms is not None:
        bound = max(bound, _first_at(view, selected.from_ms) - 1)
    found: list[AuditEntry] = []
    for seq in _candidates(view, selected, bound, reverse=reverse):
        row = _row(view, seq)
        assert row is not None, f"audit index names entry {seq}, which is not there"
        if selected is not None and _past(selected, row, reverse=reverse):
            break
        if selected is None or _selects(view, selected, seq, row):
            found.append(_entry(seq, row))
            if len(found) == limit:
                break
    return found


def _past(selected: AuditFilter, row: AuditRow, *, reverse: bool) -> bool:
    """The page has walked out of the filter's time range: every entry further on is outside it too."""
    if reverse:
        return selected.from_ms is not None and row.ts_ms < selected.from_ms
    return selected.to_ms is not None and row.ts_ms >= selected.to_ms


def entries_after(
    view: KvRead, seq: int, *, limit: int = AUDIT_PAGE_MAX, selected: AuditFilter | None = None
) -> list[AuditEntry]:
    """Entries with seq above `seq` that the filter selects, oldest first: a verifier pages forward
    with this (unfiltered)."""
    assert 0 < limit <= AUDIT_PAGE_MAX
    return _page(view, selected, seq, limit, reverse=False)


def entries_before(
    view: KvRead, seq: int | None, *, limit: int = AUDIT_PAGE_MAX, selected: AuditFilter | None = None
) -> list[AuditEntry]:
    """Entries with seq below `seq` (None: the newest) that the filter selects, newest first: the
    global view's pages, which pass the last seq shown back as `seq`."""
    assert 0 < limit <= AUDIT_PAGE_MAX
    return _page(view, selected, seq if seq is not None else keys.U64_MAX, limit, reverse=True)


def message_index(view: KvRead, message_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(seq, message id) of every entry indexed under these messages, in chain order: which of
    them each entry concerns (an edit concerns both versions, a proposal each of its targets)."""
    found: list[tuple[int, int]] = []
    for message_id in sorted(set(message_ids)):
        prefix = keys.u64(message_id)
        found.extend((keys.u64_of(key, 8), message_id) for key, _ in view.scan(Table.AUDIT_MESSAGES, prefix, keys.after(prefix)))
    return sorted(found)


def entries_at(view: KvRead, seqs: Sequence[int]) -> list[AuditEntry]:
    """The entries with these seqs, in chain order."""
    found: list[AuditEntry] = []
    for seq in sorted(set(seqs)):
        row = _row(view, seq)
        if row is not None:
            found.append(_entry(seq, row))
    return found


def message_entries(view: KvRead, message_ids: Sequence[int]) -> list[AuditEntry]:
    """Every entry that concerns these messages, in chain order: a request's timeline."""
    return entries_at(view, [seq for seq, _ in message_index(view, message_ids)])


# ---- verification ---------------------------------------------------------------------------------
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


def verify(view: KvRead, *, page: int = AUDIT_PAGE_MAX) -> tuple[int, Broken | None]:
    """(entries checked, the first break or None) for the chain in this store."""
    verifier = ChainVerifier()
    after = 0
    while verifier.broken is None:
        entries = entries_after(view, after, limit=page)
        if not entries:
            break
        verifier.feed(entries)
        after = entries[-1].seq
    return verifier.count, verifier.finish(head(view))
