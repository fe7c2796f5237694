"""Four-eyes proposals: review actions waiting for a second person, as replicated state.

Why in the store: an approval and the action it releases must be one replicated command (the
machine's `Approve`), so the proposal has to be where that command is applied. Which actions need
a proposal (money-moving kinds, amounts, bulk sizes) is configuration the API applies before it
proposes; the store enforces what it can decide alone and the same way on every replica: the
approver is not the proposer, and the proposal has not expired by the leader's time.

A proposal is kept after it is decided (approved, rejected, expired): it is the record of who
asked and who agreed, beside the audit chain. Expiry needs no command: a pending proposal whose
`expires_ms` has passed reads as expired, and an Approve or Reject that finds it so records it.

Owns: the PROPOSALS table and PROPOSALS_PENDING (the ones stored as pending, with their expiry).
Must never: read a clock, or perform an action (the review does, in the Approve that decides it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from queues import codec
from queues.core import keys
from queues.core.entry import Entry
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import ProposalRow, encode, int_decoder, proposal_decoder
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
_targets_encoder: Final = msgspec.msgpack.Encoder()
_targets_decoder: Final = msgspec.msgpack.Decoder(tuple[int, ...])


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


def pending_count(view: KvRead, now_ms: int) -> int:
    """Proposals still open (pending and not expired)."""
    return sum(1 for _, expires in view.scan(Table.PROPOSALS_PENDING) if int_decoder.decode(expires) > now_ms)


def insert(entry: Entry, *, action: ReviewAction, targets: Sequence[int], expires_ms: int) -> int | None:
    """Store a pending proposal; its id, or None when PROPOSALS_PENDING_MAX are already pending."""
    tx = entry.tx
    if pending_count(tx, entry.now_ms) >= PROPOSALS_PENDING_MAX:
        return None
    proposal_id = entry.meta.next_proposal
    entry.meta.next_proposal = proposal_id + 1
    row = ProposalRow(action_name(action), codec.encode_command(action), action.actor, action.reason,
                      _targets_encoder.encode(tuple(targets)), entry.now_ms, expires_ms, ProposalState.PENDING.value)  # fmt: skip
    key = keys.u64(proposal_id)
    tx.put(Table.PROPOSALS, key, encode(row), append=True)
    tx.put(Table.PROPOSALS_PENDING, key, encode(expires_ms))
    return proposal_id


def decide(tx: KvWrite, proposal_id: int, state: ProposalState, *, by: str, now_ms: int, reason: str) -> None:
    key = keys.u64(proposal_id)
    stored = tx.get(Table.PROPOSALS, key)
    assert stored is not None
    row = msgspec.structs.replace(proposal_decoder.decode(stored), state=state.value, decided_by=by, decided_ms=now_ms,
                                  decision_reason=reason)  # fmt: skip
    tx.put(Table.PROPOSALS, key, encode(row))
    tx.delete(Table.PROPOSALS_PENDING, key)


def _view(proposal_id: int, row: ProposalRow, now_ms: int) -> ProposalView:
    return ProposalView(
        proposal_id=proposal_id, action=row.action, body=row.body, proposer=row.proposer, reason=row.reason,
        targets=_targets_decoder.decode(row.targets), created_ms=row.created_ms, expires_ms=row.expires_ms,
        state=effective_state(ProposalState(row.state), row.expires_ms, now_ms), decided_by=row.decided_by,
        decided_ms=row.decided_ms, decision_reason=row.decision_reason,
    )  # fmt: skip


def _row(view: KvRead, proposal_id: int) -> ProposalRow | None:
    stored = view.get(Table.PROPOSALS, keys.u64(proposal_id))
    return None if stored is None else proposal_decoder.decode(stored)


def load(view: KvRead, proposal_id: int) -> Proposal | None:
    """The proposal as stored (its state not yet aged: `Proposal.state(now_ms)` does that)."""
    row = _row(view, proposal_id)
    if row is None:
        return None
    action = codec.decode_command(row.body)
    assert isinstance(action, Redrive | EditRedrive | Discard | RedriveJob), f"proposal {proposal_id} holds {action!r}"
    return Proposal(view=_view(proposal_id, row, 0), action=action)


def proposal_action(view: ProposalView) -> ReviewAction:
    """The action a proposal holds, decoded from its body (an edit's payload, a discard's code)."""
    action = codec.decode_command(view.body)
    assert isinstance(action, Redrive | EditRedrive | Discard | RedriveJob), f"proposal {view.proposal_id} holds {action!r}"
    return action


def proposal_with_action(view: ProposalView, action: ReviewAction) -> ProposalView:
    """The proposal as a reader is shown it holding `action` instead (an edit's payload masked for a
    viewer); nothing in the store changes."""
    return msgspec.structs.replace(view, body=codec.encode_command(action))


def listing(view: KvRead, *, now_ms: int, pending_only: bool, before_id: int | None, limit: int) -> list[ProposalView]:
    """Proposals newest first (pending ones only, if asked: expired ones are not pending)."""
    assert 0 < limit <= PROPOSALS_PAGE_MAX
    bound = keys.u64(before_id if before_id is not None else keys.U64_MAX)
    found: list[ProposalView] = []
    if pending_only:
        for key, expires in view.scan(Table.PROPOSALS_PENDING, b"", bound, reverse=True):
            if int_decoder.decode(expires) > now_ms:
                row = _row(view, keys.u64_of(key))
                assert row is not None
                found.append(_view(keys.u64_of(key), row, now_ms))
                if len(found) == limit:
                    break
        return found
    for key, value in view.scan(Table.PROPOSALS, b"", bound, reverse=True):
        found.append(_view(keys.u64_of(key), proposal_decoder.decode(value), now_ms))
        if len(found) == limit:
            break
    return found


def get(view: KvRead, proposal_ids: Sequence[int], *, now_ms: int) -> list[ProposalView]:
    found = []
    for proposal_id in dict.fromkeys(proposal_ids):
        row = _row(view, proposal_id)
        if row is not None:
            found.append(_view(proposal_id, row, now_ms))
    return found
