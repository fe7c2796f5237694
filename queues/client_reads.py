"""The queue client's reads: queries answered by a replica's state, never through the log.

Owns: encoding queries (queues.query_codec), decoding their answers into the model's typed
views, and `Read`, the value with the applied index and the log's time it reflects. Linearizable
by default (ReadIndex on the leader); `stale_ok=True` asks `reader` without a ReadIndex round.
`QueueClient` (queues/client.py) adds the commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from queues import query_codec as qc
from queues.audit_filter import AuditFilter
from queues.model import (
    AuditEntry,
    DeadLetterFilter,
    DeadLetterSummary,
    ErrorResult,
    Event,
    ItemResult,
    JobItem,
    JobView,
    MessageView,
    ProposalView,
)
from raft_store.client import LongPoll, RaftClient

T = TypeVar("T")


class QueueError(Exception):
    """The machine refused the command's bytes or values (DECODE_ERROR, INVALID, ...)."""

    def __init__(self, result: ErrorResult | qc.QueryError | str) -> None:
        self.result = result
        super().__init__(result if isinstance(result, str) else f"{result.code.name}: {result.detail}")


@dataclass(frozen=True, slots=True)
class Read(Generic[T]):
    value: T
    applied_index: int
    """The replica's applied index when it answered: the state the value reflects."""
    now_ms: int
    """The time the states in the value were computed at (delayed versus ready)."""



class QueueReads:
    """The queries: linearizable through the leader by default, or from `reader` with `stale_ok`."""

    raft: RaftClient
    reader: RaftClient

    async def node_statuses(self) -> list[dict[str, Any]]:
        """Each configured node's Raft status (role, term, commit, applied, ...), or its error:
        what readiness probes and `compensator status` show. Never raises."""
        found: list[dict[str, Any]] = []
        for host, port in list(self.raft.addresses):
            try:
                status = await self.raft.status((host, port))
            except Exception as error:  # one unreachable node is an answer here, not a failure
                status = {"error": f"{type(error).__name__}: {error}"}
            found.append({"address": f"{host}:{port}", **status})
        return found

    async def query(self, query: qc.QueueQuery, *, stale_ok: bool = False, wait: LongPoll | None = None) -> Read[qc.QueryAnswer]:
        client = self.reader if stale_ok else self.raft  # `wait`: a long poll (RaftClient.read), stale only
        raw, applied = await client.read(qc.encode_query(query), linearizable=not stale_ok, wait=wait)
        answer = qc.decode_answer(raw)
        if isinstance(answer, qc.QueryError):
            raise QueueError(answer)
        return Read(answer, applied, answer.now_ms)

    async def _ask(self, query: qc.QueueQuery, kind: type[T], stale_ok: bool) -> Read[T]:
        read = await self.query(query, stale_ok=stale_ok)
        if not isinstance(read.value, kind):
            raise QueueError(f"expected {kind.__name__}, got {type(read.value).__name__}")
        return Read(read.value, read.applied_index, read.now_ms)

    async def get(self, message_id: int, *, stale_ok: bool = False) -> Read[MessageView | None]:
        read = await self.get_many([message_id], stale_ok=stale_ok)
        return Read(read.value[0] if read.value else None, read.applied_index, read.now_ms)

    async def get_many(
        self, ids: Sequence[int], *, with_history: bool = True, stale_ok: bool = False
    ) -> Read[tuple[MessageView, ...]]:
        read = await self._ask(qc.GetMessages(ids=tuple(ids), with_history=with_history), qc.MessagesAnswer, stale_ok)
        return Read(read.value.messages, read.applied_index, read.now_ms)

    async def by_idempotency_keys(
        self, keys: Sequence[str], *, with_history: bool = False, stale_ok: bool = False
    ) -> Read[tuple[MessageView, ...]]:
        query = qc.ByIdempotencyKeys(keys=tuple(keys), with_history=with_history)
        read = await self._ask(query, qc.MessagesAnswer, stale_ok)
        return Read(read.value.messages, read.applied_index, read.now_ms)

    async def by_ref_key(self, ref_key: str, *, stale_ok: bool = False) -> Read[tuple[MessageView, ...]]:
        read = await self._ask(qc.ByRefKey(ref_key=ref_key), qc.MessagesAnswer, stale_ok)
        return Read(read.value.messages, read.applied_index, read.now_ms)

    async def dead_letters(
        self, dead_filter: DeadLetterFilter | None = None, *, cursor: str | None = None, limit: int = 100,
        stale_ok: bool = False,
    ) -> Read[qc.DeadLettersAnswer]:
        query = qc.DeadLetters(filter=dead_filter or DeadLetterFilter(), cursor=cursor, limit=limit)
        return await self._ask(query, qc.DeadLettersAnswer, stale_ok)

    async def dead_letter_summary(
        self, dead_filter: DeadLetterFilter | None = None, *, stale_ok: bool = False
    ) -> Read[DeadLetterSummary]:
        """How many dead letters match, their amounts per currency and the oldest: one aggregate on
        the answering replica, so sizing a bulk redrive never pages through the letters."""
        read = await self._ask(qc.DeadLetterSummary(filter=dead_filter or DeadLetterFilter()),
                               qc.DeadLetterSummaryAnswer, stale_ok)  # fmt: skip
        return Read(read.value.summary, read.applied_index, read.now_ms)

    async def counts(self, *, stale_ok: bool = False) -> Read[dict[tuple[str, str], int]]:
        read = await self._ask(qc.Counts(), qc.CountsAnswer, stale_ok)
        return Read({(c.kind, c.state.value): c.count for c in read.value.counts}, read.applied_index, read.now_ms)

    async def oldest_due_age_ms(self, *, stale_ok: bool = False) -> Read[dict[str, int]]:
        read = await self._ask(qc.OldestDueAge(), qc.OldestDueAnswer, stale_ok)
        return Read(dict(read.value.ages_ms), read.applied_index, read.now_ms)

    async def work_due(self, kinds: Sequence[str] = (), *, stale_ok: bool = True) -> Read[qc.WorkDueAnswer]:
        """Which kinds have work ready, and when the next is due: a read (stale by default: the
        leader's applied state, no ReadIndex round), so an idle worker writes nothing."""
        return await self._ask(qc.WorkDue(kinds=tuple(kinds)), qc.WorkDueAnswer, stale_ok)

    async def documents(self, namespace: str, *, known_version: int = -1, stale_ok: bool = False) -> Read[qc.DocumentsAnswer]:
        """A namespace's settings documents, or only its version when it is still `known_version`."""
        return await self._ask(qc.Documents(namespace=namespace, known_version=known_version), qc.DocumentsAnswer, stale_ok)

    async def maintenance_due(self, *, stale_ok: bool = True) -> Read[qc.MaintenanceDueAnswer]:
        return await self._ask(qc.MaintenanceDue(), qc.MaintenanceDueAnswer, stale_ok)

    async def kinds(self, *, stale_ok: bool = False) -> Read[tuple[qc.KindView, ...]]:
        read = await self._ask(qc.Kinds(), qc.KindsAnswer, stale_ok)
        return Read(read.value.kinds, read.applied_index, read.now_ms)

    async def message_events(self, ids: Sequence[int], *, stale_ok: bool = False) -> Read[tuple[Event, ...]]:
        """The operator events (dead-lettered, redriven, discarded) of these messages, in log order."""
        read = await self._ask(qc.MessageEvents(ids=tuple(ids)), qc.MessageEventsAnswer, stale_ok)
        return Read(read.value.events, read.applied_index, read.now_ms)

    async def tokens(self, *, known_version: int = -1, stale_ok: bool = False) -> Read[qc.TokensAnswer]:
        """Every token, or only the access version when it is still `known_version`."""
        return await self._ask(qc.Tokens(known_version=known_version), qc.TokensAnswer, stale_ok)

    async def retention(self, *, stale_ok: bool = False) -> Read[qc.RetentionAnswer]:
        """The tombstone and event retentions in force, and the floor SetRetention enforces."""
        return await self._ask(qc.Retention(), qc.RetentionAnswer, stale_ok)

    async def events_after(
        self, seq: int, *, limit: int = 1000, stale_ok: bool = False, wait: LongPoll | None = None
    ) -> Read[tuple[Event, ...]]:
        """The events after `seq`, in order. Raises EventsPurged when some of them are gone. With
        `wait` (stale only): a long poll, answered with the events once something applied."""
        read = await self.query(qc.EventsAfter(seq=seq, limit=limit), stale_ok=stale_ok or wait is not None, wait=wait)
        if not isinstance(read.value, qc.EventsAnswer):
            raise QueueError(f"expected EventsAnswer, got {type(read.value).__name__}")
        if seq + 1 < read.value.first_seq:
            raise EventsPurged(seq, read.value.first_seq)
        return Read(read.value.events, read.applied_index, read.now_ms)

    async def events_digest(
        self, after: int, limit: int = qc.EVENTS_LIMIT_MAX, *, stale_ok: bool = False
    ) -> Read[qc.DigestAnswer]:
        """The digest of the events in (after, after + limit] as the reading replica stores them,
        with its first and last event seq (queues/audit.py compares these across replicas)."""
        return await self._ask(qc.EventsDigest(after=after, limit=limit), qc.DigestAnswer, stale_ok)

    async def scrub_payloads(self, after: int, limit: int = 1000, *, stale_ok: bool = False) -> Read[qc.ScrubAnswer]:
        """Which messages in (after, after + limit] the reading replica stores with a payload that
        no longer matches its content hash (queues/audit.py runs this on every replica)."""
        return await self._ask(qc.ScrubPayloads(after=after, limit=limit), qc.ScrubAnswer, stale_ok)

    async def audit_log(
        self, *, after: int | None = None, before: int | None = None, limit: int = 100,
        audit_filter: AuditFilter | None = None, stale_ok: bool = False,
    ) -> Read[qc.AuditAnswer]:  # fmt: skip
        """A page of the audit chain with its head: forward from `after`, else newest first below
        `before` (None: the newest), of the entries `audit_filter` selects (filtered in the store,
        so the page is full and `before` = its last seq pages on)."""
        query = qc.AuditLog(after=after, before=before, limit=limit, filter=audit_filter)
        return await self._ask(query, qc.AuditAnswer, stale_ok)

    async def message_audit(self, ids: Sequence[int], *, stale_ok: bool = False) -> Read[tuple[AuditEntry, ...]]:
        """Every audit entry that concerns these messages, in chain order (a request's timeline)."""
        read = await self.message_audit_with_ids(ids, stale_ok=stale_ok)
        return Read(tuple(entry for entry, _ in read.value), read.applied_index, read.now_ms)

    async def message_audit_with_ids(
        self, ids: Sequence[int], *, stale_ok: bool = False
    ) -> Read[tuple[tuple[AuditEntry, tuple[int, ...]], ...]]:
        """The same entries, each with the ids (of those asked) it concerns: a ref key's timeline
        places an approval of three requests under each of them, an edit under both versions."""
        read = await self._ask(qc.MessageAudit(ids=tuple(ids)), qc.AuditAnswer, stale_ok)
        concerns: dict[int, list[int]] = {}
        for seq, message_id in read.value.concerns:
            concerns.setdefault(seq, []).append(message_id)
        entries = tuple((entry, tuple(concerns.get(entry.seq, ()))) for entry in read.value.entries)
        return Read(entries, read.applied_index, read.now_ms)

    async def proposals(
        self,
        *,
        ids: Sequence[int] = (),
        pending_only: bool = False,
        before_id: int | None = None,
        limit: int = 100,
        stale_ok: bool = False,
    ) -> Read[tuple[ProposalView, ...]]:
        query = qc.Proposals(ids=tuple(ids), pending_only=pending_only, before_id=before_id, limit=limit)
        read = await self._ask(query, qc.ProposalsAnswer, stale_ok)
        return Read(read.value.proposals, read.applied_index, read.now_ms)

    async def jobs(
        self, *, ids: Sequence[int] = (), active_only: bool = False, before_id: int | None = None, limit: int = 100,
        stale_ok: bool = False,
    ) -> Read[tuple[JobView, ...]]:  # fmt: skip
        """Redrive jobs with their counters: these ids, else newest first below `before_id`."""
        query = qc.Jobs(ids=tuple(ids), active_only=active_only, before_id=before_id, limit=limit)
        read = await self._ask(query, qc.JobsAnswer, stale_ok)
        return Read(read.value.jobs, read.applied_index, read.now_ms)

    async def job_group(self, group: str, *, stale_ok: bool = False) -> Read[tuple[int | None, int | None]]:
        """This set's part of a bulk action's group: (its job id, its proposal id), each None if absent."""
        read = await self._ask(qc.JobGroup(group=group), qc.JobGroupAnswer, stale_ok)
        return Read((read.value.job_id, read.value.proposal_id), read.applied_index, read.now_ms)

    async def job_items(
        self, job_id: int, *, after_message_id: int = 0, limit: int = 100, result: ItemResult | None = None,
        stale_ok: bool = False,
    ) -> Read[tuple[JobItem, ...]]:  # fmt: skip
        """A page of a job's items in message-id order (pass the last id back as `after_message_id`)."""
        query = qc.JobItems(job_id=job_id, after_message_id=after_message_id, limit=limit, result=result)
        read = await self._ask(query, qc.JobItemsAnswer, stale_ok)
        return Read(read.value.items, read.applied_index, read.now_ms)


class EventsPurged(Exception):
    """Events after the reader's position were deleted past their retention: the reader must
    decide (rebuild its projection, or accept the gap from `first_seq` on), never skip silently."""

    def __init__(self, after: int, first_seq: int) -> None:
        super().__init__(f"events {after + 1}-{first_seq - 1} were purged past their retention; the oldest kept is {first_seq}")
        self.after = after
        self.first_seq = first_seq


