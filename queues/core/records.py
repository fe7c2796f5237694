"""The stored records: the values the port's tables hold, one msgspec layout each.

Array-like msgpack (field order is the format): a message's row is written at every lease, ack
and fail, on every replica, so it is small and cheap to encode; its payload stays in BODIES, and
the attempt history travels with the row (a lease appends an attempt, its ack closes it: one
write, not two). Changing a layout changes what every replica stores: append fields with
defaults, never reorder.

Must never: read state, clocks or anything but its arguments.
"""

from __future__ import annotations

from typing import Final

import msgspec

from queues.model import Phase


class Attempt(msgspec.Struct, frozen=True, array_like=True, gc=False):
    attempt: int
    token: int
    worker_id: str
    leased_ms: int
    ended_ms: int | None = None
    outcome: str | None = None
    error_class: str | None = None
    error_text: str | None = None


class MessageRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One message: what the lifecycle reads and writes. Its payload is in BODIES (the edited one,
    if any, in EDITED); `payload_len` is the current one's length (a follower's lease needs it
    for the result budget, not the bytes)."""

    id: int
    kind: str
    idempotency_key: str
    ref_key: str
    content_hash: bytes
    headers: bytes
    created_ms: int
    phase: Phase
    due_ms: int
    attempts: int
    budget_attempts: int
    budget_start_ms: int
    token: int
    token_open: bool
    payload_len: int
    request_id: int | None = None
    last_error_class: str | None = None
    last_error_text: str | None = None
    lease_worker: str | None = None
    lease_deadline_ms: int | None = None
    dead_ms: int | None = None
    dead_reason: str | None = None
    dead_error_class: str | None = None
    terminal_ms: int | None = None
    purge_ms: int | None = None
    edited: bool = False
    edited_hash: bytes | None = None
    version: int | None = None
    previous_id: int | None = None
    superseded_by: int | None = None
    in_doubt_until_ms: int | None = None
    """Until when a request an earlier delivery sent may still take effect (queues/core/in_doubt.py)."""
    amount: int | None = None
    """While dead: the current payload's integer `amount_minor` (queues.core.money), else None."""
    currency: str | None = None
    """While dead: the current payload's `currency` text, else None."""
    history: tuple[Attempt, ...] = ()


class Meta(msgspec.Struct, array_like=True, gc=False):
    """The counters every entry reads and writes once (mutable: the entry keeps one copy)."""

    applied_index: int = 0
    next_message_id: int = 1
    next_token: int = 1
    next_event_seq: int = 1
    rr_offset: int = 0
    clock_ms: int = 0
    access_version: int = 0
    audit_count: int = 0
    audit_head: bytes = bytes(32)
    next_group: int = 1
    next_proposal: int = 1
    next_job: int = 1


class EventRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    log_index: int
    ts_ms: int
    type: str
    message_id: int
    kind: str
    data: bytes
    """The event data as `queues.codec.encode_event_data` wrote it: compared byte for byte by the
    replica audit's digests."""


Sum = int | str
"""A sum of int64 amounts, which can leave what msgpack encodes (-2**63 to 2**64 - 1): an integer
within that range (so the rows of earlier versions read as they are), else its decimal text."""


def to_sum(value: int) -> Sum:
    return value if -(1 << 63) <= value < (1 << 64) else str(value)


def sum_of(stored: Sum) -> int:
    return stored if isinstance(stored, int) else int(stored)


class DeadGroup(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The dead letters of one (kind, error class, currency, has an amount): the tier's aggregate,
    kept as letters enter and leave it, so a summary over a million is a read of a few groups."""

    group: int
    count: int = 0
    total: Sum = 0
    """Sum of the amounts (has_amount groups), read through `sum_of`."""


class DeadEntry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The DEAD index's value: what amount and attempt filters read without the message's row."""

    amount: int | None
    attempts: int


class PauseRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    reason: str
    since_ms: int


class TokenRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    role: str
    secret_hash: bytes
    created_ms: int
    created_by: str
    revoked_ms: int | None = None
    rate_per_s: int | None = None
    burst: int | None = None


class DocumentRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    body: bytes
    updated_ms: int
    updated_by: str


class AuditRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    log_index: int
    ts_ms: int
    actor: str
    action: str
    target: str
    reason: str
    before: str
    after: str
    prev_hash: bytes
    hash: bytes


class ProposalRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    action: str
    body: bytes
    proposer: str
    reason: str
    targets: bytes
    created_ms: int
    expires_ms: int
    state: str
    decided_by: str | None = None
    decided_ms: int | None = None
    decision_reason: str | None = None


class JobRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    actor: str
    reason: str
    proposal_id: int | None
    approved_by: str | None
    state: str
    rate_per_s: int
    created_ms: int
    last_step_ms: int | None
    finished_ms: int | None
    rate_base: int
    controlled_by: str | None
    total: int
    pending: int
    redriven: int
    refused: int
    not_redriven: int


class JobItemRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    result: str
    code: str
    done_ms: int | None


class SessionRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    seq: int
    result: bytes
    touched_index: int


_encoder: Final = msgspec.msgpack.Encoder()
encode = _encoder.encode
message_decoder: Final = msgspec.msgpack.Decoder(MessageRecord)
meta_decoder: Final = msgspec.msgpack.Decoder(Meta)
event_decoder: Final = msgspec.msgpack.Decoder(EventRow)
group_decoder: Final = msgspec.msgpack.Decoder(DeadGroup)
dead_entry_decoder: Final = msgspec.msgpack.Decoder(DeadEntry)
pause_decoder: Final = msgspec.msgpack.Decoder(PauseRow)
token_decoder: Final = msgspec.msgpack.Decoder(TokenRow)
document_decoder: Final = msgspec.msgpack.Decoder(DocumentRow)
audit_decoder: Final = msgspec.msgpack.Decoder(AuditRow)
proposal_decoder: Final = msgspec.msgpack.Decoder(ProposalRow)
job_decoder: Final = msgspec.msgpack.Decoder(JobRow)
job_item_decoder: Final = msgspec.msgpack.Decoder(JobItemRow)
session_decoder: Final = msgspec.msgpack.Decoder(SessionRow)
int_decoder: Final = msgspec.msgpack.Decoder(int)
