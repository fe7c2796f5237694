"""Answering a read query: `queues.query_codec` requests in, answers out, from one consistent view.

Pure over (the state, the query, now_ms, the config): every replica at one applied index gives the
same answer. The node calls this on its apply thread between applies (never on its event loop: a
page of a large dead tier takes longer than the election timeout), through
`ReplicatedQueueMachine.query`, which turns a failing query into a `QueryError` the client reads.

Must never: write, or read a clock (now_ms is the caller's).
"""

from __future__ import annotations

from queues import query_codec as qc
from queues.core import access, audit_chain, documents, jobs, proposals, reads
from queues.core.config import QueueConfig
from queues.core.port import KvRead


def answer_query(view: KvRead, query: qc.QueueQuery, now_ms: int, config: QueueConfig | None = None) -> qc.QueryAnswer:
    config = config or QueueConfig()
    match query:
        case qc.GetMessages():
            found = (reads.get_message(view, message_id, now_ms=now_ms, with_history=query.with_history)
                     for message_id in dict.fromkeys(query.ids))  # fmt: skip
            return qc.MessagesAnswer(messages=tuple(v for v in found if v is not None), now_ms=now_ms)
        case qc.ByIdempotencyKeys():
            views = reads.by_idempotency_keys(view, query.keys, now_ms=now_ms, with_history=query.with_history)
            return qc.MessagesAnswer(messages=tuple(views), now_ms=now_ms)
        case qc.ByRefKey():
            views = reads.by_ref_key(view, query.ref_key, now_ms=now_ms, limit=query.limit)
            return qc.MessagesAnswer(messages=tuple(views), now_ms=now_ms)
        case qc.DeadLetters():
            page = reads.dead_letters(view, query.filter, now_ms=now_ms, cursor=query.cursor, limit=query.limit)
            return qc.DeadLettersAnswer(items=page.items, next_cursor=page.next_cursor, now_ms=now_ms)
        case qc.DeadLetterSummary():
            return qc.DeadLetterSummaryAnswer(summary=reads.dead_letter_summary(view, query.filter), now_ms=now_ms)
        case qc.Counts():
            counted = reads.counts(view, now_ms=now_ms)
            return qc.CountsAnswer(
                counts=tuple(qc.KindStateCount(kind=c.kind, state=c.state, count=c.count) for c in counted),
                now_ms=now_ms,
            )
        case qc.OldestDueAge():
            return qc.OldestDueAnswer(ages_ms=reads.oldest_due_age_ms(view, now_ms=now_ms), now_ms=now_ms)
        case qc.EventsAfter():
            events = reads.events_after(view, query.seq, limit=query.limit)
            return qc.EventsAnswer(events=tuple(events), first_seq=reads.first_event_seq(view), now_ms=now_ms)
        case qc.EventsDigest():
            last = reads.last_event_seq(view)
            through = max(query.after, min(query.after + query.limit, last))
            count, digest = reads.events_digest(view, query.after, through)
            return qc.DigestAnswer(first_seq=reads.first_event_seq(view), last_seq=last, through=through, count=count,
                                   digest=digest, now_ms=now_ms)  # fmt: skip
        case qc.ScrubPayloads():
            last_id = reads.last_message_id(view)
            through = max(query.after, min(query.after + query.limit, last_id))
            checked, corrupt = reads.scrub_payloads(view, query.after, through)
            return qc.ScrubAnswer(through=through, last_id=last_id, checked=checked, corrupt=tuple(corrupt), now_ms=now_ms)
        case qc.Kinds():
            return qc.KindsAnswer(kinds=tuple(reads.kinds(view)), now_ms=now_ms)
        case qc.MessageEvents():
            return qc.MessageEventsAnswer(events=tuple(reads.message_events(view, query.ids)), now_ms=now_ms)
        case qc.Tokens():
            version = access.version(view)
            if version == query.known_version:
                return qc.TokensAnswer(version=version, changed=False, now_ms=now_ms)
            return qc.TokensAnswer(version=version, tokens=tuple(access.tokens(view)), now_ms=now_ms)
        case qc.WorkDue():
            due = reads.work_due(view, query.kinds, now_ms=now_ms)
            return qc.WorkDueAnswer(ready=due.ready, next_due_ms=due.next_due_ms, paused=due.paused,
                                    paused_ready=due.paused_ready, now_ms=now_ms)  # fmt: skip
        case qc.Documents():
            version = documents.version(view, query.namespace)
            if version == query.known_version:
                return qc.DocumentsAnswer(version=version, changed=False, now_ms=now_ms)
            return qc.DocumentsAnswer(version=version, documents=tuple(documents.documents(view, query.namespace)),
                                      now_ms=now_ms)  # fmt: skip
        case qc.MaintenanceDue():
            deadline, purge, oldest = reads.maintenance_due(view)
            _, events_kept = reads.retention(view, config)
            return qc.MaintenanceDueAnswer(lease_deadline_ms=deadline, purge_ms=purge, oldest_event_ms=oldest,
                                           event_retention_ms=events_kept, now_ms=now_ms)  # fmt: skip
        case qc.AuditLog():
            if query.after is not None:
                entries = audit_chain.entries_after(view, query.after, limit=query.limit, selected=query.filter)
            else:
                entries = audit_chain.entries_before(view, query.before, limit=query.limit, selected=query.filter)
            head = audit_chain.head(view)
            return qc.AuditAnswer(entries=tuple(entries), count=head.count, head=head.hash, now_ms=now_ms)
        case qc.MessageAudit():
            index = audit_chain.message_index(view, query.ids)
            entries = audit_chain.entries_at(view, [seq for seq, _ in index])
            return qc.AuditAnswer(entries=tuple(entries), concerns=tuple(index), now_ms=now_ms)
        case qc.Proposals():
            if query.ids:
                listed = proposals.get(view, query.ids, now_ms=now_ms)
            else:
                listed = proposals.listing(view, now_ms=now_ms, pending_only=query.pending_only,
                                           before_id=query.before_id, limit=query.limit)  # fmt: skip
            return qc.ProposalsAnswer(proposals=tuple(listed), now_ms=now_ms)
        case qc.Jobs():
            job_views = jobs.listing(view, ids=query.ids, active_only=query.active_only, before_id=query.before_id,
                                     limit=query.limit)  # fmt: skip
            return qc.JobsAnswer(jobs=tuple(job_views), now_ms=now_ms)
        case qc.JobGroup():
            return qc.JobGroupAnswer(job_id=jobs.group_part(view, query.group, "job"),
                                     proposal_id=jobs.group_part(view, query.group, "proposal"), now_ms=now_ms)
        case qc.JobItems():
            job_items = jobs.items(view, query.job_id, after_message_id=query.after_message_id, limit=query.limit,
                                   result=query.result)  # fmt: skip
            return qc.JobItemsAnswer(items=tuple(job_items), now_ms=now_ms)
        case qc.Retention():
            kept, events_kept = reads.retention(view, config)
            return qc.RetentionAnswer(retention_ms=kept, event_retention_ms=events_kept, floor_ms=config.retention_floor_ms,
                                      now_ms=now_ms)  # fmt: skip
