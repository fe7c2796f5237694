"""Bytes <-> typed values for the queue's read queries (served by `ReplicatedQueueMachine.query`).

Owns: the wire format of a read: one version byte (QUERY_CODEC_VERSION), then a msgspec msgpack
tagged union (field "q" for requests, "r" for answers). A query is not in the log: it is answered
by one replica, after a ReadIndex (linearizable) or at once (stale, from a follower), with the
applied index the answer reflects. Decoding is strict; `decode_query` never raises on bad bytes,
it returns the `QueryError` to answer with.

Must never: read state, clocks or anything but its argument.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final, cast

import msgspec

from delay.policy import RetryPolicy
from queues import model
from queues.audit_filter import AuditFilter
from queues.model import (
    KINDS_PER_LEASE_MAX,
    AuditEntry,
    DeadLetterFilter,
    DocumentView,
    Event,
    ItemResult,
    JobItem,
    JobView,
    KindName,
    MessageId,
    MessageView,
    Namespace,
    ProposalView,
    RefKey,
    State,
    TimeMs,
    TokenView,
    VersionedKey,
)

QUERY_CODEC_VERSION: Final = 1
_VERSION_BYTE: Final = bytes([QUERY_CODEC_VERSION])
IDS_PER_QUERY_MAX: Final = 1000
PAGE_LIMIT_MAX: Final = 1000
EVENTS_LIMIT_MAX: Final = 10_000

PageLimit = Annotated[int, msgspec.Meta(ge=1, le=PAGE_LIMIT_MAX)]


# ---- requests -------------------------------------------------------------------------------
class _Query(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="q"):
    now_ms: TimeMs | None = None
    """The time that decides delayed versus ready; None: the answering replica's clock."""


class GetMessages(_Query, frozen=True, tag="messages"):
    """Messages by id (missing ids are left out), each with its attempt history if asked."""

    ids: Annotated[tuple[MessageId, ...], msgspec.Meta(min_length=1, max_length=IDS_PER_QUERY_MAX)]
    with_history: bool = True


class ByIdempotencyKeys(_Query, frozen=True, tag="by_keys"):
    """The message each idempotency key maps to (keys unknown or purged are left out)."""

    keys: Annotated[tuple[VersionedKey, ...], msgspec.Meta(min_length=1, max_length=IDS_PER_QUERY_MAX)]
    """A caller's key, or an edited version's (`<key>#v<n>`)."""
    with_history: bool = False


class ByRefKey(_Query, frozen=True, tag="by_ref"):
    """Every message of one business id, oldest first, with attempt history."""

    ref_key: RefKey
    limit: PageLimit = PAGE_LIMIT_MAX


class DeadLetters(_Query, frozen=True, tag="dead"):
    filter: DeadLetterFilter = DeadLetterFilter()
    cursor: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    limit: PageLimit = 100


class DeadLetterSummary(_Query, frozen=True, tag="dead_summary"):
    """How many dead letters match the filter, their amounts per currency and the oldest
    (answered with a `model.DeadLetterSummary`)."""

    filter: DeadLetterFilter = DeadLetterFilter()


class Counts(_Query, frozen=True, tag="counts"):
    """Messages per (kind, state)."""


class OldestDueAge(_Query, frozen=True, tag="oldest_due"):
    """Per kind with ready messages: how long its oldest ready message has waited past due."""


class EventsAfter(_Query, frozen=True, tag="events"):
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=EVENTS_LIMIT_MAX)] = 1000


class EventsDigest(_Query, frozen=True, tag="events_digest"):
    """A digest of the events with seq in (after, after + limit], as this replica stores them.

    Events are the replicated record of every effect, identical on every replica once applied,
    and never rewritten: comparing their digests across replicas (queues/audit.py) detects a
    replica whose state diverged (a nondeterministic apply, mixed software versions, a corrupted
    store) without stopping anything. `limit` 0 asks only for the bounds."""

    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=0, le=EVENTS_LIMIT_MAX)] = EVENTS_LIMIT_MAX


class ScrubPayloads(_Query, frozen=True, tag="scrub"):
    """Recompute the content hash of each message with id in (after, after + limit] from the kind,
    ref key and payload this replica stores, and name those that do not match the hash stored at
    enqueue (or with an edited payload). Events carry no payload bytes, so the replica audit's
    digests cannot see a corrupted payload at rest; this can (QueueClient.lease checks at use)."""

    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=EVENTS_LIMIT_MAX)] = 1000


class Retention(_Query, frozen=True, tag="retention"):
    """The tombstone and event retentions in force (SetRetention's, else the config's)."""


class Kinds(_Query, frozen=True, tag="kinds"):
    """Every registered kind with its retry policy and who holds it paused, and why."""


class MessageEvents(_Query, frozen=True, tag="message_events"):
    """The operator events (dead-lettered, redriven, discarded) of these messages, in log order:
    what a request's timeline needs beyond its row and attempt history. Read through a partial
    index; events purged past their retention are gone here too."""

    ids: Annotated[tuple[MessageId, ...], msgspec.Meta(min_length=1, max_length=IDS_PER_QUERY_MAX)]


class Tokens(_Query, frozen=True, tag="tokens"):
    """Every API token (hashes, never secrets), unless the access version is still `known_version`:
    then only the version, so a cache polls with one small read."""

    known_version: Annotated[int, msgspec.Meta(ge=-1)] = -1


class WorkDue(_Query, frozen=True, tag="work_due"):
    """Which of these kinds (empty: every kind) have a message ready, and when the next delayed one
    is due: what an idle worker asks before it leases, so that waiting for work is a read, never
    a log entry. Paused kinds are left out of both."""

    kinds: Annotated[tuple[KindName, ...], msgspec.Meta(max_length=KINDS_PER_LEASE_MAX)] = ()


class Documents(_Query, frozen=True, tag="documents"):
    """A namespace's settings documents, unless its version is still `known_version`."""

    namespace: Namespace
    known_version: Annotated[int, msgspec.Meta(ge=-1)] = -1


class MaintenanceDue(_Query, frozen=True, tag="maintenance_due"):
    """When the next lease expires, the next tombstone's retention ends and the oldest event was
    written: the maintenance driver proposes ExpireLeases and Purge only once one is due."""


class AuditLog(_Query, frozen=True, tag="audit", omit_defaults=True):
    """A page of the operator audit chain (queues/audit_chain.py) with its head: forward from
    `after` (a verifier walks the chain so), else newest first below `before` (None: the newest),
    of the entries `filter` selects. Defaults are left out of the encoding, so a query without a
    filter is the same bytes as before filters existed and any node answers it."""

    after: Annotated[int, msgspec.Meta(ge=0)] | None = None
    before: Annotated[int, msgspec.Meta(ge=1)] | None = None
    limit: PageLimit = 100
    filter: AuditFilter | None = None


class MessageAudit(_Query, frozen=True, tag="message_audit"):
    """Every audit entry that concerns these messages, in chain order: kept forever, unlike events."""

    ids: Annotated[tuple[MessageId, ...], msgspec.Meta(min_length=1, max_length=IDS_PER_QUERY_MAX)]


class Proposals(_Query, frozen=True, tag="proposals"):
    """Four-eyes proposals: these ids, else newest first below `before_id` (pending ones only if asked)."""

    ids: Annotated[tuple[Annotated[int, msgspec.Meta(ge=1)], ...], msgspec.Meta(max_length=IDS_PER_QUERY_MAX)] = ()
    pending_only: bool = False
    before_id: Annotated[int, msgspec.Meta(ge=1)] | None = None
    limit: PageLimit = 100


class Jobs(_Query, frozen=True, tag="jobs"):
    """Redrive jobs (queues/jobs.py) with their counters: these ids, else newest first below
    `before_id` (running and paused ones only, if asked: what the maintenance driver steps)."""

    ids: Annotated[tuple[Annotated[int, msgspec.Meta(ge=1)], ...], msgspec.Meta(max_length=IDS_PER_QUERY_MAX)] = ()
    active_only: bool = False
    before_id: Annotated[int, msgspec.Meta(ge=1)] | None = None
    limit: PageLimit = 100


class JobItems(_Query, frozen=True, tag="job_items"):
    """A job's items in message-id order after `after_message_id`, of one result if asked."""

    job_id: Annotated[int, msgspec.Meta(ge=1)]
    after_message_id: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: PageLimit = 100
    result: ItemResult | None = None


class JobGroup(_Query, frozen=True, tag="job_group"):
    """A bulk action's part in this set: the job and the proposal that carry `group`, if any."""

    group: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}$")]


QueueQuery = (
    GetMessages | ByIdempotencyKeys | ByRefKey | DeadLetters | DeadLetterSummary | Counts | OldestDueAge | EventsAfter
    | EventsDigest | ScrubPayloads | Retention | Kinds | MessageEvents | Tokens | WorkDue | MaintenanceDue | Documents
    | AuditLog | MessageAudit | Proposals | Jobs | JobItems | JobGroup
)  # fmt: skip


# ---- answers --------------------------------------------------------------------------------
class QueryErrorCode(enum.IntEnum):
    DECODE_ERROR = 1
    INVALID = 2
    UNSUPPORTED_VERSION = 3
    FAILED = 4
    """The query decoded but could not be answered (e.g. a bad cursor); see detail."""


class _Answer(msgspec.Struct, frozen=True, kw_only=True, tag_field="r"):
    """Unknown fields are ignored, as in queues.model's results: a newer node may add one."""

    now_ms: int = 0
    """The time the answer's states were computed at."""


class MessagesAnswer(_Answer, frozen=True, tag="messages"):
    messages: tuple[MessageView, ...] = ()


class DeadLettersAnswer(_Answer, frozen=True, tag="dead"):
    items: tuple[MessageView, ...] = ()
    next_cursor: str | None = None


class DeadLetterSummaryAnswer(_Answer, frozen=True, tag="dead_summary"):
    summary: model.DeadLetterSummary = model.DeadLetterSummary()


class KindStateCount(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    state: State
    count: int


class CountsAnswer(_Answer, frozen=True, tag="counts"):
    counts: tuple[KindStateCount, ...] = ()


class OldestDueAnswer(_Answer, frozen=True, tag="oldest_due"):
    ages_ms: dict[str, int] = {}


class RetentionAnswer(_Answer, frozen=True, tag="retention"):
    retention_ms: int = 0
    event_retention_ms: int = 0
    floor_ms: int = 0
    """The shortest value SetRetention accepts."""


class EventsAnswer(_Answer, frozen=True, tag="events"):
    events: tuple[Event, ...] = ()
    first_seq: int = 1
    """The oldest event kept (see `queries.first_event_seq`): a gap after the asked seq shows here."""


class DigestAnswer(_Answer, frozen=True, tag="events_digest"):
    first_seq: int = 1
    """The oldest event kept (older ones were purged past their retention)."""
    last_seq: int = 0
    """The newest event this replica has applied (0: none yet)."""
    through: int = 0
    """The last seq the digest covers: min(after + limit, last_seq), or `after` when that is less."""
    count: int = 0
    """Events the digest covers (through - after when none in the range was purged)."""
    digest: bytes = b""


class ScrubAnswer(_Answer, frozen=True, tag="scrub"):
    through: int = 0
    """The last id of the range checked: min(after + limit, last_id), or `after` when that is less."""
    last_id: int = 0
    """The newest message id this replica has assigned (purged messages leave holes below it)."""
    checked: int = 0
    corrupt: tuple[int, ...] = ()
    """Ids whose stored payload (or its row) does not match the content hash stored with them."""


class PauseView(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    reason: str
    since_ms: int


class KindView(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    policy: RetryPolicy
    pauses: tuple[PauseView, ...] = ()


class KindsAnswer(_Answer, frozen=True, tag="kinds"):
    kinds: tuple[KindView, ...] = ()


class MessageEventsAnswer(_Answer, frozen=True, tag="message_events"):
    events: tuple[Event, ...] = ()


class TokensAnswer(_Answer, frozen=True, tag="tokens"):
    version: int = 0
    changed: bool = True
    """False: the version is the one the caller knew, and `tokens` is empty."""
    tokens: tuple[TokenView, ...] = ()


class WorkDueAnswer(_Answer, frozen=True, tag="work_due"):
    ready: dict[str, int] = {}
    """Kind -> the due time of its oldest ready message, for the unpaused kinds with one."""
    next_due_ms: int | None = None
    """The earliest due time after now among the unpaused kinds asked (None: nothing delayed)."""
    paused: dict[str, tuple[str, ...]] = {}
    """Paused kind -> its holders (a breaker probes a kind only it holds)."""
    paused_ready: tuple[str, ...] = ()
    """Paused kinds with a message ready: what a probe could lease."""


class MaintenanceDueAnswer(_Answer, frozen=True, tag="maintenance_due"):
    lease_deadline_ms: int | None = None
    purge_ms: int | None = None
    oldest_event_ms: int | None = None
    event_retention_ms: int = 0


class DocumentsAnswer(_Answer, frozen=True, tag="documents"):
    version: int = 0
    changed: bool = True
    documents: tuple[DocumentView, ...] = ()


class AuditAnswer(_Answer, frozen=True, tag="audit"):
    entries: tuple[AuditEntry, ...] = ()
    count: int = 0
    """Entries in the chain (the newest one's seq), as the head records it."""
    head: bytes = b""
    """The newest entry's hash, as the head records it."""
    concerns: tuple[tuple[int, int], ...] = ()
    """For `MessageAudit`: (seq, message id) for each asked message an entry is indexed under,
    in chain order (empty from a node from before it was answered)."""


class ProposalsAnswer(_Answer, frozen=True, tag="proposals"):
    proposals: tuple[ProposalView, ...] = ()


class JobsAnswer(_Answer, frozen=True, tag="jobs"):
    jobs: tuple[JobView, ...] = ()


class JobItemsAnswer(_Answer, frozen=True, tag="job_items"):
    items: tuple[JobItem, ...] = ()


class JobGroupAnswer(_Answer, frozen=True, tag="job_group"):
    job_id: int | None = None
    proposal_id: int | None = None


class QueryError(_Answer, frozen=True, tag="error"):
    code: QueryErrorCode
    detail: str = ""


QueryAnswer = (
    MessagesAnswer | DeadLettersAnswer | DeadLetterSummaryAnswer | CountsAnswer | OldestDueAnswer | EventsAnswer
    | DigestAnswer | ScrubAnswer | RetentionAnswer | KindsAnswer | MessageEventsAnswer | TokensAnswer | WorkDueAnswer
    | MaintenanceDueAnswer | DocumentsAnswer | AuditAnswer | ProposalsAnswer | JobsAnswer | JobItemsAnswer
    | JobGroupAnswer
    | QueryError
)  # fmt: skip

_encoder: Final = msgspec.msgpack.Encoder()
_query_decoder: Final = msgspec.msgpack.Decoder(QueueQuery)
_answer_decoder: Final = msgspec.msgpack.Decoder(QueryAnswer)


def encode_query(query: QueueQuery) -> bytes:
    return _VERSION_BYTE + _encoder.encode(query)


def decode_query(data: bytes) -> QueueQuery | QueryError:
    """The query, or the error to answer with. Never raises on bad bytes."""
    if not data:
        return QueryError(code=QueryErrorCode.DECODE_ERROR, detail="empty query")
    if data[0] != QUERY_CODEC_VERSION:
        return QueryError(code=QueryErrorCode.UNSUPPORTED_VERSION, detail=f"query codec version {data[0]}")
    try:
        return cast(QueueQuery, _query_decoder.decode(memoryview(data)[1:]))
    except msgspec.ValidationError as error:
        return QueryError(code=QueryErrorCode.INVALID, detail=str(error)[:200])
    except msgspec.DecodeError as error:
        return QueryError(code=QueryErrorCode.DECODE_ERROR, detail=str(error)[:200])


def encode_answer(answer: QueryAnswer) -> bytes:
    return _VERSION_BYTE + _encoder.encode(answer)


def decode_answer(data: bytes) -> QueryAnswer:
    """Answers come from our own machine: anything else is a programmer error and raises."""
    if not data or data[0] != QUERY_CODEC_VERSION:
        raise ValueError(f"not a queue query answer: {data[:16]!r}")
    return cast(QueryAnswer, _answer_decoder.decode(memoryview(data)[1:]))
