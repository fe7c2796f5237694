"""The canonical state: every replicated value as plain rows in a fixed order, whatever the store.

Two replicas (or a store before and after a migration, or this core and the SQL machine it
replaced) hold the same state exactly when their canonical states are equal. The rows are those
the SQL store had, column for column (tests/queues/equivalence/record.py writes the same from an
old store), so a log applied by either gives the same digest. Derived indexes (due times, leases,
the dead tier and its aggregates, purge times, ref keys, the audit's indexes) are not in it: they
follow from these rows, and `check_indexes` says whether they do.

Must never: write.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from queues.core import keys
from queues.core.entry import load_meta
from queues.core.port import KvRead, Table
from queues.core.records import (
    MessageRecord,
    audit_decoder,
    document_decoder,
    event_decoder,
    int_decoder,
    job_decoder,
    job_item_decoder,
    message_decoder,
    pause_decoder,
    proposal_decoder,
    session_decoder,
    token_decoder,
)

_encoder: Final = msgspec.msgpack.Encoder()


def _message_row(view: KvRead, record: MessageRecord) -> list[Any]:
    key = keys.u64(record.id)
    edited = view.get(Table.EDITED, key) if record.edited else None
    return [
        record.id, record.kind, record.idempotency_key, record.ref_key, record.content_hash, edited, record.headers,
        record.created_ms, int(record.phase), record.due_ms, record.attempts, record.budget_attempts,
        record.budget_start_ms, record.last_error_class, record.last_error_text, record.token, int(record.token_open),
        record.lease_worker, record.lease_deadline_ms, record.dead_ms, record.dead_reason, record.dead_error_class,
        record.terminal_ms, record.purge_ms, record.request_id, record.edited_hash, record.version,
        record.previous_id, record.superseded_by, record.in_doubt_until_ms, view.get(Table.BODIES, key),
    ]  # fmt: skip


def canonical_state(view: KvRead) -> dict[str, Any]:
    meta = load_meta(view)
    records = [message_decoder.decode(value) for _, value in view.scan(Table.MESSAGES)]
    idempotency = []
    for record in records:
        holder = view.get(Table.KEYS, keys.key_hash(record.idempotency_key))
        if holder == keys.u64(record.id):
            idempotency.append([record.idempotency_key, record.id])
    events = []
    for key, value in view.scan(Table.EVENTS):
        row = event_decoder.decode(value)
        events.append([keys.u64_of(key), row.log_index, row.ts_ms, row.type, row.message_id, row.kind, row.data])
    phase_counts = []
    for key, value in view.scan(Table.PHASE_COUNTS):
        phase_counts.append([key[:-2].decode(), key[-1], int_decoder.decode(value)])
    pauses = []
    for key, value in view.scan(Table.PAUSES):
        kind, _, holder_name = key.partition(b"\x00")
        pause = pause_decoder.decode(value)
        pauses.append([kind.decode(), holder_name.decode(), pause.reason, pause.since_ms])
    tokens = []
    for key, value in view.scan(Table.TOKENS):
        t = token_decoder.decode(value)
        tokens.append([key.decode(), t.role, t.secret_hash, t.created_ms, t.created_by, t.revoked_ms, t.rate_per_s, t.burst])
    documents = []
    for key, value in view.scan(Table.DOCUMENTS):
        namespace, _, name = key.partition(b"\x00")
        d = document_decoder.decode(value)
        documents.append([namespace.decode(), name.decode(), d.body, d.updated_ms, d.updated_by])
    audit = []
    for key, value in view.scan(Table.AUDIT):
        a = audit_decoder.decode(value)
        audit.append([keys.u64_of(key), a.log_index, a.ts_ms, a.actor, a.action, a.target, a.reason, a.before,
                      a.after, a.prev_hash, a.hash])  # fmt: skip
    proposals = []
    for key, value in view.scan(Table.PROPOSALS):
        p = proposal_decoder.decode(value)
        proposals.append([keys.u64_of(key), p.action, p.body, p.proposer, p.reason, p.targets, p.created_ms,
                          p.expires_ms, p.state, p.decided_by, p.decided_ms, p.decision_reason])  # fmt: skip
    jobs = []
    for key, value in view.scan(Table.JOBS):
        j = job_decoder.decode(value)
        jobs.append([keys.u64_of(key), j.actor, j.reason, j.proposal_id, j.approved_by, j.state, j.rate_per_s,
                     j.created_ms, j.last_step_ms, j.finished_ms, j.rate_base, j.controlled_by, j.total, j.pending,
                     j.redriven, j.refused, j.not_redriven])  # fmt: skip
    state: dict[str, Any] = {
        "applied_index": meta.applied_index,
        "meta": [meta.next_message_id, meta.next_token, meta.next_event_seq, meta.rr_offset, meta.clock_ms],
        "messages": [_message_row(view, record) for record in records],
        "attempts": [
            [r.id, a.attempt, a.token, a.worker_id, a.leased_ms, a.ended_ms, a.outcome, a.error_class, a.error_text]
            for r in records for a in r.history
        ],
        "idempotency": sorted(idempotency, key=lambda row: row[0].encode()),
        "events": events,
        "kinds": [[key.decode(), value] for key, value in view.scan(Table.KINDS)],
        "settings": [[key.decode(), int_decoder.decode(value)] for key, value in view.scan(Table.SETTINGS)],
        "phase_counts": phase_counts,
        "pauses": pauses,
        "tokens": tokens,
        "access_version": meta.access_version,
        "documents": documents,
        "document_versions": [[k.decode(), int_decoder.decode(v)] for k, v in view.scan(Table.DOCUMENT_VERSIONS)],
        "audit": audit,
        "audit_messages": [list(keys.pair_of(key)) for key, _ in view.scan(Table.AUDIT_MESSAGES)],
        "audit_head": [meta.audit_count, meta.audit_head],
        "proposals": proposals,
        "jobs": jobs,
        "job_items": [
            [*keys.pair_of(key), row.result, row.code, row.done_ms]
            for key, row in ((k, job_item_decoder.decode(v)) for k, v in view.scan(Table.JOB_ITEMS))
        ],
        "sessions": [
            [keys.u64_of(key), row.seq, row.result, row.touched_index]
            for key, row in ((k, session_decoder.decode(v)) for k, v in view.scan(Table.SESSIONS))
        ],
    }
    groups = [[key, value] for key, value in view.scan(Table.JOB_GROUPS)]
    if groups:  # a state without any (every state before groups existed) digests as it did
        state["job_groups"] = groups
    return state


def state_digest(view: KvRead) -> bytes:
    """A 16-byte digest of the canonical state."""
    return hashlib.blake2b(_encoder.encode(canonical_state(view)), digest_size=16).digest()


def store_digest(view: KvRead) -> bytes:
    """A 16-byte digest of every key and value of every table, derived indexes included: two
    replicas of one log hold the same bytes in every table (the simulator compares them so)."""
    digest = hashlib.blake2b(digest_size=16)
    for table in Table:
        digest.update(table.value.to_bytes(1, "big"))
        for key, value in view.scan(table):
            digest.update(len(key).to_bytes(4, "big"))
            digest.update(key)
            digest.update(len(value).to_bytes(4, "big"))
            digest.update(value)
    return digest.digest()
