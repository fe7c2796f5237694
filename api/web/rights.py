"""What each role may do on the review pages, as a table (Oban Web's resolver, as data).

One table instead of role checks scattered through the pages: a reader of this file sees the
whole policy, and a test can walk it. It is code, not configuration: a right a deployment could
grant by editing a file is a right nobody reviewed, and four eyes (docs/review.md) depends on
approvers and reviewers staying apart. The JSON API has its own role sets (api/auth.py); both
say the same thing about the same action.

The one rule that is not a role's is in the pages: a proposer may withdraw their own proposal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from queues import Role


class Right(enum.Enum):
    VIEW = "view"
    """The dead letters, requests, timelines and proposals (personal data masked without the next)."""
    VIEW_PERSONAL_DATA = "view_personal_data"
    """Account numbers and user data in payloads, unmasked (ledger/masking.py says which fields)."""
    EXPORT = "export"
    """Download what one may view (masked as it is viewed)."""
    REDRIVE = "redrive"
    EDIT = "edit"
    """Edit a payload and redrive it as a new version."""
    DISCARD = "discard"
    MANAGE_JOBS = "manage_jobs"
    """Start, pause and cancel bulk redrive jobs."""
    APPROVE = "approve"
    """Approve someone else's proposal (the store refuses one's own)."""
    REJECT = "reject"
    VIEW_AUDIT = "view_audit"


_VIEWER: Final = frozenset({Right.VIEW, Right.EXPORT, Right.VIEW_AUDIT})
RIGHTS: Final[Mapping[Role, frozenset[Right]]] = MappingProxyType({
    Role.VIEWER: _VIEWER,
    Role.REVIEWER: _VIEWER | {Right.VIEW_PERSONAL_DATA, Right.REDRIVE, Right.EDIT, Right.DISCARD, Right.MANAGE_JOBS},
    Role.APPROVER: _VIEWER | {Right.VIEW_PERSONAL_DATA, Right.APPROVE, Right.REJECT},
    Role.ADMIN: frozenset(Right),
})  # fmt: skip
"""Producers and operators are services and on-call engineers: they have no web login."""

WEB_ROLES: Final = tuple(RIGHTS)
"""The roles a user account may have (`compensator user add --role`)."""


def allowed(role: Role, right: Right) -> bool:
    return right in RIGHTS.get(role, frozenset())
