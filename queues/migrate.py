"""Convert a node's SQL queue store (the layout before the LMDB store) into the LMDB store.

    python -m queues.migrate DATA_DIR

A node started on a data directory that still holds `queue.sqlite` and no `queue.lmdb` refuses in
one line that names this command (queues.replicated.machine_factory). The conversion reads every
replicated row of the old store (the rows `queues.core.canonical` describes), writes the same
values as the new store's records, and builds every derived index through the core's own index
rules (`queues.core.messages`), so the converted store holds exactly what a store that applied the
same log would: the same canonical state, and the same answers to every query
(tests/queues/test_migrate.py checks both on the recorded log's final state). It writes
`queue.lmdb.tmp`, syncs it, and renames it into place; the old file is kept, renamed
`queue.sqlite.migrated`, until an operator removes it. Run it with the node stopped.

Must never: change the old store, or leave a half-converted `queue.lmdb`.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from queues.core import keys, messages
from queues.core.config import QueueConfig
from queues.core.entry import Catalog, Entry
from queues.core.money import money_of
from queues.core.port import KvWrite, Table
from queues.core.records import (
    Attempt,
    AuditRow,
    DocumentRow,
    EventRow,
    JobItemRow,
    JobRow,
    MessageRecord,
    PauseRow,
    ProposalRow,
    SessionRow,
    TokenRow,
    encode,
)
from queues.model import OPERATOR_EVENT_TYPES, ItemResult, Phase
from queues.stores import StoreError
from queues.stores.lmdb_checkpoint import fsync_dir
from queues.stores.lmdb_store import LmdbStore

LEGACY: Final = "queue.sqlite"
TARGET: Final = "queue.lmdb"
_OPERATOR: Final = frozenset(t.value for t in OPERATOR_EVENT_TYPES)
_ACTIVE_JOBS: Final = frozenset({"running", "paused"})
_RESULT_BYTE: Final = {result.value: bytes((n,)) for n, result in enumerate(ItemResult)}
"""As queues.core.jobs keys JOB_ITEMS_BY_RESULT."""


class MigrationError(RuntimeError):
    """One line for the operator; nothing was changed."""


def _rows(conn: sqlite3.Connection, sql: str) -> Iterator[tuple[Any, ...]]:
    yield from conn.execute(sql)


def _message_records(conn: sqlite3.Connection) -> Iterator[tuple[MessageRecord, bytes, bytes | None]]:
    history: dict[int, list[Attempt]] = {}
    for row in _rows(conn, "SELECT * FROM attempts ORDER BY message_id, attempt"):
        history.setdefault(int(row[0]), []).append(Attempt(*row[1:]))
    columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    in_doubt = "in_doubt_until_ms" if "in_doubt_until_ms" in columns else "NULL"  # a store from before it: none
    for r in _rows(conn, (
        "SELECT m.id, kind, idempotency_key, ref_key, content_hash, edited_payload, headers, created_ms, phase,"
        " due_ms, attempts, budget_attempts, budget_start_ms, last_error_class, last_error_text, token, token_open,"
        " lease_worker, lease_deadline_ms, dead_ms, dead_reason, dead_error_class, terminal_ms, purge_ms,"
        f" request_id, edited_hash, version, previous_id, superseded_by, b.payload, {in_doubt}"
        " FROM messages m LEFT JOIN bodies b ON b.id = m.id ORDER BY m.id"
    )):  # fmt: skip
        if r[29] is None:
            raise MigrationError(f"message {r[0]} has no payload in the old store: repair it before converting")
        edited, body = (None if r[5] is None else bytes(r[5])), bytes(r[29])
        current = body if edited is None else edited
        phase = Phase(r[8])
        amount, currency = money_of(current) if phase is Phase.DEAD else (None, None)
        record = MessageRecord(
            id=r[0], kind=r[1], idempotency_key=r[2], ref_key=r[3], content_hash=bytes(r[4]), headers=bytes(r[6]),
            created_ms=r[7], phase=phase, due_ms=r[9], attempts=r[10], budget_attempts=r[11], budget_start_ms=r[12],
            token=r[15], token_open=bool(r[16]), payload_len=len(current), request_id=r[24], last_error_class=r[13],
            last_error_text=r[14], lease_worker=r[17], lease_deadline_ms=r[18], dead_ms=r[19], dead_reason=r[20],
            dead_error_class=r[21], terminal_ms=r[22], purge_ms=r[23], edited=edited is not None,
            edited_hash=None if r[25] is None else bytes(r[25]), version=r[26], previous_id=r[27],
            superseded_by=r[28], in_doubt_until_ms=r[30], amount=amount, currency=currency,
            history=tuple(history.get(int(r[0]), ())),
        )  # fmt: skip
        yield record, body, edited


def _messages(conn: sqlite3.Connection, entry: Entry) -> None:
    tx = entry.tx
    for record, body, edited in _message_records(conn):
        waiting = MessageRecord(
            id=record.id, kind=record.kind, idempotency_key=record.idempotency_key, ref_key=record.ref_key,
            content_hash=record.content_hash, headers=record.headers, created_ms=record.created_ms, phase=Phase.WAITING,
            due_ms=record.due_ms, attempts=0, budget_attempts=0, budget_start_ms=0, token=0, token_open=False,
            payload_len=0,
        )  # fmt: skip
        messages.insert(entry, waiting, body)
        messages.save(entry, waiting, record)
        if edited is not None:
            tx.put(Table.EDITED, keys.u64(record.id), edited)
    for key in [k for k, _ in tx.scan(Table.KEYS)]:
        tx.delete(Table.KEYS, key)
    for key, message_id in _rows(conn, "SELECT key, message_id FROM idempotency"):
        tx.put(Table.KEYS, keys.key_hash(key), keys.u64(message_id))


def _catalog(conn: sqlite3.Connection, tx: KvWrite) -> None:
    for kind, policy in _rows(conn, "SELECT kind, policy FROM kinds"):
        tx.put(Table.KINDS, kind.encode(), bytes(policy))
    for kind, holder, reason, since_ms in _rows(conn, "SELECT kind, holder, reason, since_ms FROM kind_pauses"):
        tx.put(Table.PAUSES, keys.kind_prefix(kind) + holder.encode(), encode(PauseRow(reason, since_ms)))
    for name, value in _rows(conn, "SELECT name, value FROM settings"):
        tx.put(Table.SETTINGS, name.encode(), encode(value))
    for name, role, secret, created_ms, created_by, revoked_ms, rate, burst in _rows(conn, (
        "SELECT name, role, secret_hash, created_ms, created_by, revoked_ms, rate_per_s, burst FROM tokens"
    )):  # fmt: skip
        tx.put(Table.TOKENS, name.encode(), encode(TokenRow(role, bytes(secret), created_ms, created_by, revoked_ms, rate, burst)))
        tx.put(Table.TOKEN_SECRETS, bytes(secret), name.encode())
    for namespace, name, body, updated_ms, updated_by in _rows(conn, "SELECT * FROM documents"):
        tx.put(Table.DOCUMENTS, keys.kind_prefix(namespace) + name.encode(), encode(DocumentRow(bytes(body), updated_ms, updated_by)))
    for namespace, version in _rows(conn, "SELECT namespace, version FROM document_versions"):
        tx.put(Table.DOCUMENT_VERSIONS, namespace.encode(), encode(version))


def _logs(conn: sqlite3.Connection, tx: KvWrite) -> None:
    for seq, log_index, ts_ms, type_, message_id, kind, data in _rows(conn, "SELECT * FROM events ORDER BY seq"):
        tx.put(Table.EVENTS, keys.u64(seq), encode(EventRow(log_index, ts_ms, type_, message_id, kind, bytes(data))))
        if type_ in _OPERATOR:
            tx.put(Table.OPERATOR_EVENTS, keys.pair(message_id, seq), b"")
    for row in _rows(conn, "SELECT * FROM audit ORDER BY seq"):
        key = keys.u64(int(row[0]))
        _, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash, digest = row
        tx.put(Table.AUDIT, key, encode(AuditRow(log_index, ts_ms, actor, action, target, reason, before, after,
                                                 bytes(prev_hash), bytes(digest))))  # fmt: skip
        tx.put(Table.AUDIT_ACTORS, keys.text(row[3]) + key, b"")
        tx.put(Table.AUDIT_ACTIONS, keys.text(row[4]) + key, b"")
        tx.put(Table.AUDIT_TARGETS, keys.text(row[5]) + key, b"")
    for message_id, seq in _rows(conn, "SELECT message_id, seq FROM audit_messages"):
        tx.put(Table.AUDIT_MESSAGES, keys.pair(message_id, seq), b"")


def _review(conn: sqlite3.Connection, tx: KvWrite) -> tuple[int, int]:
    last_proposal = last_job = 0
    for row in _rows(conn, "SELECT * FROM proposals ORDER BY id"):
        key = keys.u64(int(row[0]))
        tx.put(Table.PROPOSALS, key, encode(ProposalRow(row[1], bytes(row[2]), row[3], row[4], bytes(row[5]), *row[6:])))
        if row[8] == "pending":
            tx.put(Table.PROPOSALS_PENDING, key, encode(row[7]))
        last_proposal = int(row[0])
    for row in _rows(conn, (
        "SELECT id, actor, reason, proposal_id, approved_by, state, rate_per_s, created_ms, last_step_ms, finished_ms,"
        " rate_base, controlled_by, total, pending, redriven, refused, not_redriven FROM jobs ORDER BY id"
    )):  # fmt: skip
        key = keys.u64(int(row[0]))
        tx.put(Table.JOBS, key, encode(JobRow(*row[1:])))
        if row[5] in _ACTIVE_JOBS:
            tx.put(Table.JOBS_ACTIVE, key, b"")
        last_job = int(row[0])
    for job_id, message_id, result, code, done_ms in _rows(conn, "SELECT * FROM job_items"):
        tx.put(Table.JOB_ITEMS, keys.pair(job_id, message_id), encode(JobItemRow(result, code, done_ms)))
        tx.put(Table.JOB_ITEMS_BY_RESULT, keys.u64(job_id) + _RESULT_BYTE[result] + keys.u64(message_id), b"")
    for client_id, seq, result, touched in _rows(conn, "SELECT client_id, seq, result, touched_index FROM _sessions"):
        tx.put(Table.SESSIONS, keys.u64(client_id), encode(SessionRow(seq, bytes(result), touched)))
        tx.put(Table.SESSIONS_TOUCHED, keys.pair(touched, client_id), b"")
    return last_proposal, last_job


def convert(source: Path, target: Path, config: QueueConfig | None = None) -> int:
    """Write the LMDB store `target` from the SQL store `source`; returns its applied index."""
    try:
        conn = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
        (applied,) = conn.execute("SELECT applied_index FROM _raft_meta WHERE id = 0").fetchone()
        counters = conn.execute(
            "SELECT next_message_id, next_token, next_event_seq, rr_offset, clock_ms FROM queue_meta WHERE id = 0"
        ).fetchone()
    except sqlite3.Error as error:
        raise MigrationError(f"{source} is not a queue store of the SQL layout: {error}") from None
    store = LmdbStore(target)
    try:
        with store.write() as tx:
            entry = Entry(tx, int(applied), int(counters[4]), Catalog(config or QueueConfig()), responding=False)
            _catalog(conn, tx)
            _messages(conn, entry)
            _logs(conn, tx)
            last_proposal, last_job = _review(conn, tx)
            meta = entry.meta
            meta.next_message_id, meta.next_token, meta.next_event_seq, meta.rr_offset = (int(c) for c in counters[:4])
            meta.access_version = int(conn.execute("SELECT version FROM access_meta WHERE id = 0").fetchone()[0])
            count, head = conn.execute("SELECT count, head FROM audit_meta WHERE id = 0").fetchone()
            meta.audit_count, meta.audit_head = int(count), bytes(head)
            meta.next_proposal, meta.next_job = last_proposal + 1, last_job + 1
            entry.finish()
        store.sync()
    finally:
        store.close()
        conn.close()
    return int(applied)


def migrate(data_dir: Path) -> str:
    source, target = data_dir / LEGACY, data_dir / TARGET
    if not source.is_file():
        raise MigrationError(f"{data_dir} holds no {LEGACY} to convert")
    if target.exists():
        raise MigrationError(f"{target} exists already: move it aside to convert {source} again")
    tmp = data_dir / (TARGET + ".tmp")
    for leftover in (tmp, Path(f"{tmp}-lock"), Path(f"{tmp}-checkpoint"), Path(f"{tmp}-clean")):
        leftover.unlink(missing_ok=True)
    applied = convert(source, tmp)
    for suffix in ("-checkpoint", "-clean", ""):
        os.replace(f"{tmp}{suffix}", f"{target}{suffix}")
    Path(f"{tmp}-lock").unlink(missing_ok=True)
    os.replace(source, data_dir / (LEGACY + ".migrated"))
    fsync_dir(str(target))
    return f"{source} converted into {target} at applied index {applied}; the old file is {LEGACY}.migrated"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queues.migrate", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="the node's data directory (the node stopped)")
    args = parser.parse_args(argv)
    try:
        print(migrate(args.data_dir))
    except (MigrationError, StoreError, OSError) as error:
        print(f"queues.migrate: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
