"""Values of the compensation queue: states, commands, results, events and query views.

Owns: the typed, frozen shapes that cross the replicated log (commands in, results out) and the
event log (events out), with their limits as msgspec constraints, so decoding *is* validation
(the gateway rule: nothing downstream re-validates a decoded value's ranges).

Must never: import the machine, SQLite, a clock or a network module.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Annotated, Final

import msgspec

from delay.policy import DELAY_MAX_MS, ErrorClass, RetryPolicy
from queues.events import OPERATOR_EVENT_TYPES as OPERATOR_EVENT_TYPES
from queues.events import Event as Event
from queues.events import EventType as EventType
from queues.events import EventValue as EventValue
from queues.views import AttemptView as AttemptView
from queues.views import AuditEntry as AuditEntry
from queues.views import DeadLetterSummary as DeadLetterSummary
from queues.views import DocumentView as DocumentView

PAYLOAD_BYTES_MAX: Final = 256 * 1024
"""RocketMQ's and QMQ's message size limit: a compensation request is a small instruction."""
HEADERS_MAX: Final = 32
TEXT_LENGTH_MAX: Final = 4096
LEASE_COUNT_MAX: Final = 1000
LEASE_MS_MAX: Final = 24 * 3600 * 1000
LEASE_RESULT_BYTES_MAX: Final = 8 * 1024 * 1024
"""A lease result stops granting once its payloads reach this size (at least one is granted)."""
KINDS_PER_LEASE_MAX: Final = 64
BATCH_IDS_MAX: Final = 1000
TIME_MS_MAX: Final = 1 << 62

KindName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
RefKey = Annotated[str, msgspec.Meta(max_length=128)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Text = Annotated[str, msgspec.Meta(max_length=TEXT_LENGTH_MAX)]
Payload = Annotated[bytes, msgspec.Meta(max_length=PAYLOAD_BYTES_MAX)]
HeaderValue = Annotated[str, msgspec.Meta(max_length=1024)]
Headers = Annotated[dict[Name, HeaderValue], msgspec.Meta(max_length=HEADERS_MAX)]
MessageId = Annotated[int, msgspec.Meta(ge=1)]
Token = Annotated[int, msgspec.Meta(ge=1)]
TimeMs = Annotated[int, msgspec.Meta(ge=0, le=TIME_MS_MAX)]
DelayMs = Annotated[int, msgspec.Meta(ge=0, le=DELAY_MAX_MS)]
LeaseMs = Annotated[int, msgspec.Meta(ge=1, le=LEASE_MS_MAX)]
InDoubtMs = Annotated[int, msgspec.Meta(ge=0, le=LEASE_MS_MAX)]
"""A delivery's requests are in doubt at most until its lease's deadline: never longer than a lease."""
CountMax = Annotated[int, msgspec.Meta(ge=1, le=LEASE_COUNT_MAX)]
BatchLimit = Annotated[int, msgspec.Meta(ge=1, le=BATCH_IDS_MAX)]

BUILTIN_KINDS: Final = ("callback", "list_update", "transfer")
TOKENS_MAX: Final = 10_000
DOCUMENT_BYTES_MAX: Final = 64 * 1024
Namespace = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
PrincipalName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,31}$")]
"""Who holds a token: a calling service ("red-packet"), an operator or a process ("reconcile")."""
SecretHash = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
RatePerS = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
Burst = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
ERROR_CLASS_LEASE_EXPIRED: Final = "lease_expired"
ERROR_CLASS_INTERRUPTED: Final = "interrupted"
ERROR_CLASS_PAYLOAD_CORRUPT: Final = "payload_corrupt"
"""The error class QueueClient.lease fails an attempt with when the payload granted does not match
the content hash stored with it: retryable, so the next delivery (perhaps from another leader,
whose copy is intact) can succeed, and dead-lettered with this class when none can."""


class State(enum.Enum):
    DELAYED = "delayed"
    READY = "ready"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"
    DISCARDED = "discarded"


class Role(enum.Enum):
    """What a token's holder may do (the API's role matrix says where each is allowed)."""

    PRODUCER = "producer"
    """Submits requests and reads the ones it submitted."""
    OPERATOR = "operator"
    REVIEWER = "reviewer"
    APPROVER = "approver"
    ADMIN = "admin"
    VIEWER = "viewer"
    """Reads the review pages, dead letters and the audit, with personal data masked (ledger/masking.py)."""


class Phase(enum.IntEnum):
    """What is stored. WAITING is DELAYED or READY depending on due_ms against now_ms."""

    WAITING = 1
    LEASED = 2
    DONE = 3
    DEAD = 4
    DISCARDED = 5


def state_of(phase: Phase, due_ms: int, now_ms: int) -> State:
    if phase is Phase.WAITING:
        return State.READY if due_ms <= now_ms else State.DELAYED
    return _PHASE_STATE[phase]


_PHASE_STATE: Final = {
    Phase.LEASED: State.LEASED,
    Phase.DONE: State.DONE,
    Phase.DEAD: State.DEAD,
    Phase.DISCARDED: State.DISCARDED,
}


class Code(enum.IntEnum):
    """Result codes. Expected outcomes are values, never exceptions."""

    OK = 0
    EXISTS = 1
    """Enqueue: the idempotency key is known with the same content; the original id is returned."""
    CONFLICT = 2
    """Enqueue: the idempotency key is known with different content. PutDocument with an expected
    version: the namespace's version moved on since the writer read it."""
    NOT_FOUND = 3
    ILLEGAL_STATE = 4
    """The lifecycle table has no transition for (state, command)."""
    STALE_TOKEN = 5
    """The token is not the message's current lease: a newer grant fenced it off."""
    LEASE_EXPIRED = 6
    """The token was current but its lease expired (already counted as a failed attempt)."""
    UNKNOWN_KIND = 7
    INVALID = 8
    """Decoded, but the values contradict each other (e.g. a due time too far away)."""
    DECODE_ERROR = 9
    UNSUPPORTED_VERSION = 10
    ALREADY_ACKED = 11
    """Ack repeated with the token that acked the message: the first ack's answer, not an error."""
    ALREADY_PAUSED = 12
    NOT_PAUSED = 13
    DONE_ELSEWHERE = 14
    """Ack, fail, extend or release with the token of an earlier lease of a message another lease
    finished: that worker's delivery was a duplicate (at-least-once), its work needs nothing more.
    Not a lifecycle error: a worker that paused past its lease meets it in every fault run."""
    OWN_PROPOSAL = 15
    """Approve: the approver is the proposer. Four eyes are two people."""
    EXPIRED = 16
    """Approve or reject: the proposal's time ran out (it is expired now, and nothing was done)."""
    ROUTE_STALE = 17
    """Enqueue of a key this set does not hold, routed by an epoch older than the set's fence: the
    set table changed (a set was added); re-read it and route again (docs/sets.md)."""


Currency = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")]
AmountMinor = Annotated[int, msgspec.Meta(ge=0, le=TIME_MS_MAX)]
AttemptCount = Annotated[int, msgspec.Meta(ge=0, le=TIME_MS_MAX)]


class DeadLetterFilter(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):  # fmt: skip
    """Which dead letters a page, a summary, a filter redrive or a redrive job's selection means.

    Amount and currency are the current payload's (the edited one if `Redrive(payload=...)` set
    one) top-level JSON fields `amount_minor` (an integer) and `currency` (queues/core/money.py):
    the machine stays free of the kinds' vocabulary, and a payload without them does not match a
    filter on them. Unset fields are left out of the encoding, so a filter that uses none of the
    newer fields encodes as one from before them and an older node still reads it."""

    kind: KindName | None = None
    error_class: ErrorClass | None = None
    dead_from_ms: TimeMs | None = None
    """Inclusive."""
    dead_to_ms: TimeMs | None = None
    """Exclusive."""
    ref_key: RefKey | None = None
    currency: Currency | None = None
    amount_min_minor: AmountMinor | None = None
    """Inclusive."""
    amount_max_minor: AmountMinor | None = None
    """Inclusive."""
    attempts_min: AttemptCount | None = None
    """Inclusive: deliveries counted across redrives, as `MessageView.attempts`."""
    attempts_max: AttemptCount | None = None
    """Inclusive."""

    def __post_init__(self) -> None:
        # Raised here, a decode answers INVALID (msgspec turns it into a validation error), so an
        # empty range is refused at the edge instead of silently matching nothing.
        for low, high, name in (
            (self.amount_min_minor, self.amount_max_minor, "amount"),
            (self.attempts_min, self.attempts_max, "attempts"),
        ):  # not the dead-time bounds: an older entry in a log may hold an empty one, and must decode
            if low is not None and high is not None and low > high:
                raise ValueError(f"the {name} range is empty: its minimum is above its maximum")


# ---- commands -------------------------------------------------------------------------------
class _Command(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="t"):
    pass


class Enqueue(_Command, frozen=True, tag="enqueue"):
    kind: KindName
    idempotency_key: Key
    ref_key: RefKey
    payload: Payload
    headers: Headers = {}
    delay_ms: DelayMs = 0
    """Due at now_ms + delay_ms, unless due_ms is given."""
    due_ms: TimeMs | None = None
    """An absolute due time (at most DELAY_MAX_MS after now); a past time means ready now."""
    request_id: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)] = 0
    """Chosen by the client once per enqueue and kept across its retries (0: none). Enqueues travel
    without a session lane; a repeat of the key whose request_id is the original's is the same
    request retried, and answers OK as the first application did, not EXISTS."""
    route_epoch: Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)] = 0
    """The set-table epoch the client routed this key by (0: not routed, a single set). A set
    fenced at a newer epoch (`RouteFence`) refuses a key it does not hold with ROUTE_STALE. A node
    of the version before refuses the field (commands refuse unknown fields): upgrade the nodes
    before the API and other producers, as for any new command field."""


class Lease(_Command, frozen=True, tag="lease"):
    worker_id: Name
    count_max: CountMax
    lease_ms: LeaseMs
    kinds: Annotated[tuple[KindName, ...], msgspec.Meta(max_length=KINDS_PER_LEASE_MAX)] = ()
    """Empty: every registered kind."""
    probe: Name | None = None
    """A circuit breaker's holder name: its kinds are leased even though paused, as long as this
    holder is the only one that holds them (a probe of a recovering downstream, one at a time)."""


class ExtendLease(_Command, frozen=True, tag="extend"):
    message_id: MessageId
    token: Token
    lease_ms: LeaseMs


class Ack(_Command, frozen=True, tag="ack"):
    message_id: MessageId
    token: Token
    summary: Text = ""


class AckMany(_Command, frozen=True, tag="ack_many"):
    """A worker's batch of acks as one command: one session lane, one set-wise write.

    Each ack is judged exactly as a lone `Ack` would be, in order (a repeated id is
    ALREADY_ACKED the second time); the result has one `Outcome` per ack."""

    acks: Annotated[tuple[Ack, ...], msgspec.Meta(min_length=1, max_length=BATCH_IDS_MAX)]


class Fail(_Command, frozen=True, tag="fail"):
    message_id: MessageId
    token: Token
    error_class: ErrorClass
    error_text: Text = ""
    permanent: bool = False
    retry_after_ms: DelayMs | None = None  # the Retry-After: a duration the store adds to its own time, not a worker's clock
    not_before_ms: TimeMs | None = None  # the same as an absolute time, as older workers sent it: applied still (the later wins)
    in_doubt_ms: InDoubtMs | None = None
    """How long a request this delivery sent may still take effect downstream, as a duration the
    store adds to its own clock (capped at the lease's deadline): the retry is not due before then,
    and the next grant carries what remains (`Grant.in_doubt_ms`). 0: nothing it sent is in doubt.
    None: not reported; the store then assumes the lease's deadline for the next grant, and leaves
    the due time to the policy."""


class Release(_Command, frozen=True, tag="release"):
    """Hand a lease back (a worker draining on SIGTERM): the message is ready at once, and the
    delivery does not count against its attempt budget (it is in the history as released)."""

    message_id: MessageId
    token: Token
    interrupted: bool = False
    """The attempt had started and was cut off (the drain's grace ran out): its outcome downstream
    is unknown, so the next delivery is told so (`ERROR_CLASS_INTERRUPTED`) and checks first."""
    in_doubt_ms: InDoubtMs | None = None
    """As `Fail.in_doubt_ms`, for an interrupted attempt: ready once its requests can no longer take
    effect, rather than at once. Ignored unless `interrupted` (an attempt not started sent nothing)."""


class ExpireLeases(_Command, frozen=True, tag="expire"):
    limit: BatchLimit = BATCH_IDS_MAX


class Redrive(_Command, frozen=True, tag="redrive"):
    actor: Name
    reason: Text
    ids: Annotated[tuple[MessageId, ...], msgspec.Meta(max_length=BATCH_IDS_MAX)] = ()
    filter: DeadLetterFilter | None = None
    """Dead letters matching this filter (oldest first, up to limit), instead of ids."""
    limit: BatchLimit = 100
    payload: Payload | None = None
    """An edited payload (one id only); the original is kept beside it."""


class Discard(_Command, frozen=True, tag="discard"):
    message_id: MessageId
    actor: Name
    reason: Text
    """The operator's comment."""
    reason_code: Annotated[str, msgspec.Meta(max_length=64)] = ""
    """One of the review's reason codes (the API checks it against its list; the store records it)."""


VERSION_MAX: Final = 1000
"""Edits of one request at most: a chain of versions longer than this is a loop, not a review."""
VERSION_SUFFIX: Final = "#v"
"""A new version's idempotency key is its first version's key + "#v" + the version number."""
VersionedKey = Annotated[str, msgspec.Meta(min_length=1, max_length=128 + 8)]


class EditRedrive(_Command, frozen=True, tag="edit_redrive"):
    """Redrive a dead (or delayed) message as a new version with an edited payload.

    The store creates a new message (same kind and ref key, the payload given, a fresh attempt
    budget, idempotency key `<first version's key>#v<n>`) linked to the one it supersedes, which
    is kept unchanged but discarded (`superseded_by` names the new one), so exactly one version
    can ever be delivered. The payload is validated against the kind's schema at the edge (the
    API, the command line) before this is proposed: the store checks only what it can decide
    alone (the message exists, may be redriven, and the payload differs from the current one)."""

    message_id: MessageId
    payload: Payload
    actor: Name
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_LENGTH_MAX)]
    headers: Headers | None = None
    """The new version's headers (None: the original's)."""


JOB_IDS_MAX: Final = 100_000
"""Dead letters one redrive job may hold: a finance clean-up of a bulk failure, resolved by the caller."""
JOB_RATE_MAX: Final = 10_000
JobId = Annotated[int, msgspec.Meta(ge=1)]


GroupId = Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{32})?$")]
"""A bulk action's group over several sets (128 random bits as hex), or "" (none)."""


class RedriveJob(_Command, frozen=True, tag="redrive_job", omit_defaults=True):
    """Start a tracked bulk redrive of these dead letters (queues/jobs.py): stepped at most
    `rate_per_s` a second by the leader's time, cancellable, pausable, with a result per item.

    The caller resolves its filter to ids (`dead_letters` pages), so what runs is the list shown; submitted
    alone it starts at once, as a `Propose`'s action it starts in the `Approve` that releases it."""

    actor: Name
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_LENGTH_MAX)]
    ids: Annotated[tuple[MessageId, ...], msgspec.Meta(min_length=1, max_length=JOB_IDS_MAX)]
    rate_per_s: Annotated[int, msgspec.Meta(ge=1, le=JOB_RATE_MAX)]
    group: GroupId = ""
    """With several sets, the bulk action this set's part belongs to (docs/review.md): a set holds at most one
    job and one proposal of a group, so a repeated creation answers the part it holds; `renews`: the group's
    expired proposal in this set that this one replaces. Left out of the encoding when empty, as before."""
    renews: Annotated[int, msgspec.Meta(ge=0)] = 0


class StepJob(_Command, frozen=True, tag="step_job"):
    """Redrive a running job's next pending items, as many as its rate allows by this entry's time
    (at most `limit`): what the maintenance driver proposes; any number of drivers is safe."""

    job_id: JobId
    limit: BatchLimit = 300


class JobAction(enum.Enum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


class ControlJob(_Command, frozen=True, tag="control_job"):
    """Pause, resume or cancel a job (audited). A cancel marks every pending item not redriven."""

    job_id: JobId
    action: JobAction
    actor: Name
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_LENGTH_MAX)]


ReviewAction = Redrive | EditRedrive | Discard | RedriveJob
PROPOSAL_TTL_MS_MIN: Final = 60_000
PROPOSAL_TTL_MS_MAX: Final = 30 * 24 * 3600 * 1000
PROPOSALS_PENDING_MAX: Final = 10_000


class Propose(_Command, frozen=True, tag="propose"):
    """A four-eyes proposal: `action` is done only when a different person approves it.

    The proposer is the action's actor. A filter redrive is resolved to the ids it matches now and
    the proposal keeps those ids: the approver approves what was shown, never what matches later."""

    action: ReviewAction
    ttl_ms: Annotated[int, msgspec.Meta(ge=PROPOSAL_TTL_MS_MIN, le=PROPOSAL_TTL_MS_MAX)]


class Approve(_Command, frozen=True, tag="approve"):
    """Approve a pending proposal and perform its action in this same command: the approval and
    the action are one log entry, so no crash can leave one without the other."""

    proposal_id: Annotated[int, msgspec.Meta(ge=1)]
    approver: Name
    reason: Text = ""


class Reject(_Command, frozen=True, tag="reject"):
    """Reject a pending proposal (an approver), or withdraw it (its proposer): nothing is done."""

    proposal_id: Annotated[int, msgspec.Meta(ge=1)]
    actor: Name
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_LENGTH_MAX)]


class PauseKind(_Command, frozen=True, tag="pause"):
    kind: KindName
    holder: Name
    reason: Text = ""
    actor: Annotated[str, msgspec.Meta(max_length=128)] = ""
    """Who asked (recorded in the event); a holder may be a breaker acting for nobody."""


class ResumeKind(_Command, frozen=True, tag="resume"):
    kind: KindName
    holder: Name
    actor: Annotated[str, msgspec.Meta(max_length=128)] = ""


class SetPolicy(_Command, frozen=True, tag="set_policy"):
    """Registers the kind if it is new."""

    kind: KindName
    policy: RetryPolicy
    actor: Annotated[str, msgspec.Meta(max_length=128)] = ""
    reason: Text = ""


EVENTS_PURGE_MAX: Final = 10_000
"""Events one Purge deletes at most: with about three events per message they must go at several
times the tombstone rate, and the maintenance driver repeats a Purge that hit either limit."""


class Purge(_Command, frozen=True, tag="purge"):
    """Delete tombstones (done, discarded) whose retention ended, then the oldest events past
    theirs: both bounded, both driven by now_ms."""

    limit: BatchLimit = BATCH_IDS_MAX


RetentionMs = Annotated[int, msgspec.Meta(ge=1, le=DELAY_MAX_MS)]


class SetRetention(_Command, frozen=True, tag="set_retention"):
    """Change how long tombstones (the dedup window) and events are kept, at runtime, on every
    replica alike (a value in a config file could differ between replicas and split their states).
    A new tombstone retention applies to messages that end after it; a new event retention to the
    next Purge. Values under `QueueConfig.retention_floor_ms` are refused: a dedup window of
    minutes is one of the complaints this queue exists to answer."""

    actor: Name
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_LENGTH_MAX)]
    retention_ms: RetentionMs | None = None
    event_retention_ms: RetentionMs | None = None


class PutToken(_Command, frozen=True, tag="put_token"):
    """Create the named principal's token, or rotate it (a new secret, the old one stops working
    at once; a revoked token is live again). Only the secret's SHA-256 is ever in the log."""

    name: PrincipalName
    role: Role
    secret_hash: SecretHash
    actor: Name
    reason: Text = ""


class RevokeToken(_Command, frozen=True, tag="revoke_token"):
    name: PrincipalName
    actor: Name
    reason: Text = ""


class SetQuota(_Command, frozen=True, tag="set_quota"):
    """A principal's intake rate and burst (None: the API's configured default)."""

    name: PrincipalName
    actor: Name
    rate_per_s: RatePerS | None = None
    burst: Burst | None = None


class PutDocument(_Command, frozen=True, tag="put_document", omit_defaults=True):
    """Replace a settings document (queues/documents.py), or delete it with no body."""

    namespace: Namespace
    name: Name
    body: Annotated[bytes, msgspec.Meta(max_length=DOCUMENT_BYTES_MAX)] | None
    actor: Name
    reason: Text = ""
    expected_version: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Compare and set: the namespace's version the writer read; when it moved on since, nothing
    is written and the answer is CONFLICT with the version now (two operators adding sets at once
    cannot both write the set table). Omitted from the encoding when None (with `reason` when
    empty): a command without it decodes on a node of the version before."""


class RouteFence(_Command, frozen=True, tag="route_fence"):
    """Raise the set's minimum route epoch (never lower it): from now on the set refuses a key it
    does not hold when the enqueue was routed by an older epoch (docs/sets.md, "Fencing")."""

    epoch: Annotated[int, msgspec.Meta(ge=1, le=(1 << 31) - 1)]
    actor: Name
    reason: Text = ""


QueueCommand = (
    Enqueue | Lease | ExtendLease | Ack | AckMany | Fail | Release | ExpireLeases | Redrive | Discard
    | PauseKind | ResumeKind | SetPolicy | Purge | SetRetention | PutToken | RevokeToken | SetQuota | PutDocument
    | EditRedrive | Propose | Approve | Reject | RedriveJob | StepJob | ControlJob | RouteFence
)  # fmt: skip


# ---- results --------------------------------------------------------------------------------
# Commands refuse fields they do not know (a replica must not drop part of an intent in silence);
# results and grants ignore them, so a node of a newer version can add a field to an answer
# without breaking the clients of this one (they read what they know, as protobuf readers do).
class _Result(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    code: Code


class EnqueueResult(_Result, frozen=True, tag="enqueue"):
    message_id: int = 0
    state: State | None = None
    due_ms: int | None = None
    """When the message is (or was, for EXISTS) due."""


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    message_id: int
    token: int
    kind: str
    idempotency_key: str
    ref_key: str
    payload: bytes
    """The edited payload if an operator redrove with one, else the original."""
    headers: dict[str, str]
    attempt: int
    """1 for the first delivery; counts every delivery, across redrives."""
    due_ms: int
    """now_ms - due_ms is this delivery's lateness."""
    deadline_ms: int
    payload_hash: bytes = b""
    """`content_hash(kind, ref_key, payload)` as stored when the payload was written (at enqueue, or
    at an edited redrive), read from another row than the payload: QueueClient.lease checks it, so
    a payload corrupted at rest on the granting replica never reaches a handler. Empty for an
    edited payload written before grants carried hashes."""
    previous_error_class: str | None = None
    """How the delivery before this one ended (a fail's class, or lease_expired), None before the
    first: a handler checks downstream before repeating an effect whose outcome is unknown."""
    in_doubt_ms: int | None = None
    """How long, from this grant by the store's clock, a request sent by an earlier delivery may
    still take effect downstream: the latest in-doubt deadline the store knows of (what workers
    reported, else their leases' deadlines), minus the grant's time; negative once it has passed
    (by that much). None: no earlier delivery ended while it may have sent a request. A handler of
    a downstream that enforces expiry looks a request up only after this (plus the clock-skew
    bound) has passed on its own monotonic clock, counted from when the grant arrived."""
    budget_attempt: int = 1
    """This delivery's number within its attempt budget: 1 after an enqueue or a redrive (the
    first delivery finance released), 2 for the next, ... (a release does not count)."""


class LeaseResult(_Result, frozen=True, tag="lease"):
    grants: tuple[Grant, ...] = ()
    expired: int = 0
    """Leases found expired (and counted as failed attempts) by this command."""


class Outcome(_Result, frozen=True, tag="outcome"):
    """Extend, ack, fail, discard: the message's state after the command (or its current one)."""

    message_id: int = 0
    state: State | None = None
    due_ms: int | None = None
    deadline_ms: int | None = None
    detail: str = ""


class Outcomes(_Result, frozen=True, tag="outcomes"):
    """AckMany: one outcome per ack, in the order given."""

    outcomes: tuple[Outcome, ...] = ()


class BatchResult(_Result, frozen=True, tag="batch"):
    """Expire, purge, redrive: the ids touched."""

    ids: tuple[int, ...] = ()
    refused: tuple[tuple[int, Code], ...] = ()
    events_purged: int = 0
    """Purge only: events deleted past their retention."""


class KindResult(_Result, frozen=True, tag="kind"):
    """Pause, resume, set policy: the kind's holders after the command."""

    kind: str = ""
    holders: tuple[str, ...] = ()
    policy_before: RetryPolicy | None = None
    """Set policy: the policy the command replaced (None for a kind it registered)."""


class RetentionResult(_Result, frozen=True, tag="retention"):
    """Set retention: the values in force after the command."""

    retention_ms: int = 0
    event_retention_ms: int = 0


class TokenResult(_Result, frozen=True, tag="token"):
    """Put, revoke, quota: the token's state after the command and the access version, which
    API processes poll to see any change (a revocation) within their refresh interval."""

    name: str = ""
    role: Role | None = None
    revoked: bool = False
    version: int = 0


class DocumentResult(_Result, frozen=True, tag="document"):
    version: int = 0
    """The namespace's version after the command."""


class ProposalState(enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class ReviewResult(_Result, frozen=True, tag="review"):
    """Edit-redrive, propose, approve, reject: what was done, to which messages."""

    proposal_id: int = 0
    proposal_state: ProposalState | None = None
    ids: tuple[int, ...] = ()
    """Messages acted on (a proposal: the messages it would act on)."""
    refused: tuple[tuple[int, Code], ...] = ()
    """Messages the action could not be applied to, each with why: never counted as done."""
    new_ids: tuple[int, ...] = ()
    """An edit: the new version's message id."""
    detail: str = ""
    job_id: int | None = None
    """A redrive job started (directly or by the approval of its proposal) or controlled. A job's
    items are not echoed in `ids` (up to JOB_IDS_MAX): read them with `JobItems`."""


class JobState(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


class ItemResult(enum.Enum):
    PENDING = "pending"
    REDRIVEN = "redriven"
    REFUSED = "refused"
    """Its message could no longer be redriven (no longer dead, or gone): `code` says why."""
    NOT_REDRIVEN = "not_redriven"
    """The job was cancelled before it came to this item: the message was left as it was."""


class JobStepResult(_Result, frozen=True, tag="job_step"):
    """What one StepJob did: OK with nothing done when the rate allows nothing yet, ILLEGAL_STATE
    (nothing done) for a job that is not running, NOT_FOUND for no such job."""

    job_id: int = 0
    state: JobState | None = None
    """The job's state after the step (DONE once no item is pending)."""
    redriven: tuple[int, ...] = ()
    refused: tuple[tuple[int, Code], ...] = ()
    pending: int = 0
    next_step_ms: int | None = None
    """The leader time from which the rate allows the next item (None: the job is not running)."""


class RouteResult(_Result, frozen=True, tag="route"):
    """RouteFence: the set's minimum route epoch after it (OK). Enqueue: ROUTE_STALE, with the
    set's minimum route epoch, for a new key routed by an older epoch."""

    min_route_epoch: int = 0


class ErrorResult(_Result, frozen=True, tag="error"):
    """The command's bytes did not decode, or its values contradict each other."""

    detail: str = ""


QueueResult = (
    EnqueueResult | LeaseResult | Outcome | Outcomes | BatchResult | KindResult | RetentionResult | TokenResult
    | DocumentResult | ReviewResult | JobStepResult | RouteResult | ErrorResult
)


# ---- query views ----------------------------------------------------------------------------
class TokenView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    role: Role
    secret_hash: bytes
    created_ms: int
    created_by: str
    revoked_ms: int | None = None
    rate_per_s: int | None = None
    burst: int | None = None


class MessageView(msgspec.Struct, frozen=True, kw_only=True):
    message_id: int
    kind: str
    idempotency_key: str
    ref_key: str
    payload: bytes
    edited_payload: bytes | None
    headers: dict[str, str]
    created_ms: int
    state: State
    due_ms: int
    attempts: int
    last_error_class: str | None
    last_error_text: str | None
    token: int
    lease_worker: str | None
    lease_deadline_ms: int | None
    dead_ms: int | None
    dead_reason: str | None
    terminal_ms: int | None
    history: tuple[AttemptView, ...] = ()
    version: int = 1
    """1 for a request as submitted; an operator's edit makes version n + 1 as a new message."""
    previous_id: int | None = None
    """The version this one supersedes (None for the first)."""
    superseded_by: int | None = None
    """The version that superseded this one: this one was discarded by the edit, unchanged."""


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """A redrive job and its counters (total = pending + redriven + refused + not_redriven)."""

    job_id: int
    actor: str
    reason: str
    proposal_id: int | None
    approved_by: str | None
    state: JobState
    rate_per_s: int
    created_ms: int
    last_step_ms: int | None
    """The leader time of the last step that acted on an item (None before the first)."""
    finished_ms: int | None
    """When it became DONE or CANCELLED."""
    total: int
    pending: int
    redriven: int
    refused: int
    not_redriven: int
    next_step_ms: int | None = None
    """While running: the leader time from which the rate allows the next item (a driver proposes a
    step only then, so a slow job writes no empty entries)."""
    controlled_by: str | None = None
    """Who paused, resumed or cancelled it last."""


class JobItem(msgspec.Struct, frozen=True, kw_only=True):
    message_id: int
    result: ItemResult
    code: str
    """Why it was refused (a `Code` name), "cancelled" for NOT_REDRIVEN, else empty."""
    done_ms: int | None


class ProposalView(msgspec.Struct, frozen=True, kw_only=True):
    proposal_id: int
    action: str
    """redrive, edit_redrive, discard or redrive_job."""
    proposer: str
    reason: str
    targets: tuple[int, ...]
    created_ms: int
    expires_ms: int
    state: ProposalState
    """EXPIRED as soon as `expires_ms` is reached, whether or not a command recorded it yet."""
    decided_by: str | None = None
    decided_ms: int | None = None
    decision_reason: str | None = None
    body: bytes = b""
    """The action as proposed (queues.codec command bytes): an edit's payload, a discard's reason code."""


def content_hash(kind: str, ref_key: str, payload: bytes) -> bytes:
    """What makes two enqueues with one idempotency key 'the same' (headers are trace context).

    Stored with each message at enqueue, and with an edited payload at its redrive; the payload
    scrub (queries.scrub_payloads) and QueueClient.lease recompute it to detect corruption."""
    kind_b, ref_b = kind.encode(), ref_key.encode()
    framed = b"".join((len(kind_b).to_bytes(4, "big"), kind_b, len(ref_b).to_bytes(4, "big"), ref_b, payload))
    return hashlib.blake2b(framed, digest_size=16).digest()
