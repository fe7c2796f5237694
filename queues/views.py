"""Query views made only of plain values: what the model re-exports (queues.model) and every
reader decodes, kept apart so the model stays one readable module.

Must never: import the machine, a store, a clock or a network module.
"""

from __future__ import annotations

import msgspec


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    attempt: int
    token: int
    worker_id: str
    leased_ms: int
    ended_ms: int | None
    outcome: str | None
    """None while leased; else succeeded, failed, expired."""
    error_class: str | None
    error_text: str | None


class DocumentView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    body: bytes
    updated_ms: int
    updated_by: str


class DeadLetterSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The dead letters a filter matches, counted and summed (queries.dead_letter_summary)."""

    count: int = 0
    by_currency: tuple[tuple[str, int, int], ...] = ()
    """(currency, matches, total amount_minor), by currency: the matches whose current payload has
    both an integer `amount_minor` and a `currency`."""
    without_amount: int = 0
    """Matches whose payload lacks either (not JSON, another kind's shape): count = these + the above."""
    oldest_dead_ms: int | None = None
    oldest_id: int | None = None
    """The first match in (dead_ms, id) order: where a page of the same filter starts."""


class AuditEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One operator action, as the replicated command that performed it wrote it (queues/audit_chain.py)."""

    seq: int
    log_index: int
    ts_ms: int
    actor: str
    action: str
    target: str
    reason: str
    before: str
    """Canonical JSON (keys sorted, no spaces) of what the action changed, as it was."""
    after: str
    """Canonical JSON of the same, as the action left it."""
    prev_hash: bytes
    hash: bytes
