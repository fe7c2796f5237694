"""Finance review in the state machine: edit-and-redrive as a new version, four-eyes proposals and
their approval, and the audit entry each operator event becomes.

Why one apply per decision: an approval and the action it releases are one replicated command,
and so is every action and its audit entry. Everything here runs inside the machine's apply of
one command (`queues.machine._Apply`), on every replica, from the leader's time: a crash can
leave neither an approved proposal whose action was not done nor an action nobody approved.

Refusals change nothing: before an approval is recorded, every target is checked with the same
rules the action applies (`refusal`), and an approval that would do nothing is refused whole;
the targets that can be acted on are done, the others are reported, never counted as done.

Must never: read a clock, validate a payload against a kind's schema (the edge does, before it
proposes: the machine stays free of the API's vocabulary), or decide who needs four eyes (the
API's configuration does; the store enforces what it can decide alone: a different approver, in
time).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec

from queues import codec, jobs, proposals
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
)

if TYPE_CHECKING:
    from queues.machine import _Apply, _Row

AUDIT_PAYLOAD_BYTES_MAX: Final = 16 * 1024
"""A payload goes into an audit entry as text up to this size (a request is a small JSON
instruction), and as its SHA-256 beyond it or when it is not UTF-8."""

Detail = dict[str, EventValue]


@dataclass(frozen=True, slots=True)
class AuditFields:
    actor: str
    action: str
    target: str
    reason: str
    before: Detail
    after: Detail


_AFTER_STATE: Final = {EventType.REDRIVEN: State.READY.value, EventType.DISCARDED: State.DISCARDED.value}
_NOT_DETAIL: Final = frozenset({"actor", "reason"})


def _target(type_: EventType, message_id: int, kind: str, data: Detail) -> str:
    if message_id:
        return f"message:{message_id}"
    if type_ in (EventType.TOKEN_PUT, EventType.TOKEN_REVOKED, EventType.QUOTA_SET):
        return f"token:{data.get('name')}"
    if type_ is EventType.DOCUMENT_PUT:
        return f"document:{data.get('namespace')}/{data.get('name')}"
    if kind:
        return f"kind:{kind}"
    return "retention" if type_ is EventType.RETENTION_SET else type_.value


def audit_of_event(type_: EventType, message_id: int, kind: str, data: Detail) -> AuditFields:
    """An operator event as an audit entry: `actor` and `reason` as they are; `from_state`, `before`
    and every `<name>_before` go to before (as `state`, `body` and `<name>`), the rest to after."""
    before: Detail = {}
    after: Detail = {}
    for name, value in data.items():
        if name in _NOT_DETAIL:
            continue
        if name == "from_state":
            before["state"] = value
        elif name == "before":
            before["body"] = value
        elif name == "after":
            after["body"] = value
        elif name.endswith("_before"):
            before[name.removesuffix("_before")] = value
        else:
            after[name] = value
    if type_ in _AFTER_STATE:
        after["state"] = _AFTER_STATE[type_]
    actor = str(data.get("actor") or "system")
    return AuditFields(actor, type_.value, _target(type_, message_id, kind, data), str(data.get("reason") or ""),
                       before, after)  # fmt: skip


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


@dataclass(frozen=True, slots=True)
class _Current:
    """What an edit reads of the message it supersedes."""

    key: str
    ref_key: str
    headers: bytes
    payload: bytes
    version: int


class Review:
    """The review commands' effects, on one `_Apply` (one command inside one log entry's apply)."""

    def __init__(self, apply: _Apply) -> None:
        self.apply = apply
        self.conn = apply.conn
        self.now_ms = apply.now_ms

    # ---- refusals, shared by the actions and by the approval that runs them ------------------
    def refusal(self, action: ReviewAction, message_id: int) -> Code | None:
        """Why `action` cannot be applied to this message now (None: it can)."""
        row = self.apply.load_current(message_id)
        if row is None:
            return Code.NOT_FOUND
        state = row.state(self.now_ms)
        if isinstance(action, Discard):
            return Code.ILLEGAL_STATE if isinstance(transition(state, Action.DISCARD), Code) else None
        if isinstance(transition(state, Action.REDRIVE), Code):
            return Code.ILLEGAL_STATE
        if isinstance(action, EditRedrive):
            return self.edit_refusal(row, action)
        return None

    def judge(self, action: ReviewAction, targets: list[int]) -> tuple[list[int], list[tuple[int, Code]]]:
        """(the targets the action can be applied to now, the others with why), in the order given.
        A job's up to 100,000 targets are judged in one statement (`jobs.judge`)."""
        if isinstance(action, RedriveJob):
            return jobs.judge(self.conn, targets)
        refused = [(target, code) for target in targets if (code := self.refusal(action, target)) is not None]
        unable = {target for target, _ in refused}
        return [target for target in targets if target not in unable], refused

    def current(self, message_id: int) -> _Current:
        key, ref_key, headers, payload, version = self.conn.execute(
            "SELECT idempotency_key, ref_key, headers,"
            " coalesce(edited_payload, (SELECT payload FROM bodies WHERE bodies.id = messages.id)), version"
            " FROM messages WHERE id = ?",
            (message_id,),
        ).fetchone()
        return _Current(str(key), str(ref_key), bytes(headers), bytes(payload), int(version or 1))

    def edit_refusal(self, row: _Row, action: EditRedrive) -> Code | None:
        current = self.current(row.id)
        if current.version >= VERSION_MAX:
            return Code.INVALID
        if action.payload == current.payload:
            return Code.INVALID  # nothing edited: that is a redrive
        holder = self.apply.lookup_key(versioned_key(current.key, current.version, current.version + 1))
        if holder is not None and (holder[4] is None or holder[4] > self.now_ms):
            return Code.CONFLICT  # a live request already holds the new version's key
        return None

    # ---- edit and redrive ------------------------------------------------------------------
    def edit_redrive(self, command: EditRedrive, approval: Detail | None = None) -> ReviewResult:
        refused = self.refusal(command, command.message_id)
        if refused is not None:
            detail = "the payload is unchanged, or the message has too many versions" if refused is Code.INVALID else ""
            return ReviewResult(code=refused, refused=((command.message_id, refused),), detail=detail)
        row = self.apply.load(command.message_id)
        assert row is not None
        state = row.state(self.now_ms)
        current = self.current(row.id)
        version = current.version + 1
        new_key = versioned_key(current.key, current.version, version)
        new_id = self._insert_version(row, current, command, version, new_key)
        self._supersede(row, new_id)
        self.apply.emit(
            EventType.DISCARDED, row.id, row.kind,
            {"actor": command.actor, "reason": command.reason, "from_state": state.value, "reason_code": "superseded",
             "superseded_by": new_id, **(approval or {})},
        )  # fmt: skip
        self.apply.emit(
            EventType.ENQUEUED, new_id, row.kind,
            {"idempotency_key": new_key, "ref_key": current.ref_key, "due_ms": self.now_ms, "previous_id": row.id,
             "version": version},
        )  # fmt: skip
        self.apply.audit(
            actor=command.actor, action="edit_redrive", target=f"message:{row.id}", reason=command.reason,
            before={"state": state.value, "version": current.version, "payload": payload_for_audit(current.payload)},
            after={"state": State.DISCARDED.value, "superseded_by": new_id, "new_version": version,
                   "new_idempotency_key": new_key, "payload": payload_for_audit(command.payload), **(approval or {})},
            message_ids=(row.id, new_id),
        )  # fmt: skip
        return ReviewResult(code=Code.OK, ids=(row.id,), new_ids=(new_id,))

    def _insert_version(self, row: _Row, current: _Current, command: EditRedrive, version: int, key: str) -> int:
        batch, now_ms = self.apply.batch, self.now_ms
        new_id = batch.next_message_id
        batch.next_message_id += 1
        headers = current.headers if command.headers is None else codec.encode_headers(command.headers)
        self.conn.execute(
            "INSERT INTO messages (id, kind, idempotency_key, ref_key, content_hash, headers, created_ms, phase, due_ms,"
            " attempts, budget_attempts, budget_start_ms, token, token_open, version, previous_id)"
            " VALUES (?,?,?,?,?,?,?,?,?,0,0,?,0,0,?,?)",
            (new_id, row.kind, key, current.ref_key, content_hash(row.kind, current.ref_key, command.payload), headers,
             now_ms, int(Phase.WAITING), now_ms, now_ms, version, row.id),
        )  # fmt: skip
        self.conn.execute("INSERT INTO bodies (id, payload) VALUES (?, ?)", (new_id, command.payload))
        batch.keys[key] = new_id
        batch.move(row.kind, None, Phase.WAITING)
        return new_id

    def _supersede(self, row: _Row, new_id: int) -> None:
        """The original is kept as it was (payload, history), discarded so it can never be
        delivered again, and names its successor."""
        self.apply.batch.move(row.kind, row.phase, Phase.DISCARDED)
        self.conn.execute(
            "UPDATE messages SET phase = ?, token_open = 0, terminal_ms = ?, purge_ms = ?, dead_ms = NULL,"
            " superseded_by = ? WHERE id = ?",
            (Phase.DISCARDED, self.now_ms, self.now_ms + self.apply.machine.retention(self.conn)[0], new_id, row.id),
        )

    # ---- proposals -------------------------------------------------------------------------
    def propose(self, command: Propose) -> ReviewResult:
        action = command.action
        if isinstance(action, Redrive):
            if action.payload is not None:
                return ReviewResult(code=Code.INVALID, detail="propose an edit as an edit_redrive")
            targets = self.apply.redrive_targets(action)
            if not isinstance(targets, list):
                return ReviewResult(code=targets.code, detail=targets.detail)
            if not targets:
                return ReviewResult(code=Code.NOT_FOUND, detail="no message matches")
        elif isinstance(action, RedriveJob):
            targets = sorted(set(action.ids))
        else:
            targets = [action.message_id]
        able, refused = self.judge(action, targets)
        if not able:
            return ReviewResult(code=refused[0][1], refused=tuple(refused), detail="nothing the action could do")
        if isinstance(action, Redrive):  # the ids shown, never what a filter matches later
            action = msgspec.structs.replace(action, ids=tuple(able), filter=None)
        if isinstance(action, RedriveJob):
            action = msgspec.structs.replace(action, ids=tuple(able))
        expires_ms = self.now_ms + command.ttl_ms
        proposal_id = proposals.insert(
            self.conn, action=action, targets=able, now_ms=self.now_ms, expires_ms=expires_ms
        )
        if proposal_id is None:
            return ReviewResult(code=Code.INVALID, detail="too many proposals are pending")
        after: Detail = {"state": ProposalState.PENDING.value, "action": proposals.action_name(action),
                         **_targets(action, able), "expires_ms": expires_ms}  # fmt: skip
        if isinstance(action, EditRedrive):
            after["payload"] = payload_for_audit(action.payload)
        if isinstance(action, Discard):
            after["reason_code"] = action.reason_code
        if isinstance(action, RedriveJob):
            after["rate_per_s"] = action.rate_per_s
        self.apply.audit(
            actor=action.actor, action="propose", target=f"proposal:{proposal_id}", reason=action.reason, before={},
            after=after, message_ids=_indexed(action, able),
        )  # fmt: skip
        shown = () if isinstance(action, RedriveJob) else tuple(able)  # a job's items: read with JobItems
        return ReviewResult(code=Code.OK, proposal_id=proposal_id, proposal_state=ProposalState.PENDING,
                            ids=shown, refused=tuple(refused))  # fmt: skip

    def _open(self, proposal_id: int, actor: str) -> proposals.Proposal | ReviewResult:
        """The pending proposal, or the result that refuses the command. A proposal found past its
        expiry is recorded as expired (with its audit entry) and refused with EXPIRED."""
        found = proposals.load(self.conn, proposal_id)
        if found is None:
            return ReviewResult(code=Code.NOT_FOUND, proposal_id=proposal_id)
        state = found.state(self.now_ms)
        if state is ProposalState.EXPIRED and found.view.state is ProposalState.PENDING:
            proposals.decide(self.conn, proposal_id, ProposalState.EXPIRED, by="", now_ms=self.now_ms, reason="expired")
            self.apply.audit(
                actor="system", action="expire", target=f"proposal:{proposal_id}",
                reason=f"expired at {found.view.expires_ms}, found so by {actor}",
                before={"state": ProposalState.PENDING.value}, after={"state": ProposalState.EXPIRED.value},
                message_ids=_indexed(found.action, found.view.targets),
            )  # fmt: skip
        if state is not ProposalState.PENDING:
            code = Code.EXPIRED if state is ProposalState.EXPIRED else Code.ILLEGAL_STATE
            return ReviewResult(code=code, proposal_id=proposal_id, proposal_state=state)
        return found

    def approve(self, command: Approve) -> ReviewResult:
        found = self._open(command.proposal_id, command.approver)
        if isinstance(found, ReviewResult):
            return found
        if command.approver == found.view.proposer:
            return ReviewResult(code=Code.OWN_PROPOSAL, proposal_id=command.proposal_id,
                                proposal_state=ProposalState.PENDING, detail="the proposer cannot approve")  # fmt: skip
        action = found.action
        if isinstance(action, RedriveJob) and jobs.full(self.conn):
            return ReviewResult(code=Code.INVALID, proposal_id=command.proposal_id, proposal_state=ProposalState.PENDING,
                                detail=f"{jobs.JOBS_ACTIVE_MAX} jobs are running or paused already")  # fmt: skip
        able, refused = self.judge(action, list(found.view.targets))
        if not able:  # nothing would be done: no approval is recorded either
            return ReviewResult(code=refused[0][1], proposal_id=command.proposal_id,
                                proposal_state=ProposalState.PENDING, refused=tuple(refused),
                                detail="no target can be acted on any more")  # fmt: skip
        proposals.decide(self.conn, command.proposal_id, ProposalState.APPROVED, by=command.approver,
                         now_ms=self.now_ms, reason=command.reason)  # fmt: skip
        self.apply.audit(
            actor=command.approver, action="approve", target=f"proposal:{command.proposal_id}", reason=command.reason,
            before={"state": ProposalState.PENDING.value},
            after={"state": ProposalState.APPROVED.value, "proposer": found.view.proposer,
                   "action": found.view.action, **_targets(action, able)},
            message_ids=_indexed(action, able),
        )  # fmt: skip
        approval: Detail = {"proposal": command.proposal_id, "approved_by": command.approver}
        if isinstance(action, RedriveJob):  # the job starts in this apply: never approved-but-not-started
            started = jobs.create(self.apply, action, able, refused, approval)
            assert started.code is Code.OK, started  # `able` is not empty and there is room: checked above
            return msgspec.structs.replace(started, proposal_id=command.proposal_id,
                                           proposal_state=ProposalState.APPROVED)  # fmt: skip
        result = self._perform(action, able, approval)
        return msgspec.structs.replace(result, proposal_id=command.proposal_id, proposal_state=ProposalState.APPROVED,
                                   refused=tuple(refused) + result.refused)  # fmt: skip

    def _perform(self, action: Redrive | EditRedrive | Discard, targets: list[int], approval: Detail) -> ReviewResult:
        match action:
            case Redrive():
                done = self.apply.redrive(msgspec.structs.replace(action, ids=tuple(targets), filter=None), approval)
                assert not isinstance(done, ErrorResult), done  # ids given: the shape is valid
                return ReviewResult(code=Code.OK, ids=done.ids, refused=done.refused)
            case EditRedrive():
                return self.edit_redrive(action, approval)
            case Discard():
                outcome = self.apply.discard(action, approval)
                assert outcome.code is Code.OK, outcome  # checked by `refusal` in this same apply
                return ReviewResult(code=Code.OK, ids=(action.message_id,))

    def reject(self, command: Reject) -> ReviewResult:
        found = self._open(command.proposal_id, command.actor)
        if isinstance(found, ReviewResult):
            return found
        proposals.decide(self.conn, command.proposal_id, ProposalState.REJECTED, by=command.actor, now_ms=self.now_ms,
                         reason=command.reason)  # fmt: skip
        withdrawn = command.actor == found.view.proposer
        self.apply.audit(
            actor=command.actor, action="withdraw" if withdrawn else "reject", target=f"proposal:{command.proposal_id}",
            reason=command.reason, before={"state": ProposalState.PENDING.value},
            after={"state": ProposalState.REJECTED.value, "proposer": found.view.proposer},
            message_ids=_indexed(found.action, found.view.targets),
        )  # fmt: skip
        return ReviewResult(code=Code.OK, proposal_id=command.proposal_id, proposal_state=ProposalState.REJECTED)

    # ---- redrive jobs ----------------------------------------------------------------------
    def start_job(self, command: RedriveJob) -> ReviewResult:
        """A job submitted directly (its actor needs no second person: the API decides that)."""
        able, refused = self.judge(command, sorted(set(command.ids)))
        return jobs.create(self.apply, command, able, refused)


def _targets(action: ReviewAction, targets: Sequence[int]) -> Detail:
    """A proposal's targets in its audit entries: the ids, or for a job their count and digest."""
    if isinstance(action, RedriveJob):
        return jobs.targets_detail(targets)
    return {"targets": ",".join(map(str, targets))}


def _indexed(action: ReviewAction, targets: Sequence[int]) -> Sequence[int]:
    """The messages a proposal's entries are indexed under: a job's are not (up to 100,000 rows
    per entry); each of its messages gets its own `redriven` entry, naming the job, when redriven."""
    return () if isinstance(action, RedriveJob) else targets
