"""Who may call the service: API tokens with their role and intake quota, as replicated state.

Why in the store, and not in PostgreSQL or a file: every API process must see a revocation within
seconds, and the intake path must not depend on anything the store does not already need. The
tokens table is small (at most TOKENS_MAX rows), so an API process keeps all of it in memory and
polls the access version (one stale read of one integer per refresh interval) to learn that
something changed. A token survives the loss of any one node, like every request it lets in, and
each change is an event in the same log that records everything else an operator does.

Only the SHA-256 of a token's secret is stored: the secret is 256 random bits, so a fast hash is
as good as a slow one against guessing, and a stolen store holds nothing that authenticates.

Owns: the TOKENS table (by name) and TOKEN_SECRETS (a secret's hash -> the name holding it), the
`PutToken`, `RevokeToken` and `SetQuota` commands' effects, and the reads the API's token cache
makes. Must never: read a clock, or put a secret (or its hash) in an event.
"""

from __future__ import annotations

import msgspec

from queues.core.entry import Entry, load_meta
from queues.core.port import KvRead, Table
from queues.core.records import TokenRow, encode, token_decoder
from queues.model import (
    TOKENS_MAX,
    Code,
    EventType,
    PutToken,
    QueueResult,
    RevokeToken,
    Role,
    SetQuota,
    TokenResult,
    TokenView,
)


def version(view: KvRead) -> int:
    """Bumped by every change to the tokens: a cache that saw this version is current."""
    return load_meta(view).access_version


def _view(name: str, row: TokenRow) -> TokenView:
    return TokenView(
        name=name, role=Role(row.role), secret_hash=row.secret_hash, created_ms=row.created_ms,
        created_by=row.created_by, revoked_ms=row.revoked_ms, rate_per_s=row.rate_per_s, burst=row.burst,
    )  # fmt: skip


def _row(view: KvRead, name: str) -> TokenRow | None:
    stored = view.get(Table.TOKENS, name.encode())
    return None if stored is None else token_decoder.decode(stored)


def token(view: KvRead, name: str) -> TokenView | None:
    row = _row(view, name)
    return None if row is None else _view(name, row)


def tokens(view: KvRead) -> list[TokenView]:
    """Every token, revoked ones included (a cache must learn that a token it holds is revoked)."""
    found = []
    for key, value in view.scan(Table.TOKENS):
        found.append(_view(key.decode(), token_decoder.decode(value)))
        if len(found) == TOKENS_MAX:
            break
    return found


def _changed(entry: Entry, name: str, row: TokenRow) -> TokenResult:
    entry.meta.access_version += 1
    return TokenResult(
        code=Code.OK, name=name, role=Role(row.role), revoked=row.revoked_ms is not None,
        version=entry.meta.access_version,
    )  # fmt: skip


def put_token(entry: Entry, command: PutToken) -> QueueResult:
    tx = entry.tx
    holder = tx.get(Table.TOKEN_SECRETS, command.secret_hash)
    if holder is not None and holder.decode() != command.name:
        return TokenResult(code=Code.CONFLICT, name=command.name, version=entry.meta.access_version)
    existing = _row(tx, command.name)
    if existing is None:
        if tx.count(Table.TOKENS) >= TOKENS_MAX:
            return TokenResult(code=Code.INVALID, name=command.name, version=entry.meta.access_version)
        row = TokenRow(command.role.value, command.secret_hash, entry.now_ms, command.actor)
    else:
        tx.delete(Table.TOKEN_SECRETS, existing.secret_hash)
        row = msgspec.structs.replace(existing, role=command.role.value, secret_hash=command.secret_hash,
                                      created_ms=entry.now_ms, created_by=command.actor, revoked_ms=None)  # fmt: skip
    tx.put(Table.TOKENS, command.name.encode(), encode(row))
    tx.put(Table.TOKEN_SECRETS, command.secret_hash, command.name.encode())
    entry.emit_audited(
        EventType.TOKEN_PUT, 0, "",
        {"name": command.name, "role": command.role.value, "actor": command.actor, "reason": command.reason,
         "rotated": existing is not None, "role_before": None if existing is None else existing.role},
    )  # fmt: skip
    return _changed(entry, command.name, row)


def revoke_token(entry: Entry, command: RevokeToken) -> QueueResult:
    existing = _row(entry.tx, command.name)
    if existing is None:
        return TokenResult(code=Code.NOT_FOUND, name=command.name, version=entry.meta.access_version)
    if existing.revoked_ms is not None:  # a repeat changes nothing and records nothing
        return TokenResult(code=Code.OK, name=command.name, role=Role(existing.role), revoked=True,
                           version=entry.meta.access_version)  # fmt: skip
    row = msgspec.structs.replace(existing, revoked_ms=entry.now_ms)
    entry.tx.put(Table.TOKENS, command.name.encode(), encode(row))
    entry.emit_audited(
        EventType.TOKEN_REVOKED, 0, "",
        {"name": command.name, "role": existing.role, "actor": command.actor, "reason": command.reason},
    )  # fmt: skip
    return _changed(entry, command.name, row)


def set_quota(entry: Entry, command: SetQuota) -> QueueResult:
    existing = _row(entry.tx, command.name)
    if existing is None:
        return TokenResult(code=Code.NOT_FOUND, name=command.name, version=entry.meta.access_version)
    row = msgspec.structs.replace(existing, rate_per_s=command.rate_per_s, burst=command.burst)
    entry.tx.put(Table.TOKENS, command.name.encode(), encode(row))
    entry.emit_audited(
        EventType.QUOTA_SET, 0, "",
        {"name": command.name, "actor": command.actor, "rate_per_s": command.rate_per_s, "burst": command.burst,
         "rate_per_s_before": existing.rate_per_s, "burst_before": existing.burst},
    )  # fmt: skip
    return _changed(entry, command.name, row)


