"""Converting a data directory of the SQL store (the layout before the LMDB store).

The old store is built here from the recorded log's final canonical state (tests/queues/equivalence:
the rows the SQL machine held after applying it), table for table as the SQL machine laid them out.
`python -m queues.migrate` must turn it into an LMDB store with the same canonical state that
answers every recorded query of that point with the same bytes, and whose derived indexes (due
times, leases, the dead tier and its aggregates, ref keys, the audit's indexes) work as if it had
applied the log itself.
"""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest
from test_store_equivalence import _digest

from queues.core.config import QueueConfig
from queues.replicated import DB_NAME, LEGACY_DB_NAME, ReplicatedQueueMachine, machine_factory
from queues.stores import StoreError

FIXTURE: Final = Path(__file__).parent / "equivalence" / "recorded.msgpack.gz"
T0: Final = 1_700_000_000_000

OLD_SCHEMA: Final = (
    """CREATE TABLE messages (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, idempotency_key TEXT NOT NULL,
        ref_key TEXT NOT NULL, content_hash BLOB NOT NULL, edited_payload BLOB, headers BLOB NOT NULL,
        created_ms INTEGER NOT NULL, phase INTEGER NOT NULL, due_ms INTEGER NOT NULL, attempts INTEGER NOT NULL,
        budget_attempts INTEGER NOT NULL, budget_start_ms INTEGER NOT NULL, last_error_class TEXT,
        last_error_text TEXT, token INTEGER NOT NULL, token_open INTEGER NOT NULL, lease_worker TEXT,
        lease_deadline_ms INTEGER, dead_ms INTEGER, dead_reason TEXT, dead_error_class TEXT, terminal_ms INTEGER,
        purge_ms INTEGER, request_id INTEGER, edited_hash BLOB, version INTEGER, previous_id INTEGER,
        superseded_by INTEGER, in_doubt_until_ms INTEGER)""",
    "CREATE TABLE bodies (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)",
    "CREATE TABLE idempotency (key TEXT PRIMARY KEY, message_id INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE attempts (message_id INTEGER NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,
        worker_id TEXT NOT NULL, leased_ms INTEGER NOT NULL, ended_ms INTEGER, outcome TEXT, error_class TEXT,
        error_text TEXT, PRIMARY KEY (message_id, attempt)) WITHOUT ROWID""",
    """CREATE TABLE events (seq INTEGER PRIMARY KEY, log_index INTEGER NOT NULL, ts_ms INTEGER NOT NULL,
        type TEXT NOT NULL, message_id INTEGER NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL)""",
    "CREATE TABLE kinds (kind TEXT PRIMARY KEY, policy BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE settings (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE phase_counts (kind TEXT NOT NULL, phase INTEGER NOT NULL, count INTEGER NOT NULL,
        PRIMARY KEY (kind, phase)) WITHOUT ROWID""",
    """CREATE TABLE kind_pauses (kind TEXT NOT NULL, holder TEXT NOT NULL, reason TEXT NOT NULL,
        since_ms INTEGER NOT NULL, PRIMARY KEY (kind, holder)) WITHOUT ROWID""",
    """CREATE TABLE queue_meta (id INTEGER PRIMARY KEY, next_message_id INTEGER NOT NULL, next_token INTEGER NOT NULL,
        next_event_seq INTEGER NOT NULL, rr_offset INTEGER NOT NULL, clock_ms INTEGER NOT NULL)""",
    """CREATE TABLE tokens (name TEXT PRIMARY KEY, role TEXT NOT NULL, secret_hash BLOB NOT NULL UNIQUE,
        created_ms INTEGER NOT NULL, created_by TEXT NOT NULL, revoked_ms INTEGER, rate_per_s INTEGER,
        burst INTEGER) WITHOUT ROWID""",
    "CREATE TABLE access_meta (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    """CREATE TABLE documents (namespace TEXT NOT NULL, name TEXT NOT NULL, body BLOB NOT NULL,
        updated_ms INTEGER NOT NULL, updated_by TEXT NOT NULL, PRIMARY KEY (namespace, name)) WITHOUT ROWID""",
    "CREATE TABLE document_versions (namespace TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE audit (seq INTEGER PRIMARY KEY, log_index INTEGER NOT NULL, ts_ms INTEGER NOT NULL,
        actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL, reason TEXT NOT NULL, before TEXT NOT NULL,
        after TEXT NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL)""",
    """CREATE TABLE audit_messages (message_id INTEGER NOT NULL, seq INTEGER NOT NULL,
        PRIMARY KEY (message_id, seq)) WITHOUT ROWID""",
    "CREATE TABLE audit_meta (id INTEGER PRIMARY KEY, count INTEGER NOT NULL, head BLOB NOT NULL)",
    """CREATE TABLE proposals (id INTEGER PRIMARY KEY, action TEXT NOT NULL, body BLOB NOT NULL,
        proposer TEXT NOT NULL, reason TEXT NOT NULL, targets BLOB NOT NULL, created_ms INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL, state TEXT NOT NULL, decided_by TEXT, decided_ms INTEGER, decision_reason TEXT)""",
    """CREATE TABLE jobs (id INTEGER PRIMARY KEY, actor TEXT NOT NULL, reason TEXT NOT NULL, proposal_id INTEGER,
        approved_by TEXT, state TEXT NOT NULL, rate_per_s INTEGER NOT NULL, created_ms INTEGER NOT NULL,
        last_step_ms INTEGER, finished_ms INTEGER, rate_base INTEGER NOT NULL, controlled_by TEXT,
        total INTEGER NOT NULL, pending INTEGER NOT NULL, redriven INTEGER NOT NULL, refused INTEGER NOT NULL,
        not_redriven INTEGER NOT NULL)""",
    """CREATE TABLE job_items (job_id INTEGER NOT NULL, message_id INTEGER NOT NULL, result TEXT NOT NULL,
        code TEXT NOT NULL, done_ms INTEGER, PRIMARY KEY (job_id, message_id)) WITHOUT ROWID""",
    "CREATE TABLE _raft_meta (id INTEGER PRIMARY KEY, applied_index INTEGER NOT NULL)",
    """CREATE TABLE _sessions (client_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, result BLOB NOT NULL,
        touched_index INTEGER NOT NULL)""",
)
_ROWS: Final = {  # canonical part -> the old table its rows are
    "attempts": "attempts", "idempotency": "idempotency", "events": "events", "kinds": "kinds",
    "settings": "settings", "phase_counts": "phase_counts", "pauses": "kind_pauses", "tokens": "tokens",
    "documents": "documents", "document_versions": "document_versions", "audit": "audit",
    "audit_messages": "audit_messages", "proposals": "proposals", "jobs": "jobs", "job_items": "job_items",
    "sessions": "_sessions",
}  # fmt: skip


def _final_check(log: dict[str, Any]) -> dict[str, Any]:
    check: dict[str, Any] = log["checks"][-1]
    assert check["after"] == len(log["entries"])
    return check


def old_store(path: Path, state: dict[str, Any], *, without_counts: bool = False) -> None:
    """The SQL machine's file for a canonical state, as that machine laid it out."""
    conn = sqlite3.connect(path)
    with conn:
        for statement in OLD_SCHEMA:
            conn.execute(statement)
        for row in state["messages"]:
            conn.execute(f"INSERT INTO messages VALUES ({','.join('?' * 30)})", row[:30])
            conn.execute("INSERT INTO bodies VALUES (?, ?)", (row[0], row[30]))
        for part, table in _ROWS.items():
            for row in state[part]:
                conn.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(row))})", row)
        conn.execute("INSERT INTO queue_meta VALUES (0, ?, ?, ?, ?, ?)", state["meta"])
        conn.execute("INSERT INTO access_meta VALUES (0, ?)", (state["access_version"],))
        conn.execute("INSERT INTO audit_meta VALUES (0, ?, ?)", state["audit_head"])
        conn.execute("INSERT INTO _raft_meta VALUES (0, ?)", (state["applied_index"],))
        if without_counts:  # a store from before the phase counters
            conn.execute("DROP TABLE phase_counts")
    conn.close()


def _config(log: dict[str, Any]) -> QueueConfig:
    retention_ms, event_retention_ms, floor_ms = log["config"]
    return QueueConfig(retention_ms=retention_ms, event_retention_ms=event_retention_ms, retention_floor_ms=floor_ms)


def _migrate(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queues.migrate", str(directory)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_a_converted_store_holds_and_answers_what_the_sql_store_did(tmp_path: Path) -> None:
    logs = msgspec.msgpack.decode(gzip.decompress(FIXTURE.read_bytes()))["logs"]
    for number, log in enumerate(logs[:3]):  # the scripted logs: every command, review and jobs
        check = _final_check(log)
        directory = tmp_path / f"node{number}"
        directory.mkdir()
        old_store(directory / LEGACY_DB_NAME, check["state"], without_counts=number == 1)
        with pytest.raises(StoreError, match=r"python -m queues\.migrate"):
            machine_factory(directory)  # a node started on it refuses, in one line naming the command
        done = _migrate(directory)
        assert done.returncode == 0, done.stderr
        assert "converted" in done.stdout and not (directory / LEGACY_DB_NAME).exists()
        assert (directory / (LEGACY_DB_NAME + ".migrated")).exists()
        machine = ReplicatedQueueMachine(str(directory / DB_NAME), _config(log), clock_ms=lambda: T0, threaded=False)
        try:
            state = msgspec.msgpack.decode(msgspec.msgpack.encode(machine.canonical()))
            for part, rows in check["state"].items():
                assert state[part] == rows, part
            for query, expected in check["queries"]:
                answer = machine.query(query)
                if len(expected) == 12:  # recorded as a digest
                    answer = _digest(answer)
                assert answer == expected, query
        finally:
            machine.close()


def test_the_command_refuses_in_one_line_and_changes_nothing(tmp_path: Path) -> None:
    empty = _migrate(tmp_path)
    assert empty.returncode == 1 and empty.stderr == f"queues.migrate: {tmp_path} holds no {LEGACY_DB_NAME} to convert\n"
    (tmp_path / LEGACY_DB_NAME).write_bytes(b"not a database at all, just bytes" * 200)
    broken = _migrate(tmp_path)
    assert broken.returncode == 1 and len(broken.stderr.splitlines()) == 1
    assert broken.stderr.startswith(f"queues.migrate: {tmp_path / LEGACY_DB_NAME} is not a queue store")
    assert not (tmp_path / DB_NAME).exists() and (tmp_path / LEGACY_DB_NAME).exists()
    (tmp_path / DB_NAME).write_bytes(b"")
    twice = _migrate(tmp_path)
    assert twice.returncode == 1 and "exists already" in twice.stderr
