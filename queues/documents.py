"""Settings documents: small JSON documents operators change at runtime, replicated like
everything else (a circuit breaker's mode, a downstream's classification table).

Why in the store: every worker must act on the same version (a classification that differed
between workers would retry a permanent error on one and dead-letter it on another), a change must
survive the loss of any node, and each change is an event with who made it, why, and the
document before and after. The store does not interpret a body (it is the owner's schema: the
API validates it before proposing); it keeps at most DOCUMENTS_MAX per namespace and a version per
namespace that readers poll, as the token cache does (queues/access.py).

Must never: read a clock, or accept a body that is not a JSON object of at most DOCUMENT_BYTES_MAX.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from typing import Any, Final

import msgspec

from queues.model import (
    DOCUMENT_BYTES_MAX,
    Code,
    DocumentResult,
    DocumentView,
    EventType,
    EventValue,
    PutDocument,
    QueueResult,
)

DOCUMENTS_MAX: Final = 1000
EVENT_BODY_CHARS_MAX: Final = 2048
"""A document's before and after go into its event whole up to this size; larger ones by hash."""

Emit = Callable[[EventType, int, str, dict[str, EventValue]], None]

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS documents (
        namespace TEXT NOT NULL, name TEXT NOT NULL, body BLOB NOT NULL, updated_ms INTEGER NOT NULL,
        updated_by TEXT NOT NULL, PRIMARY KEY (namespace, name)) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS document_versions (namespace TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID",
)


def create_tables(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


def version(conn: sqlite3.Connection, namespace: str) -> int:
    row = conn.execute("SELECT version FROM document_versions WHERE namespace = ?", (namespace,)).fetchone()
    return 0 if row is None else int(row[0])


def documents(conn: sqlite3.Connection, namespace: str) -> list[DocumentView]:
    rows = conn.execute(
        "SELECT name, body, updated_ms, updated_by FROM documents WHERE namespace = ? ORDER BY name LIMIT ?",
        (namespace, DOCUMENTS_MAX),
    ).fetchall()
    return [DocumentView(name=r[0], body=bytes(r[1]), updated_ms=r[2], updated_by=r[3]) for r in rows]


def _for_event(body: bytes | None) -> str | None:
    if body is None:
        return None
    if len(body) <= EVENT_BODY_CHARS_MAX:
        return body.decode()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def put(conn: sqlite3.Connection, now_ms: int, command: PutDocument, emit: Emit) -> QueueResult:
    """Replace (or, with no body, delete) one document; the namespace's version moves on."""
    if command.body is not None and not _json_object(command.body):
        return DocumentResult(code=Code.INVALID, version=version(conn, command.namespace))
    row = conn.execute(
        "SELECT body FROM documents WHERE namespace = ? AND name = ?", (command.namespace, command.name)
    ).fetchone()
    before = None if row is None else bytes(row[0])
    if command.body is None:
        conn.execute("DELETE FROM documents WHERE namespace = ? AND name = ?", (command.namespace, command.name))
    else:
        if before is None:
            (count,) = conn.execute("SELECT count(*) FROM documents WHERE namespace = ?", (command.namespace,)).fetchone()
            if count >= DOCUMENTS_MAX:
                return DocumentResult(code=Code.INVALID, version=version(conn, command.namespace))
        conn.execute(
            "INSERT INTO documents (namespace, name, body, updated_ms, updated_by) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (namespace, name) DO UPDATE SET body = excluded.body, updated_ms = excluded.updated_ms,"
            " updated_by = excluded.updated_by",
            (command.namespace, command.name, command.body, now_ms, command.actor),
        )
    conn.execute(
        "INSERT INTO document_versions (namespace, version) VALUES (?, 1)"
        " ON CONFLICT (namespace) DO UPDATE SET version = version + 1",
        (command.namespace,),
    )
    emit(
        EventType.DOCUMENT_PUT, 0, "",
        {"namespace": command.namespace, "name": command.name, "actor": command.actor, "reason": command.reason,
         "before": _for_event(before), "after": _for_event(command.body)},
    )  # fmt: skip
    return DocumentResult(code=Code.OK, version=version(conn, command.namespace))


def _json_object(body: bytes) -> bool:
    try:
        decoded: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(decoded, dict) and len(body) <= DOCUMENT_BYTES_MAX
