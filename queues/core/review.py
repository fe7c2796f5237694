"""Finance review: edit-and-redrive as a new version, four-eyes proposals and their approval.

Why one apply per decision: an approval and the action it releases are one replicated command,
and so is every action and its audit entry. Everything here runs inside the apply of one command,
on every replica, from the leader's time: a crash can leave neither an approved proposal whose
action was not done nor an action nobody approved.

Refusals change nothing: before an approval is recorded, every target is checked with the same
rules the action applies (`refusal`), and an approval that would do nothing is refused whole;
the targets that can be acted on are done, the others are reported, never counted as done.

Must never: read a clock, validate a payload against a kind's schema (the edge does, before it
proposes: the store stays free of the API's vocabulary), or decide who needs four eyes (the
API's configuration does; the store enforces what it can decide alone: a different approver, in
time).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import msgspec

from queues import codec
from queues.core import jobs, messages, operator, proposals
from queues.core.delivery import load_current
from queues.core.entry import Entry
from queues.core.records import MessageRecord
from queues.lifecycle import Action, transition
from queues.model import (
    VERSION_MAX,
    VERSION_SUFFIX,
    Approve,
    Code,
    Discard,
    EditRedrive,
    ErrorResult,
    EventType,
    EventValue,
    Phase,
    ProposalState,
    Propose,
    Redrive,
    RedriveJob,
    Reject,
    ReviewAction,
    ReviewResult,
    State,
    content_hash,
    state_of,
)

AUDIT_PAYLOAD_BYTES_MAX: Final = 16 * 1024
"""A payload goes into an audit entry as text up to this size (a request is a small JSON
instruction), and as its SHA-256 beyond it or when it is not UTF-8."""

Detail = dict[str, EventValue]


def payload_for_audit(payload: bytes) -> str:
    if len(payload) <= AUDIT_PAYLOAD_BYTES_MAX:
        try:
            return payload.decode()
        except UnicodeDecodeError:
            pass
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def versioned_key(key: str, version_now: int, version_new: int) -> str:
    """`<first version's key>#v<n>`: the suffix this module added to the current version (if it is
    not the first) is taken off first, so versions never nest (k#v2#v3)."""
    suffix = f"{VERSION_SUFFIX}{version_now}"
    base = key.removesuffix(suffix) if version_now > 1 and key.endswith(suffix) else key
    return f"{base}{VERSION_SUFFIX}{version_new}"


# ---- refusals, shared by the actions and by the approval that runs them ------------------
def refusal(entry: Entry, action: ReviewAction, message_id: int) -> Code | None:
    """Why `action` cannot be applied to this message now (None: it can)."""
    record = load_current(entry, message_id)
    if record is None:
        return Code.NOT_FOUND
    state = state_of(record.phase, record.due_ms, entry.now_ms)
    if isinstance(action, Discard):
        return Code.ILLEGAL_STATE if isinstance(transition(state, Action.DISCARD), Code) else None
    if isinstance(transition(state, Action.REDRIVE), Code):
        return Code.ILLEGAL_STATE
    if isinstance(action, EditRedrive):
        return edit_refusal(entry, record, action)
    return None


def judge(entry: Entry, action: ReviewAction, targets: list[int]) -> tuple[list[int], list[tuple[int, Code]]]:
    """(the targets the action can be applied to now, the others with why), in the order given."""
    if isinstance(action, RedriveJob):
        return jobs.judge(entry.tx, targets)
    refused = [(target, code) for target in targets if (code := refusal(entry, action, target)) is not None]
    unable = {target for target, _ in refused}
    return [target for target in targets if target not in unable], refused


def edit_refusal(entry: Entry, record: MessageRecord, action: EditRedrive) -> Code | None:
    version = record.version or 1
    if version >= VERSION_MAX:
        return Code.INVALID
    if action.payload == messages.payload(entry.tx, record):
        return Code.INVALID  # nothing edited: that is a redrive
    holder = messages.holder(entry.tx, versioned_key(record.idempotency_key, version, version + 1))
    if holder is not None and (holder.purge_ms is None or holder.purge_ms > entry.now_ms):
        return Code.CONFLICT  # a live request already holds the new version's key
    return None


# ---- edit and redrive ------------------------------------------------------------------
def edit_redrive(entry: Entry, command: EditRedrive, approval: Detail | None = None) -> ReviewResult:
    refused = refusal(entry, command, command.message_id)
    if refused is not None:
        detail = "the payload is unchanged, or the message has too many versions" if refused is Code.INVALID else ""
        return ReviewResult(code=refused, refused=((command.message_id, refused),), detail=detail)
    record = messages.load(entry.tx, command.message_id)
    assert record is not None
    now_ms = entry.now_ms
    state = state_of(record.phase, record.due_ms, now_ms)
    current = messages.payload(entry.tx, record)
    version = (record.version or 1) + 1
    new_key = versioned_key(record.idempotency_key, version - 1, version)
    new_id = entry.meta.next_message_id
    entry.meta.next_message_id = new_id + 1
    headers = record.headers if command.headers is None else codec.encode_headers(command.headers)
    successor = MessageRecord(
        id=new_id, kind=record.kind, idempotency_key=new_key, ref_key=record.ref_key,
        content_hash=content_hash(record.kind, record.ref_key, command.payload), headers=headers, created_ms=now_ms,
        phase=Phase.WAITING, due_ms=now_ms, attempts=0, budget_attempts=0, budget_start_ms=now_ms, token=0,
        token_open=False, payload_len=len(command.payload), version=version, previous_id=record.id,
    )  # fmt: skip
    messages.insert(entry, successor, command.payload)
    # The original is kept as it was (payload, history), discarded so that it can never be
    # delivered again, and names its successor.
    superseded = msgspec.structs.replace(
        record, phase=Phase.DISCARDED, token_open=False, terminal_ms=now_ms,
        purge_ms=now_ms + entry.catalog.retention(entry.tx)[0], dead_ms=None, superseded_by=new_id, amount=None,
        currency=None,
    )  # fmt: skip
    messages.save(entry, record, superseded)
    entry.emit(
        EventType.DISCARDED, record.id, record.kind,
        {"actor": command.actor, "reason": command.reason, "from_state": state.value, "reason_code": "superseded",
         "superseded_by": new_id, **(approval or {})},
    )  # fmt: skip
    entry.emit(
        EventType.ENQUEUED, new_id, record.kind,
        {"idempotency_key": new_key, "ref_key": record.ref_key, "due_ms": now_ms, "previous_id": record.id,
         "version": version},
    )  # fmt: skip
    entry.audit(
        actor=command.actor, action="edit_redrive", target=f"message:{record.id}", reason=command.reason,
        before={"state": state.value, "version": version - 1, "payload": payload_for_audit(current)},
        after={"state": State.DISCARDED.value, "superseded_by": new_id, "new_version": version,
               "new_idempotency_key": new_key, "payload": payload_for_audit(command.payload), **(approval or {})},
        message_ids=(record.id, new_id),
    )  # fmt: skip
    return ReviewResult(code=Code.OK, ids=(record.id,), new_ids=(new_id,))


# ---- proposals -------------------------------------------------------------------------
def _group_proposal(entry: Entry, action: RedriveJob) -> ReviewResult | None:
    """A group's part proposed: None when it is to be made, else the answer. The set holds at most
    one proposal of a group, so a repeated creation answers the one it holds; `renews` names the
    held proposal when it expired (its set was down until then) and makes a new one in its place
    (a repeat of that answers the new one, which is held now)."""
    held = jobs.group_part(entry.tx, action.group, "proposal")
    if held is not None and (not action.renews or held != action.renews):  # this set's part exists
        found = proposals.load(entry.tx, held)
        assert found is not None
        return ReviewResult(code=Code.OK, proposal_id=held, proposal_state=found.state(entry.now_ms),
                            detail="this set's part of the group is proposed already")  # fmt: skip
    if held is not None:
        found = proposals.load(entry.tx, held)
        assert found is not None
        if found.state(entry.now_ms) is not ProposalState.EXPIRED:
            return ReviewResult(code=Code.INVALID, proposal_id=held, proposal_state=found.state(entry.now_ms),
                                detail="only an expired part of the group is proposed again")  # fmt: skip
    elif action.renews:
        return ReviewResult(code=Code.NOT_FOUND, detail="this set holds no proposal of the group to propose again")
    if jobs.group_part(entry.tx, action.group, "job") is not None:
        return ReviewResult(code=Code.INVALID, detail="this set's part of the group was started without approval")
    return None


def propose(entry: Entry, command: Propose) -> ReviewResult:
    action = command.action
    if isinstance(action, RedriveJob) and action.renews and not action.group:
        return ReviewResult(code=Code.INVALID, detail="renews names a group's part: give its group")
    if isinstance(action, RedriveJob) and action.group:
        answered = _group_proposal(entry, action)
        if answered is not None:
            return answered
    if isinstance(action, Redrive):
        if action.payload is not None:
            return ReviewResult(code=Code.INVALID, detail="propose an edit as an edit_redrive")
        targets = operator.redrive_targets(entry, action)
        if not isinstance(targets, list):
            return ReviewResult(code=targets.code, detail=targets.detail)
        if not targets:
            return ReviewResult(code=Code.NOT_FOUND, detail="no message matches")
    elif isinstance(action, RedriveJob):
        targets = sorted(set(action.ids))
    else:
        targets = [action.message_id]
    able, refused = judge(entry, action, targets)
    if not able:
        return ReviewResult(code=refused[0][1], refused=tuple(refused), detail="nothing the action could do")
    if isinstance(action, Redrive):  # the ids shown, never what a filter matches later
        action = msgspec.structs.replace(action, ids=tuple(able), filter=None)
    if isinstance(action, RedriveJob):
        action = msgspec.structs.replace(action, ids=tuple(able))
    expires_ms = entry.now_ms + command.ttl_ms
    proposal_id = proposals.insert(entry, action=action, targets=able, expires_ms=expires_ms)
    if proposal_id is None:
        return ReviewResult(code=Code.INVALID, detail="too many proposals are pending")
    if isinstance(action, RedriveJob):
        jobs.hold_group_part(entry.tx, action.group, "proposal", proposal_id)
    after: Detail = {"state": ProposalState.PENDING.value, "action": proposals.action_name(action),
                     **_targets(action, able), "expires_ms": expires_ms}  # fmt: skip
    if isinstance(action, EditRedrive):
        after["payload"] = payload_for_audit(action.payload)
    if isinstance(action, Discard):
        after["reason_code"] = action.reason_code
    if isinstance(action, RedriveJob):
        after |= {"rate_per_s": action.rate_per_s, **jobs.group_detail(action.group)}
        if action.renews:
            after["renews"] = action.renews
    entry.audit(
        actor=action.actor, action="propose", target=f"proposal:{proposal_id}", reason=action.reason, before={},
        after=after, message_ids=_indexed(action, able),
    )  # fmt: skip
    shown = () if isinstance(action, RedriveJob) else tuple(able)  # a job's items: read with JobItems
    return ReviewResult(code=Code.OK, proposal_id=proposal_id, proposal_state=ProposalState.PENDING,
                        ids=shown, refused=tuple(refused))  # fmt: skip


def _open(entry: Entry, proposal_id: int, actor: str) -> proposals.Proposal | ReviewResult:
    """The pending proposal, or the result that refuses the command. A proposal found past its
    expiry is recorded as expired (with its audit entry) and refused with EXPIRED."""
    found = proposals.load(entry.tx, proposal_id)
    if found is None:
        return ReviewResult(code=Code.NOT_FOUND, proposal_id=proposal_id)
    state = found.state(entry.now_ms)
    if state is ProposalState.EXPIRED and found.view.state is ProposalState.PENDING:
        proposals.decide(entry.tx, proposal_id, ProposalState.EXPIRED, by="", now_ms=entry.now_ms, reason="expired")
        entry.audit(
            actor="system", action="expire", target=f"proposal:{proposal_id}",
            reason=f"expired at {found.view.expires_ms}, found so by {actor}",
            before={"state": ProposalState.PENDING.value}, after={"state": ProposalState.EXPIRED.value},
            message_ids=_indexed(found.action, found.view.targets),
        )  # fmt: skip
    if state is not ProposalState.PENDING:
        code = Code.EXPIRED if state is ProposalState.EXPIRED else Code.ILLEGAL_STATE
        return ReviewResult(code=code, proposal_id=proposal_id, proposal_state=state)
    return found


def approve(entry: Entry, command: Approve) -> ReviewResult:
    found = _open(entry, command.proposal_id, command.approver)
    if isinstance(found, ReviewResult):
        return found
    if command.approver == found.view.proposer:
        return ReviewResult(code=Code.OWN_PROPOSAL, proposal_id=command.proposal_id,
                            proposal_state=ProposalState.PENDING, detail="the proposer cannot approve")  # fmt: skip
    action = found.action
    if isinstance(action, RedriveJob) and jobs.full(entry.tx):
        return ReviewResult(code=Code.INVALID, proposal_id=command.proposal_id, proposal_state=ProposalState.PENDING,
                            detail=f"{jobs.JOBS_ACTIVE_MAX} jobs are running or paused already")  # fmt: skip
    able, refused = judge(entry, action, list(found.view.targets))
    if not able:  # nothing would be done: no approval is recorded either
        return ReviewResult(code=refused[0][1], proposal_id=command.proposal_id,
                            proposal_state=ProposalState.PENDING, refused=tuple(refused),
                            detail="no target can be acted on any more")  # fmt: skip
    proposals.decide(entry.tx, command.proposal_id, ProposalState.APPROVED, by=command.approver,
                     now_ms=entry.now_ms, reason=command.reason)  # fmt: skip
    entry.audit(
        actor=command.approver, action="approve", target=f"proposal:{command.proposal_id}", reason=command.reason,
        before={"state": ProposalState.PENDING.value},
        after={"state": ProposalState.APPROVED.value, "proposer": found.view.proposer,
               "action": found.view.action, **_targets(action, able), **_group(action)},
        message_ids=_indexed(action, able),
    )  # fmt: skip
    approval: Detail = {"proposal": command.proposal_id, "approved_by": command.approver}
    if isinstance(action, RedriveJob):  # the job starts in this apply: never approved-but-not-started
        started = jobs.create(entry, action, able, refused, approval)
        assert started.code is Code.OK, started  # `able` is not empty and there is room: checked above
        return msgspec.structs.replace(started, proposal_id=command.proposal_id,
                                       proposal_state=ProposalState.APPROVED)  # fmt: skip
    result = _perform(entry, action, able, approval)
    return msgspec.structs.replace(result, proposal_id=command.proposal_id, proposal_state=ProposalState.APPROVED,
                                   refused=tuple(refused) + result.refused)  # fmt: skip


def _perform(entry: Entry, action: Redrive | EditRedrive | Discard, targets: list[int], approval: Detail) -> ReviewResult:
    match action:
        case Redrive():
            done = operator.redrive(entry, msgspec.structs.replace(action, ids=tuple(targets), filter=None), approval)
            assert not isinstance(done, ErrorResult), done  # ids given: the shape is valid
            return ReviewResult(code=Code.OK, ids=done.ids, refused=done.refused)
        case EditRedrive():
            return edit_redrive(entry, action, approval)
        case Discard():
            outcome = operator.discard(entry, action, approval)
            assert outcome.code is Code.OK, outcome  # checked by `refusal` in this same apply
            return ReviewResult(code=Code.OK, ids=(action.message_id,))


def reject(entry: Entry, command: Reject) -> ReviewResult:
    found = _open(entry, command.proposal_id, command.actor)
    if isinstance(found, ReviewResult):
        return found
    proposals.decide(entry.tx, command.proposal_id, ProposalState.REJECTED, by=command.actor, now_ms=entry.now_ms,
                     reason=command.reason)  # fmt: skip
    withdrawn = command.actor == found.view.proposer
    entry.audit(
        actor=command.actor, action="withdraw" if withdrawn else "reject", target=f"proposal:{command.proposal_id}",
        reason=command.reason, before={"state": ProposalState.PENDING.value},
        after={"state": ProposalState.REJECTED.value, "proposer": found.view.proposer, **_group(found.action)},
        message_ids=_indexed(found.action, found.view.targets),
    )  # fmt: skip
    return ReviewResult(code=Code.OK, proposal_id=command.proposal_id, proposal_state=ProposalState.REJECTED)


# ---- redrive jobs ----------------------------------------------------------------------
def start_job(entry: Entry, command: RedriveJob) -> ReviewResult:
    """A job submitted directly (its actor needs no second person: the API decides that). A group's
    part this set holds already is answered, not started twice."""
    if command.renews:
        return ReviewResult(code=Code.INVALID, detail="only a proposal is proposed again (renews)")
    held = jobs.group_part(entry.tx, command.group, "job") if command.group else None
    if held is not None:
        return ReviewResult(code=Code.OK, job_id=held, detail="this set's part of the group is started already")
    if command.group and jobs.group_part(entry.tx, command.group, "proposal") is not None:
        return ReviewResult(code=Code.INVALID, detail="this set's part of the group is proposed: it starts when approved")
    able, refused = judge(entry, command, sorted(set(command.ids)))
    return jobs.create(entry, command, able, refused)


def _targets(action: ReviewAction, targets: Sequence[int]) -> Detail:
    """A proposal's targets in its audit entries: the ids, or for a job their count and digest."""
    if isinstance(action, RedriveJob):
        return jobs.targets_detail(targets)
    return {"targets": ",".join(map(str, targets))}


def _group(action: ReviewAction) -> Detail:
    return jobs.group_detail(action.group) if isinstance(action, RedriveJob) else {}


def _indexed(action: ReviewAction, targets: Sequence[int]) -> Sequence[int]:
    """The messages a proposal's entries are indexed under: a job's are not (up to 100,000 rows
    per entry); each of its messages gets its own `redriven` entry, naming the job, when redriven."""
    return () if isinstance(action, RedriveJob) else targets
