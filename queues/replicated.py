"""The queue machine as a raft_store node runs it: the factory and the read-query server.

    python -m raft_store run --id 1 --peer 1=h:p ... --data DIR --machine queues.replicated:machine_factory

Owns: `machine_factory(data_dir)` (the `module:factory` hook of raft_store's CLI) and
`ReplicatedQueueMachine.query(bytes) -> bytes`, which the node calls after a ReadIndex
(linearizable reads, on the leader) or at once (stale reads, on any replica), in its apply thread
between applies (never on its event loop: a summary over a large dead tier takes longer than the
election timeout).

Queries are not applied: they change nothing and are not replicated, so reading a clock here is
allowed (unlike in apply). The clock is the log's, as the node reads it (raft_store/log_clock.py,
handed over by `use_clock`), never the node's raw wall clock: a read must call "ready" exactly
what the next Lease would grant, or a worker waits on a node whose clock is behind the log's. A
caller may pin it with `now_ms` (a view "as of").

Must never: raise out of `query` (the node would answer a bare ERROR, not a `QueryError` the
client can read), or write.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from queues import access, audit_chain, documents, jobs, proposals, queries
from queues import query_codec as qc
from queues.machine import QueueConfig, QueueMachine
from queues.model import MessageView
from raft_store.files import private_dir

DB_NAME: Final = "queue.sqlite"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicatedQueueMachine(QueueMachine):
    """QueueMachine plus the read-query server the Raft node calls."""

    def __init__(
        self, path: str, config: QueueConfig | None = None, *, clock_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self._clock_ms = clock_ms
        """Outside a node (tests, tools) the wall clock; a node hands over the log's (`use_clock`)."""
        super().__init__(path, config)

    def use_clock(self, read_ms: Callable[[], int]) -> None:
        self._clock_ms = read_ms

    def query(self, data: bytes) -> bytes:
        """Answer one encoded query. Bad bytes or a failing query give a `QueryError` answer."""
        decoded = qc.decode_query(data)
        if isinstance(decoded, qc.QueryError):
            return qc.encode_answer(decoded)
        now_ms = decoded.now_ms if decoded.now_ms is not None else self._clock_ms()
        try:
            answer = answer_query(self.connection, decoded, now_ms, self.config)
        except Exception as error:  # a QueryError the client can read, not the node's bare ERROR
            answer = qc.QueryError(code=qc.QueryErrorCode.FAILED, detail=str(error)[:200], now_ms=now_ms)
        return qc.encode_answer(answer)


def _by_keys(conn: sqlite3.Connection, query: qc.ByIdempotencyKeys, now_ms: int) -> list[MessageView]:
    views: list[MessageView] = []
    for key in dict.fromkeys(query.keys):
        row = conn.execute("SELECT message_id FROM idempotency WHERE key = ?", (key,)).fetchone()
        if row is None:
            continue
        view = queries.get_message(conn, int(row[0]), now_ms=now_ms, with_history=query.with_history)
        if view is not None:
            views.append(view)
    return views


def answer_query(
    conn: sqlite3.Connection, query: qc.QueueQuery, now_ms: int, config: QueueConfig | None = None
) -> qc.QueryAnswer:
    """Pure over (tables, query, now_ms, config): the same answer on every replica at one applied index."""
    config = config or QueueConfig()
    match query:
        case qc.GetMessages():
            found = (
                queries.get_message(conn, message_id, now_ms=now_ms, with_history=query.with_history)
                for message_id in dict.fromkeys(query.ids)
            )
            return qc.MessagesAnswer(messages=tuple(v for v in found if v is not None), now_ms=now_ms)
        case qc.ByIdempotencyKeys():
            return qc.MessagesAnswer(messages=tuple(_by_keys(conn, query, now_ms)), now_ms=now_ms)
        case qc.ByRefKey():
            views = queries.by_ref_key(conn, query.ref_key, now_ms=now_ms, limit=query.limit)
            return qc.MessagesAnswer(messages=tuple(views), now_ms=now_ms)
        case qc.DeadLetters():
            page = queries.dead_letters(conn, query.filter, now_ms=now_ms, cursor=query.cursor, limit=query.limit)
            return qc.DeadLettersAnswer(items=page.items, next_cursor=page.next_cursor, now_ms=now_ms)
        case qc.DeadLetterSummary():
            return qc.DeadLetterSummaryAnswer(summary=queries.dead_letter_summary(conn, query.filter), now_ms=now_ms)
        case qc.Counts():
            counted = queries.counts(conn, now_ms=now_ms)
            return qc.CountsAnswer(
                counts=tuple(qc.KindStateCount(kind=c.kind, state=c.state, count=c.count) for c in counted),
                now_ms=now_ms,
            )
        case qc.OldestDueAge():
            return qc.OldestDueAnswer(ages_ms=queries.oldest_due_age_ms(conn, now_ms=now_ms), now_ms=now_ms)
        case qc.EventsAfter():
            events = queries.events_after(conn, query.seq, limit=query.limit)
            first = queries.first_event_seq(conn)
            return qc.EventsAnswer(events=tuple(events), first_seq=first, now_ms=now_ms)
        case qc.EventsDigest():
            last = queries.last_event_seq(conn)
            through = max(query.after, min(query.after + query.limit, last))
            count, digest = queries.events_digest(conn, query.after, through)
            return qc.DigestAnswer(
                first_seq=queries.first_event_seq(conn), last_seq=last, through=through, count=count, digest=digest,
                now_ms=now_ms,
            )
        case qc.ScrubPayloads():
            last_id = queries.last_message_id(conn)
            through = max(query.after, min(query.after + query.limit, last_id))
            checked, corrupt = queries.scrub_payloads(conn, query.after, through)
            return qc.ScrubAnswer(through=through, last_id=last_id, checked=checked, corrupt=tuple(corrupt), now_ms=now_ms)
        case qc.Kinds():
            return qc.KindsAnswer(kinds=tuple(queries.kinds(conn)), now_ms=now_ms)
        case qc.MessageEvents():
            return qc.MessageEventsAnswer(events=tuple(queries.message_events(conn, query.ids)), now_ms=now_ms)
        case qc.Tokens():
            version = access.version(conn)
            if version == query.known_version:
                return qc.TokensAnswer(version=version, changed=False, now_ms=now_ms)
            return qc.TokensAnswer(version=version, tokens=tuple(access.tokens(conn)), now_ms=now_ms)
        case qc.WorkDue():
            due = queries.work_due(conn, query.kinds, now_ms=now_ms)
            return qc.WorkDueAnswer(ready=due.ready, next_due_ms=due.next_due_ms, paused=due.paused,
                                    paused_ready=due.paused_ready, now_ms=now_ms)  # fmt: skip
        case qc.Documents():
            version = documents.version(conn, query.namespace)
            if version == query.known_version:
                return qc.DocumentsAnswer(version=version, changed=False, now_ms=now_ms)
            return qc.DocumentsAnswer(version=version, documents=tuple(documents.documents(conn, query.namespace)),
                                      now_ms=now_ms)  # fmt: skip
        case qc.MaintenanceDue():
            deadline, purge, oldest = queries.maintenance_due(conn)
            _, events_kept = queries.retention_in_force(
                conn, retention_ms=config.retention_ms, event_retention_ms=config.event_retention_ms
            )
            return qc.MaintenanceDueAnswer(
                lease_deadline_ms=deadline, purge_ms=purge, oldest_event_ms=oldest, event_retention_ms=events_kept,
                now_ms=now_ms,
            )
        case qc.AuditLog():
            if query.after is not None:
                entries = audit_chain.entries_after(conn, query.after, limit=query.limit, selected=query.filter)
            else:
                entries = audit_chain.entries_before(conn, query.before, limit=query.limit, selected=query.filter)
            head = audit_chain.head(conn)
            return qc.AuditAnswer(entries=tuple(entries), count=head.count, head=head.hash, now_ms=now_ms)
        case qc.MessageAudit():
            index = audit_chain.message_index(conn, query.ids)
            entries = audit_chain.entries_at(conn, [seq for seq, _ in index])
            return qc.AuditAnswer(entries=tuple(entries), concerns=tuple(index), now_ms=now_ms)
        case qc.Proposals():
            if query.ids:
                listed = proposals.get(conn, query.ids, now_ms=now_ms)
            else:
                listed = proposals.listing(
                    conn, now_ms=now_ms, pending_only=query.pending_only, before_id=query.before_id, limit=query.limit
                )
            return qc.ProposalsAnswer(proposals=tuple(listed), now_ms=now_ms)
        case qc.Jobs():
            job_views = jobs.listing(conn, ids=query.ids, active_only=query.active_only, before_id=query.before_id,
                                     limit=query.limit)  # fmt: skip
            return qc.JobsAnswer(jobs=tuple(job_views), now_ms=now_ms)
        case qc.JobItems():
            job_items = jobs.items(conn, query.job_id, after_message_id=query.after_message_id, limit=query.limit,
                                   result=query.result)  # fmt: skip
            return qc.JobItemsAnswer(items=tuple(job_items), now_ms=now_ms)
        case qc.Retention():
            kept, events_kept = queries.retention_in_force(
                conn, retention_ms=config.retention_ms, event_retention_ms=config.event_retention_ms
            )
            return qc.RetentionAnswer(
                retention_ms=kept, event_retention_ms=events_kept, floor_ms=config.retention_floor_ms, now_ms=now_ms
            )


def machine_factory(data_dir: Path) -> ReplicatedQueueMachine:
    """`--machine queues.replicated:machine_factory`: one SQLite file in the node's data dir."""
    data_dir = Path(data_dir)
    private_dir(data_dir)
    return ReplicatedQueueMachine(str(data_dir / DB_NAME))
