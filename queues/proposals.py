"""Four-eyes proposals: review actions waiting for a second person, as replicated state.

Why in the store: an approval and the action it releases must be one replicated command (the
machine's `Approve`), so the proposal has to be where that command is applied. Which actions need
a proposal (money-moving kinds, amounts, bulk sizes) is configuration the API applies before it
proposes; the store enforces what it can decide alone and the same way on every replica: the
approver is not the proposer, and the proposal has not expired by the leader's time.

A proposal is kept after it is decided (approved, rejected, expired): it is the record of who
asked and who agreed, beside the audit chain. Expiry needs no command: a pending proposal whose
`expires_ms` has passed reads as expired, and an Approve or Reject that finds it so records it.

Owns: the `proposals` table, its rows and views. Must never: read a clock, or perform an action
(the machine does, in the Approve that decides the proposal).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from queues import codec
from queues.model import (
    PROPOSALS_PENDING_MAX,
    Discard,
    EditRedrive,
    ProposalState,
    ProposalView,
    Redrive,
    RedriveJob,
    ReviewAction,
)

PROPOSALS_PAGE_MAX: Final = 1000

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS proposals (
        id INTEGER PRIMARY KEY, action TEXT NOT NULL, body BLOB NOT NULL, proposer TEXT NOT NULL,
        reason TEXT NOT NULL, targets BLOB NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
        state TEXT NOT NULL, decided_by TEXT, decided_ms INTEGER, decision_reason TEXT)""",
    "CREATE INDEX IF NOT EXISTS proposals_pending ON proposals (id) WHERE state = 'pending'",
)

_COLUMNS: Final = (
    "id, action, body, proposer, reason, targets, created_ms, expires_ms, state, decided_by, decided_ms,"
    " decision_reason"
)
_targets_encoder: Final = msgspec.msgpack.Encoder()
_targets_decoder: Final = msgspec.msgpack.Decoder(tuple[int, ...])


def create_tables(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


def action_name(action: ReviewAction) -> str:
    match action:
        case Redrive():
            return "redrive"
        case EditRedrive():
            return "edit_redrive"
        case Discard():
            return "discard"
        case RedriveJob():
            return "redrive_job"


def proposer_of(action: ReviewAction) -> str:
    return action.actor


@dataclass(frozen=True, slots=True)
class Proposal:
    view: ProposalView
    action: ReviewAction

    def state(self, now_ms: int) -> ProposalState:
        return effective_state(self.view.state, self.view.expires_ms, now_ms)


def effective_state(stored: ProposalState, expires_ms: int, now_ms: int) -> ProposalState:
    if stored is ProposalState.PENDING and expires_ms <= now_ms:
        return ProposalState.EXPIRED
    return stored


def pending_count(conn: sqlite3.Connection, now_ms: int) -> int:
    """Proposals still open (pending and not expired)."""
    row = conn.execute(
        "SELECT count(*) FROM proposals INDEXED BY proposals_pending WHERE state = 'pending' AND expires_ms > ?",
        (now_ms,),
    ).fetchone()
    return int(row[0])


def insert(
    conn: sqlite3.Connection, *, action: ReviewAction, targets: Sequence[int], now_ms: int, expires_ms: int
) -> int | None:
    """Store a pending proposal; its id, or None when PROPOSALS_PENDING_MAX are already pending."""
    if pending_count(conn, now_ms) >= PROPOSALS_PENDING_MAX:
        return None
    (proposal_id,) = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM proposals").fetchone()
    conn.execute(
        f"INSERT INTO proposals ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,NULL,NULL,NULL)",
        (proposal_id, action_name(action), codec.encode_command(action), proposer_of(action), action.reason,
         _targets_encoder.encode(tuple(targets)), now_ms, expires_ms, ProposalState.PENDING.value),
    )  # fmt: skip
    return int(proposal_id)


def decide(
    conn: sqlite3.Connection, proposal_id: int, state: ProposalState, *, by: str, now_ms: int, reason: str
) -> None:
    conn.execute(
        "UPDATE proposals SET state = ?, decided_by = ?, decided_ms = ?, decision_reason = ? WHERE id = ?",
        (state.value, by, now_ms, reason, proposal_id),
    )


def _view(row: Any, now_ms: int) -> ProposalView:
    state = effective_state(ProposalState(row[8]), int(row[7]), now_ms)
    return ProposalView(
        proposal_id=int(row[0]), action=row[1], body=bytes(row[2]), proposer=row[3], reason=row[4],
        targets=_targets_decoder.decode(row[5]), created_ms=int(row[6]), expires_ms=int(row[7]), state=state,
        decided_by=row[9], decided_ms=row[10], decision_reason=row[11],
    )  # fmt: skip


def load(conn: sqlite3.Connection, proposal_id: int) -> Proposal | None:
    """The proposal as stored (its state not yet aged: `Proposal.state(now_ms)` does that)."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
    if row is None:
        return None
    action = codec.decode_command(bytes(row[2]))
    assert isinstance(action, Redrive | EditRedrive | Discard | RedriveJob), f"proposal {proposal_id} holds {action!r}"
    return Proposal(view=_view(row, 0), action=action)


def proposal_action(view: ProposalView) -> ReviewAction:
    """The action a proposal holds, decoded from its body (an edit's payload, a discard's code)."""
    action = codec.decode_command(view.body)
    assert isinstance(action, Redrive | EditRedrive | Discard | RedriveJob), f"proposal {view.proposal_id} holds {action!r}"
    return action


def proposal_with_action(view: ProposalView, action: ReviewAction) -> ProposalView:
    """The proposal as a reader is shown it holding `action` instead (an edit's payload masked for a
    viewer); nothing in the store changes."""
    return msgspec.structs.replace(view, body=codec.encode_command(action))


def listing(
    conn: sqlite3.Connection, *, now_ms: int, pending_only: bool, before_id: int | None, limit: int
) -> list[ProposalView]:
    """Proposals newest first (pending ones only, if asked: expired ones are not pending)."""
    assert 0 < limit <= PROPOSALS_PAGE_MAX
    bound = before_id if before_id is not None else (1 << 62)
    if pending_only:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM proposals INDEXED BY proposals_pending WHERE state = 'pending' AND id < ?"
            " AND expires_ms > ? ORDER BY id DESC LIMIT ?",
            (bound, now_ms, limit),
        )
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM proposals WHERE id < ? ORDER BY id DESC LIMIT ?", (bound, limit))
    return [_view(row, now_ms) for row in rows]


def get(conn: sqlite3.Connection, proposal_ids: Sequence[int], *, now_ms: int) -> list[ProposalView]:
    found = []
    for proposal_id in dict.fromkeys(proposal_ids):
        row = conn.execute(f"SELECT {_COLUMNS} FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
        if row is not None:
            found.append(_view(row, now_ms))
    return found
