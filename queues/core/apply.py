"""Applying one log entry: commands in, results and state changes out.

`apply_entry` is the whole of what a replica does with a committed entry's commands: decode each
(bad bytes are answered with an ErrorResult, never raised: a raise would roll back the entry on
every replica), run it through its client's session, dispatch it to its rule, encode the result,
and write what the entry counted. Everything goes through the storage port it is given, at the
entry's own time; nothing here reads a clock or does I/O.

`respond=False`: no client waits for these results (a follower's apply, a replay after a restart).
A lease then reads no payloads, and a command without a session lane is not encoded at all (its
result is b""): the state, and what a session keeps for retries, are exactly the same.

Must never: read a clock, raise on a command's bytes, or let two replicas of one log differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from queues import codec
from queues.core import access, delivery, documents, jobs, keys, operator, review, sessions
from queues.core.enqueue import enqueue
from queues.core.entry import Catalog, Entry, load_meta
from queues.core.port import KvWrite, Table
from queues.core.records import encode
from queues.model import (
    Ack,
    AckMany,
    Approve,
    BatchResult,
    Code,
    ControlJob,
    Discard,
    EditRedrive,
    Enqueue,
    ErrorResult,
    ExpireLeases,
    ExtendLease,
    Fail,
    Lease,
    LeaseResult,
    PauseKind,
    Propose,
    Purge,
    PutDocument,
    PutToken,
    QueueCommand,
    QueueResult,
    Redrive,
    RedriveJob,
    Reject,
    Release,
    ResumeKind,
    RevokeToken,
    RouteFence,
    SetPolicy,
    SetQuota,
    SetRetention,
    StepJob,
)
from raft_store.state_machine import Command

_NOT_READ: Final = b""


def run(entry: Entry, command: QueueCommand) -> QueueResult:
    """The rule of one decoded command."""
    match command:
        case Enqueue():
            return enqueue(entry, command)
        case Lease():
            return delivery.lease(entry, command)
        case ExtendLease():
            return delivery.extend(entry, command)
        case Ack():
            return delivery.ack(entry, command)
        case AckMany():
            return delivery.ack_many(entry, command)
        case Fail():
            return delivery.fail(entry, command)
        case Release():
            return delivery.release(entry, command)
        case ExpireLeases():
            return BatchResult(code=Code.OK, ids=tuple(delivery.expire_due(entry, command.limit)))
        case Redrive():
            return operator.redrive(entry, command)
        case Discard():
            return operator.discard(entry, command)
        case PauseKind():
            return operator.pause(entry, command)
        case ResumeKind():
            return operator.resume(entry, command)
        case SetPolicy():
            return operator.set_policy(entry, command)
        case Purge():
            return operator.purge(entry, command)
        case SetRetention():
            return operator.set_retention(entry, command)
        case PutToken():
            return access.put_token(entry, command)
        case RevokeToken():
            return access.revoke_token(entry, command)
        case SetQuota():
            return access.set_quota(entry, command)
        case PutDocument():
            return documents.put(entry, command)
        case EditRedrive():
            return review.edit_redrive(entry, command)
        case Propose():
            return review.propose(entry, command)
        case Approve():
            return review.approve(entry, command)
        case Reject():
            return review.reject(entry, command)
        case RedriveJob():
            return review.start_job(entry, command)
        case StepJob():
            return jobs.step(entry, command)
        case ControlJob():
            return jobs.control(entry, command)
        case RouteFence():
            return operator.route_fence(entry, command)


def _apply_one(entry: Entry, data: bytes) -> tuple[bytes, QueueResult | ErrorResult]:
    decoded = codec.decode_command(data)
    result = decoded if isinstance(decoded, ErrorResult) else run(entry, decoded)
    return codec.encode_result(result), result


def _session_record(result: bytes, decoded: QueueResult | ErrorResult) -> bytes:
    """What the session keeps of a result: a lease as its (message id, token) pairs."""
    if isinstance(decoded, LeaseResult):
        grants = tuple((grant.message_id, grant.token) for grant in decoded.grants)
        return sessions.LEASE_SESSION + sessions.lease_session_encoder.encode(
            sessions.LeaseSession(expired=decoded.expired, grants=grants)
        )
    return result


def _replay(entry: Entry, stored: bytes) -> bytes:
    """The answer to a retried command, from what its session kept."""
    if not stored.startswith(sessions.LEASE_SESSION):
        return stored
    session = sessions.lease_session_decoder.decode(stored[len(sessions.LEASE_SESSION) :])
    grants = [grant for message_id, token in session.grants if (grant := delivery.regrant(entry, message_id, token))]
    return codec.encode_result(LeaseResult(code=Code.OK, grants=tuple(grants), expired=session.expired))


def _in_session(entry: Entry, command: Command) -> bytes:
    if command.client_id == 0:  # sessionless: exactly-once by the command's own key
        if not entry.responding:
            decoded = codec.decode_command(command.data)
            if not isinstance(decoded, ErrorResult):
                run(entry, decoded)
            return _NOT_READ
        return _apply_one(entry, command.data)[0]
    tx = entry.tx
    last = sessions.load(tx, command.client_id)
    if last is not None:
        if command.seq == last.seq:
            return _replay(entry, last.result)
        if command.seq < last.seq:
            return sessions.SESSION_RESULT_STALE
    result, value = _apply_one(entry, command.data)
    sessions.store(tx, command.client_id, command.seq, _session_record(result, value), entry.index, last)
    return result


def apply_entry(
    tx: KvWrite, index: int, now_ms: int, commands: Sequence[Command], catalog: Catalog, *, respond: bool = True
) -> list[bytes]:
    """Apply the commands of log entry `index`, stamped `now_ms`: one result per command."""
    entry = Entry(tx, index, now_ms, catalog, responding=respond)
    results = [_in_session(entry, command) for command in commands]
    entry.finish()
    if index % sessions.SESSION_EVICT_EVERY == 0:
        sessions.evict(tx)
    return results


def note_applied(tx: KvWrite, index: int) -> None:
    """Entry `index` carried no commands (a no-op or a membership change): only the index moves."""
    meta = load_meta(tx)
    meta.applied_index = index
    tx.put(Table.META, keys.STATE, encode(meta))
