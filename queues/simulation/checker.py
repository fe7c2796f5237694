"""The queue's properties (testing.md), checked as the simulation runs and after the drain.

Sources, each checked against the others:
- the committed log as applied: every replica's result bytes for an entry must be identical, and
  every replica's whole state at the same index must be identical (canonical table dumps);
- the replicated event log, replayed through `history.LogModel` in log order;
- what clients saw: enqueue outcomes (ok / fail / unknown), grants, ack answers;
- the downstream's effect ledger: effects per idempotency key, tokens presented.

Must be zero (each one fails the seed): lost and lost-on-node, unexpected, failed-but-appeared,
duplicated enqueues, effects twice for one key, done without an effect, acked twice, redelivered
after an ack, overlapping leases, effects or acks accepted with a stale fencing token, retries
before their due time, attempt counts that skip or go back, dead letters without an exhausted
budget or a permanent error, messages not settled after the drain, replicas that differ, events
purged before their retention or out of order (not as a prefix of the log).
One clock (docs/queue.md): a stamp ahead of the majority's clocks (raft_store's checker), a
stamp below the log's time (a leader reads no lower than the times its log holds, and every entry
committed before its term is in its log: seed 3001408, where a restarted leader stamped 1 s below
its own older entries, and until then stamps went back a few ms between leaders, only reported),
the log's time standing still for more than FREEZE_MAX_MS of real time while one leader proposes,
a read answered at a "now" behind the time its replica applied, a lease that expired earlier in
real time than its length by more than the documented bound.
Reported: duplicate deliveries, recovered enqueues, how far ahead of and behind true time the
log's clock ran, the longest it stood still, the earliest lease expiry.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from queues.core import reads
from queues.core.port import KvRead, Table
from queues.core.records import message_decoder
from queues.model import Code, Enqueue, EnqueueResult, Event, EventType, Grant, LeaseResult, Outcome, QueueResult
from queues.simulation.downstream import ACCEPTED, CallRecord
from queues.simulation.history import SETTLED, LogModel
from raft_store.simulation.clocks import EPOCH_MS
from raft_store.simulation.cluster import SimNode
from raft_store.state_machine import Command

if TYPE_CHECKING:
    from queues.simulation.cluster import QueueCluster

_PHASES = {1: "waiting", 2: "leased", 3: "done", 4: "dead", 5: "discarded"}
FREEZE_MAX_MS = 1000
"""Ten election timeouts here: the log's time may stand still across an election, not longer."""


class QueueChecker:
    def __init__(self, cluster: QueueCluster) -> None:
        self.cluster = cluster
        self.sent: dict[str, Enqueue] = {}
        self.ops: dict[str, list[str]] = {}  # key -> outcomes in order: ok / fail / unknown
        self.created_by: dict[int, int] = {}
        """Message id -> request id of the sessionless send answered OK: the one that must have created it."""
        self.created: set[int] = set()
        """Messages a send was answered OK (created) for: by one send only."""
        self.acked: dict[str, int] = {}  # key -> the newest message id the client was told
        self.recovered = 0
        self.fail_retry_after: dict[int, int | None] = {}
        self.model = LogModel(self.violation, self.sent.__contains__, self.fail_retry_after,
                              retention_ms=cluster.queue_config.retention_ms,
                              event_retention_ms=cluster.queue_config.event_retention_ms)
        self.applied_seen = 0
        self.log_time = 0
        self.clock_went_back = 0
        self._event_ts: deque[tuple[int, int]] = deque()  # (seq, ts) of events read and not yet purged
        self.events_purged = 0
        self.retention_refusals = 0
        """SetRetention under the floor, answered INVALID as it must be."""
        self._results: dict[int, bytes] = {}  # index -> digest of the result bytes
        self._digests: dict[int, bytes] = {}  # index -> digest of the whole state
        self._reference: tuple[int, bytes] | None = None  # (node, digest) of the first replica checked
        self._ack_ok: dict[int, int] = {}  # message id -> token of the ack answered OK
        self._presented: dict[str, int] = {}  # key -> highest token a downstream call carried
        self._effects: Counter[str] = Counter()
        self.grants_seen = 0
        self.fenced_calls = 0
        self._frozen: tuple[int, int, int] = (0, 0, 0)  # (term, log time, true time of its first proposal)
        self.freeze_max_ms = 0
        self.log_behind_max_ms = 0
        self._leases: dict[int, tuple[int, int, int]] = {}  # token -> (lease ms, proposed at, log lag ms)
        self.lease_early_max_ms = 0
        self.reads_checked = 0

    def violation(self, text: str) -> None:
        self.cluster.fail(text)

    # ---- the log as every replica applies it ------------------------------------------------
    def on_apply(self, node: int, index: int, now_ms: int | None, commands: Sequence[Command],
                 results: Sequence[bytes], proposed: tuple[int, int] | None = None) -> None:
        """`proposed`: (term, true time) of the entry's proposal, when the simulation saw it."""
        proposed_ms = None if proposed is None else proposed[1]
        digest = _digest([c.data for c in commands] + [b"|"] + list(results))
        if index <= self.applied_seen:
            if self._results[index] != digest:
                self.violation(f"n{node} answered entry {index} differently from the first replica")
            return
        if index != self.applied_seen + 1:
            self.violation(f"n{node} applied {index}, but no replica applied {self.applied_seen + 1} yet")
        self.applied_seen = index
        self._results[index] = digest
        if now_ms is not None:
            if now_ms < self.log_time:
                self.clock_went_back += 1
                self.violation(f"entry {index} is stamped {now_ms}, {self.log_time - now_ms} ms below the log's time"
                               f" {self.log_time}: its leader stamped below a time its log held")  # fmt: skip
            self.log_time = max(self.log_time, now_ms)  # the machine's clock never goes backwards
            if proposed is not None:
                self._check_not_frozen(index, *proposed)
        conn = self.cluster.machines[node].view
        while True:
            events = reads.events_after(conn, self.model.last_seq, limit=1000)
            for event in events:
                if event.log_index != index:
                    self.violation(f"event {event.seq} of entry {event.log_index} appeared at {index}")
                self.model.on_event(event, self.log_time)
                if proposed_ms is not None:
                    self._check_lease(event, proposed_ms)
            self._event_ts.extend((event.seq, event.ts_ms) for event in events)
            if len(events) < 1000:
                break
        self._check_event_purge(conn)

    def _check_event_purge(self, conn: KvRead) -> None:
        """Purge deletes a prefix of the event log, each event no sooner than its retention allows.

        The retention is the shortest in force during the entry: the model has read the entry's
        events already, and a SetRetention that lengthened it may follow the entry's Purge."""
        retentions = [self.model.event_retention_ms, *self.model.event_retentions_seen]
        self.model.event_retentions_seen = [self.model.event_retention_ms]
        cutoff = self.log_time - min(retentions)
        first = reads.first_event_seq(conn)
        while self._event_ts and self._event_ts[0][0] < first:
            seq, ts_ms = self._event_ts.popleft()
            self.events_purged += 1
            if ts_ms > cutoff:
                self.violation(f"event {seq} of {ts_ms} purged at {self.log_time}, before its retention")
        kept = conn.count(Table.EVENTS)
        if kept != len(self._event_ts):  # a hole after the oldest kept event: not a prefix
            self.violation(f"{kept} events kept from {first} on, but {len(self._event_ts)} were read and not purged")

    def _check_not_frozen(self, index: int, term: int, proposed_ms: int) -> None:
        """While a leader proposes, the log's time moves: a slow leader must not hold it still. (Across
        an outage without a majority nothing commits, and time lost to it is not counted here.)"""
        frozen_term, value, since = self._frozen
        self.log_behind_max_ms = max(self.log_behind_max_ms, EPOCH_MS + proposed_ms - self.log_time)
        if self.log_time > value or term != frozen_term:
            self._frozen = (term, self.log_time, proposed_ms)
            return
        stood = proposed_ms - since
        self.freeze_max_ms = max(self.freeze_max_ms, stood)
        if stood > FREEZE_MAX_MS:
            self.violation(f"the log's time stood at {value} for {stood} ms of real time (entry {index}):"
                           " due retries and lease expiries stopped")  # fmt: skip

    def _check_lease(self, event: Event, proposed_ms: int) -> None:
        """A lease lasts its length in real time, less at most the documented bound: how far the
        majority's time ran ahead of true time when it expired, plus how far the log's clock was
        behind true time when it was granted or extended."""
        if event.type in (EventType.LEASED, EventType.LEASE_EXTENDED):
            token, deadline = int(event.data["token"]), int(event.data["deadline_ms"])  # type: ignore[arg-type]
            self._leases[token] = (deadline - event.ts_ms, proposed_ms, EPOCH_MS + proposed_ms - event.ts_ms)
        elif event.type is EventType.LEASE_EXPIRED:
            found = self._leases.pop(int(event.data["token"]), None)  # type: ignore[arg-type]
            if found is None:
                return
            length, granted_at, lag = found
            early = length - (proposed_ms - granted_at)
            self.lease_early_max_ms = max(self.lease_early_max_ms, early)
            allowed = self.cluster.checker.clock_allowed_ahead_ms() + max(0, lag)
            if early > allowed:
                self.violation(f"lease {event.data['token']} of message {event.message_id} ({length} ms) expired"
                               f" {early} ms early in real time; the bound allows {allowed} ms")  # fmt: skip

    def on_read(self, node: int, now_ms: int, applied_time_ms: int) -> None:
        """A read's "now" is never behind what its replica applied: else it calls delayed what the
        next Lease grants, and a worker waiting on it waits for nothing."""
        self.reads_checked += 1
        if now_ms < applied_time_ms:
            self.violation(f"a read on n{node} at {now_ms}, {applied_time_ms - now_ms} ms behind the log's time"
                           f" {applied_time_ms}: due messages read as delayed")  # fmt: skip
        self.cluster.checker.check_clock_bound(f"a read on n{node}", now_ms)

    def on_digest_point(self, node: int, index: int) -> None:
        digest = self.cluster.machines[node].store_digest()
        first = self._digests.setdefault(index, digest)
        if first != digest:
            self.violation(f"n{node}'s state at index {index} differs from another replica's")

    # ---- what clients saw ------------------------------------------------------------------
    def on_enqueue_sent(self, command: Enqueue) -> None:
        self.sent.setdefault(command.idempotency_key, command)

    def on_enqueue_answer(self, key: str, result: QueueResult | None, request_id: int = 0) -> None:
        outcomes = self.ops.setdefault(key, [])
        if result is None:
            outcomes.append("unknown")
            return
        if not isinstance(result, EnqueueResult) or result.code not in (Code.OK, Code.EXISTS):
            outcomes.append("fail")
            return
        if result.code is Code.EXISTS and "unknown" in outcomes and "ok" not in outcomes:
            self.recovered += 1
        message_id = result.message_id
        if result.code is Code.OK:
            # OK means "this send created it": retries of one send (same lane, or same request id
            # without a lane) may say so again, but never two sends of the same message.
            if message_id in self.created:
                self.violation(f"key {key}: two sends were both answered OK (created) for message {message_id}")
            self.created.add(message_id)
            if request_id:
                self.created_by[message_id] = request_id
        outcomes.append("ok")
        # One key, one message, for the retention window: a second message only once the first's
        # retention has ended (the older of the two, whichever answer arrives first).
        known = self.acked.setdefault(key, message_id)
        if known != message_id and not self.model.expired(min(known, message_id), self.log_time):
            self.violation(f"key {key} acknowledged as message {known} and as {message_id}")
        self.acked[key] = max(known, message_id)
        holder = self.model.by_key.get(key)
        if holder != message_id and not self.model.expired(message_id, self.log_time):
            self.violation(f"key {key} acknowledged as message {message_id}, the log says {holder}")

    def on_grants(self, worker: str, result: LeaseResult) -> None:
        if result.grants:
            self.cluster.log(f"{worker} leased " + " ".join(f"{g.message_id}/{g.token}" for g in result.grants))
        for grant in result.grants:
            self.grants_seen += 1
            logged = self.model.granted.get(grant.token)
            # A retried Lease answers with the grants still live, their deadlines as extended since.
            if logged is None or logged[:2] != (grant.message_id, grant.attempt) or grant.deadline_ms < logged[2]:
                self.violation(f"{worker} got grant {grant.message_id}/{grant.token}; the log shows {logged}")

    def on_fail_sent(self, token: int, retry_after_ms: int | None) -> None:
        self.fail_retry_after[token] = retry_after_ms

    def on_ack_answer(self, grant: Grant, result: QueueResult | None) -> None:
        answer = "unknown" if result is None else result.code.name
        self.cluster.log(f"ack {grant.message_id}/{grant.token}: {answer}")
        if isinstance(result, Outcome) and result.code is Code.OK:
            previous = self._ack_ok.setdefault(grant.message_id, grant.token)
            if previous != grant.token:
                self.violation(f"acked twice: message {grant.message_id} with tokens {previous} and {grant.token}")

    def on_call(self, call: CallRecord) -> None:
        """A downstream call: one effect per key, and never an action on a superseded token."""
        self.cluster.log(f"{call.worker} calls downstream {call.key} (message {call.message_id}) with token "
                         f"{call.token}: {call.outcome.value}{' (effect)' if call.applied else ''}")
        presented = self._presented.get(call.key, 0)
        if call.outcome in ACCEPTED and call.token < presented:
            self.violation(
                f"effect with a stale fencing token: {call.worker} acted on {call.key} with token "
                f"{call.token} after token {presented} was presented"
            )
        if call.outcome.value == "fenced":
            self.fenced_calls += 1
        self._presented[call.key] = max(presented, call.token)
        if call.applied:
            self._effects[call.key] += 1
            if self._effects[call.key] > 1:
                self.violation(f"effect applied twice for idempotency key {call.key}")

    # ---- after the drain ---------------------------------------------------------------------
    def check_end(self) -> None:
        model = self.model
        for key, message_id in self.acked.items():
            if message_id in model.purged:
                continue  # deleted after its retention, which the model checked when it happened
            m = model.messages.get(message_id)
            if m is None or m.key != key:
                self.violation(f"lost: acknowledged key {key} (message {message_id}) is not in the log")
            elif m.phase not in SETTLED:
                self.violation(f"not settled after the drain: acknowledged {key} is {m.phase}")
        for message_id, m in model.messages.items():
            if m.phase not in SETTLED:
                self.violation(f"not settled after the drain: message {message_id} ({m.key}) is {m.phase}")
            if m.phase == "done" and self._effects[m.key] == 0:
                self.violation(f"done without an effect: message {message_id} ({m.key})")
            if "ok" not in self.ops.get(m.key, []) and "unknown" not in self.ops.get(m.key, []):
                self.violation(f"failed but appeared: {m.key} (outcomes {self.ops.get(m.key)})")
        purged_keys = {m.key for m in model.purged.values()}
        for call in self.cluster.workload.downstream.calls:
            if call.key not in model.by_key and call.key not in purged_keys:
                self.violation(f"unexpected effect for key {call.key}, which is not in the log")
            granted = model.granted.get(call.token)
            if granted is None or granted[0] != call.message_id:
                self.violation(f"downstream called with token {call.token} the queue never granted {call.message_id}")
        self._reference = None
        self.cluster.checker.check_healed(self._check_replica)

    def _check_replica(self, node_id: int, node: SimNode) -> None:
        machine = self.cluster.machines[node_id]
        conn = machine.view
        for key, message_id in self.acked.items():
            if message_id in self.model.purged:
                continue
            view = reads.get_message(conn, message_id, now_ms=self.log_time, with_history=False)
            if view is None or view.idempotency_key != key:
                self.violation(f"lost on n{node_id}: acknowledged key {key} (message {message_id})")
        records = [message_decoder.decode(value) for _, value in conn.scan(Table.MESSAGES)]
        rows = [(r.id, r.idempotency_key, int(r.phase)) for r in records]
        for message_id, key, phase in rows:
            m = self.model.messages.get(message_id)
            if m is None or m.key != key or m.phase != _PHASES[phase]:
                self.violation(f"n{node_id} holds message {message_id} ({key}, {_PHASES[phase]}); the log says {m}")
        if len(rows) != len(self.model.messages):
            self.violation(f"n{node_id} holds {len(rows)} messages, the log {len(self.model.messages)}")
        created = {r.id: r.request_id for r in records}
        for message_id, request_id in self.created_by.items():
            if message_id in created and created[message_id] != request_id:
                self.violation(f"n{node_id}: message {message_id} answered OK to request {request_id},"
                               f" created by {created[message_id]}")
        digest = machine.store_digest()
        if self._reference is None:
            self._reference = (node_id, digest)
        elif self._reference[1] != digest:
            self.violation(f"replicas n{self._reference[0]} and n{node_id} differ at index {node.state_index}")

    def stats(self) -> dict[str, Any]:
        model = self.model
        acked_enqueues = sum(1 for outcomes in self.ops.values() if "ok" in outcomes)
        return {
            "messages": len(model.messages),
            "acked_enqueues": acked_enqueues,
            "lost": 0,
            "unexpected": 0,
            "duplicate_deliveries": sum(max(0, m.grants - 1) for m in model.messages.values()),
            "duplicate_effects": sum(max(0, n - 1) for n in self._effects.values()),
            "recovered": self.recovered,
            "grants": self.grants_seen,
            "dead_letters": model.dead_letters,
            "late_acks": model.late_acks,
            "purged": len(model.purged),
            "events_purged": self.events_purged,
            "reused_keys": model.reused_keys,
            "retention_changes": model.retention_changes,
            "retention_refusals": self.retention_refusals,
            "fenced_calls": self.fenced_calls,
            "clock_went_back": self.clock_went_back,
            "log_ahead_max_ms": self.cluster.checker.log_ahead_max_ms,
            "log_behind_max_ms": self.log_behind_max_ms,
            "log_still_max_ms": self.freeze_max_ms,
            "lease_early_max_ms": self.lease_early_max_ms,
            "clock_faults": len(self.cluster.time.plan.described),
            "machine_ts_behind_log_time": model.ts_behind_log_time,
            "log_index": self.applied_seen,
        }


def _digest(parts: list[bytes]) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.digest()
