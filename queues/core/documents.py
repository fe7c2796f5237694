"""Settings documents: small JSON documents operators change at runtime, replicated like
everything else (a circuit breaker's mode, a downstream's classification table).

Why in the store: every worker must act on the same version (a classification that differed
between workers would retry a permanent error on one and dead-letter it on another), a change must
survive the loss of any node, and each change is an event with who made it, why, and the
document before and after. The store does not interpret a body (it is the owner's schema: the
API validates it before proposing); it keeps at most DOCUMENTS_MAX per namespace and a version per
namespace that readers poll, as the token cache does (queues.core.access).

Must never: read a clock, or accept a body that is not a JSON object of at most DOCUMENT_BYTES_MAX.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from queues.core import keys
from queues.core.entry import Entry
from queues.core.port import KvRead, Table
from queues.core.records import DocumentRow, document_decoder, encode, int_decoder
from queues.model import DOCUMENT_BYTES_MAX, Code, DocumentResult, DocumentView, EventType, PutDocument, QueueResult

DOCUMENTS_MAX: Final = 1000
EVENT_BODY_CHARS_MAX: Final = 2048
"""A document's before and after go into its event whole up to this size; larger ones by hash."""


def version(view: KvRead, namespace: str) -> int:
    stored = view.get(Table.DOCUMENT_VERSIONS, namespace.encode())
    return 0 if stored is None else int_decoder.decode(stored)


def _names(view: KvRead, namespace: str) -> list[tuple[bytes, bytes]]:
    prefix = keys.kind_prefix(namespace)
    found = []
    for key, value in view.scan(Table.DOCUMENTS, prefix, keys.after(prefix)):
        found.append((key[len(prefix) :], value))
        if len(found) == DOCUMENTS_MAX:
            break
    return found


def documents(view: KvRead, namespace: str) -> list[DocumentView]:
    return [
        DocumentView(name=name.decode(), body=row.body, updated_ms=row.updated_ms, updated_by=row.updated_by)
        for name, row in ((name, document_decoder.decode(value)) for name, value in _names(view, namespace))
    ]


def _for_event(body: bytes | None) -> str | None:
    if body is None:
        return None
    if len(body) <= EVENT_BODY_CHARS_MAX:
        return body.decode()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def put(entry: Entry, command: PutDocument) -> QueueResult:
    """Replace (or, with no body, delete) one document; the namespace's version moves on. With an
    expected version, only when the namespace is still at it (compare and set)."""
    tx = entry.tx
    if command.expected_version is not None and command.expected_version != version(tx, command.namespace):
        return DocumentResult(code=Code.CONFLICT, version=version(tx, command.namespace))
    if command.body is not None and not _json_object(command.body):
        return DocumentResult(code=Code.INVALID, version=version(tx, command.namespace))
    key = keys.kind_prefix(command.namespace) + command.name.encode()
    stored = tx.get(Table.DOCUMENTS, key)
    before = None if stored is None else document_decoder.decode(stored).body
    if command.body is None:
        tx.delete(Table.DOCUMENTS, key)
    else:
        if before is None and len(_names(tx, command.namespace)) >= DOCUMENTS_MAX:
            return DocumentResult(code=Code.INVALID, version=version(tx, command.namespace))
        tx.put(Table.DOCUMENTS, key, encode(DocumentRow(command.body, entry.now_ms, command.actor)))
    now_version = version(tx, command.namespace) + 1
    tx.put(Table.DOCUMENT_VERSIONS, command.namespace.encode(), encode(now_version))
    entry.emit_audited(
        EventType.DOCUMENT_PUT, 0, "",
        {"namespace": command.namespace, "name": command.name, "actor": command.actor, "reason": command.reason,
         "before": _for_event(before), "after": _for_event(command.body)},
    )  # fmt: skip
    return DocumentResult(code=Code.OK, version=now_version)


def _json_object(body: bytes) -> bool:
    try:
        decoded: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(decoded, dict) and len(body) <= DOCUMENT_BYTES_MAX
