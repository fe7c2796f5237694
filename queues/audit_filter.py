"""Which entries a page of the audit chain holds (queues/core/audit_chain.py applies it; the API's
audit list and page build it): apart from the model's commands and results because it is a
query's argument, never a command's, and the model is one module that must stay readable.

Must never: import the machine, a store, a clock or a network module.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from queues.model import MessageId, Name, TimeMs

AUDIT_FILTER_VALUES_MAX: Final = 32
AuditTarget = Annotated[str, msgspec.Meta(min_length=1, max_length=320)]
"""A target or the start of one: `document:<namespace>/<name>` is the longest kind."""


class AuditFilter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Which entries a page of the audit chain holds: every field set must hold (an empty filter,
    every entry). Applied in the query, below the page's limit, so that a filtered page is full
    and its `before` cursor pages the filtered chain, never a page thinned after the fact.

    Unset fields are left out of the encoding; a node from before filters refuses a filter it
    cannot apply (an unknown field is INVALID) instead of answering the whole chain as filtered."""

    actor: Name | None = None
    actions: Annotated[tuple[Name, ...], msgspec.Meta(max_length=AUDIT_FILTER_VALUES_MAX)] = ()
    """Any of these actions (empty: every action)."""
    target: AuditTarget | None = None
    """Exactly this target (`proposal:7`, `job:3`, `document:users/ann`)."""
    target_prefix: AuditTarget | None = None
    """Targets that start with this (`document:users/`)."""
    exclude_target_prefixes: Annotated[tuple[AuditTarget, ...], msgspec.Meta(max_length=AUDIT_FILTER_VALUES_MAX)] = ()
    """None of these starts (what the review's default view leaves out: sessions and logins)."""
    message_id: MessageId | None = None
    """Entries that concern this message: its own, an edit's of the version before, a proposal's
    and its approval's (every entry indexed under it, as `message_audit` reads)."""
    from_ms: TimeMs | None = None
    """Inclusive."""
    to_ms: TimeMs | None = None
    """Exclusive."""

    def __post_init__(self) -> None:
        # Raised here, a decode answers INVALID: an empty time range is refused at the edge.
        if self.from_ms is not None and self.to_ms is not None and self.from_ms >= self.to_ms:
            raise ValueError("the time range is empty: its start is not before its end")
