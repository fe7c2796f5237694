"""A reference model of every message's lifecycle, fed the replicated event log in log order.

Why events: they are the replicated record of every state change, with the log index and the
machine's `now_ms` (`ts_ms`); the checker reads them from whichever replica first applied an entry
and proves elsewhere that all replicas agree (results per entry, whole-state digests). This model
re-derives, independently of queues/machine.py, what each event is allowed to be: leases only of
waiting messages at or after their due time, one lease at a time, attempts counting by one,
acks only with the current token, retries scheduled exactly as `delay.policy.decide` says, and
dead letters only for an exhausted budget or a permanent error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from delay.policy import DAY_MS, DEFAULT_POLICY, DeadLetter, RetryPolicy, decide
from queues.model import BUILTIN_KINDS, Event, EventType

WAITING, LEASED, DONE, DEAD, DISCARDED = "waiting", "leased", "done", "dead", "discarded"
SETTLED = frozenset({DONE, DEAD, DISCARDED})
"""Where a message may rest once nothing acts on it any more (dead letters wait for people)."""


@dataclass(slots=True)
class Msg:
    key: str
    kind: str
    due_ms: int
    budget_start_ms: int
    phase: str = WAITING
    attempts: int = 0
    budget_attempts: int = 0
    token: int = 0
    token_open: bool = False
    deadline_ms: int = 0
    grants: int = 0
    expect_dead: str | None = None
    purge_ms: int | None = None
    """When a done or discarded message's retention ends: its key may be taken again from then."""


@dataclass(slots=True)
class LogModel:
    violation: Callable[[str], None]
    sent_keys: Callable[[str], bool]
    fail_retry_after: dict[int, int | None]
    """token -> the Retry-After (a duration) a worker's Fail carried (absent for expiries)."""
    retention_ms: int = 7 * DAY_MS
    event_retention_ms: int = 7 * DAY_MS
    event_retentions_seen: list[int] = field(default_factory=list)
    """Event retentions in force at any point since the checker last cleared this (see
    QueueChecker._check_event_purge: a Purge and a SetRetention may share an entry)."""
    retention_changes: int = 0
    messages: dict[int, Msg] = field(default_factory=dict)
    purged: dict[int, Msg] = field(default_factory=dict)
    """Messages deleted after their retention: absent from every replica, and rightly so."""
    reused_keys: int = 0
    by_key: dict[str, int] = field(default_factory=dict)
    granted: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # token -> (id, attempt, deadline)
    policies: dict[str, RetryPolicy] = field(default_factory=lambda: dict.fromkeys(BUILTIN_KINDS, DEFAULT_POLICY))
    pauses: dict[str, set[str]] = field(default_factory=dict)  # kind -> holders
    max_token: int = 0
    last_seq: int = 0
    dead_letters: int = 0
    late_acks: int = 0
    ts_behind_log_time: int = 0

    def on_event(self, ev: Event, log_time: int) -> None:
        if ev.seq != self.last_seq + 1:
            self.violation(f"event seq {ev.seq} after {self.last_seq}")
        self.last_seq = ev.seq
        if ev.ts_ms < log_time:
            self.ts_behind_log_time += 1
        if ev.message_id == 0:
            self._kind_event(ev)
            return
        if ev.type is EventType.ENQUEUED:
            self._enqueued(ev)
            return
        m = self.messages.get(ev.message_id)
        if m is None:
            self.violation(f"event {ev.type.value} for unknown message {ev.message_id}")
            return
        handler = _HANDLERS.get(ev.type)
        if handler is not None:
            handler(self, m, ev, log_time)

    def expired(self, message_id: int, now_ms: int) -> bool:
        """The message's retention has ended (it may still be in the store until a Purge)."""
        if message_id in self.purged:
            return True
        m = self.messages.get(message_id)
        return m is not None and m.purge_ms is not None and m.purge_ms <= now_ms

    def _kind_event(self, ev: Event) -> None:
        if ev.type is EventType.RETENTION_SET:
            before = (ev.data["retention_ms_before"], ev.data["event_retention_ms_before"])
            if before != (self.retention_ms, self.event_retention_ms):
                self.violation(f"retention set at {ev.seq} from {before}, but the model had "
                               f"{(self.retention_ms, self.event_retention_ms)} in force")
            self.retention_ms, self.event_retention_ms = _int(ev, "retention_ms"), _int(ev, "event_retention_ms")
            self.event_retentions_seen.append(self.event_retention_ms)
            self.retention_changes += 1
            return
        holders = self.pauses.setdefault(ev.kind, set())
        if ev.type is EventType.POLICY_SET:
            self.policies[ev.kind] = msgspec.json.decode(str(ev.data["policy"]), type=RetryPolicy)
        elif ev.type is EventType.PAUSED:
            holders.add(str(ev.data["holder"]))
        elif ev.type is EventType.RESUMED:
            holders.discard(str(ev.data["holder"]))
            if bool(ev.data["still_paused"]) != bool(holders):
                self.violation(f"{ev.kind} resumed by {ev.data['holder']}: still paused? model {sorted(holders)}")

    def _where(self, m: Msg, ev: Event) -> str:
        return f"message {ev.message_id} ({m.key}) at index {ev.log_index}"

    def _enqueued(self, ev: Event) -> None:
        key = str(ev.data["idempotency_key"])
        if ev.message_id in self.messages:
            self.violation(f"message id {ev.message_id} enqueued twice")
        if not self.sent_keys(key):
            self.violation(f"unexpected: message {ev.message_id} has key {key} no client sent")
        holder = self.by_key.get(key)
        if holder is not None:
            if not self.expired(holder, ev.ts_ms):
                self.violation(f"duplicated: key {key} enqueued as {holder} and {ev.message_id}")
            self.reused_keys += 1
        due = ev.data["due_ms"]
        assert isinstance(due, int)
        self.messages[ev.message_id] = Msg(key, ev.kind, due, ev.ts_ms)
        self.by_key[key] = ev.message_id

    def _leased(self, m: Msg, ev: Event, log_time: int) -> None:
        where = self._where(m, ev)
        if m.phase == DONE:
            self.violation(f"redelivered after an ack: {where}")
        elif m.phase == LEASED:
            self.violation(f"overlapping leases: {where} leased again while token {m.token} holds it")
        elif m.phase != WAITING:
            self.violation(f"{m.phase} message leased: {where}")
        if self.pauses.get(m.kind):
            self.violation(f"leased while {m.kind} is paused by {sorted(self.pauses[m.kind])}: {where}")
        token, attempt, deadline, lateness = (_int(ev, k) for k in ("token", "attempt", "deadline_ms", "lateness_ms"))
        if ev.ts_ms - lateness != m.due_ms:
            self.violation(f"{where}: granted as due at {ev.ts_ms - lateness}, scheduled for {m.due_ms}")
        if log_time < m.due_ms:
            self.violation(f"retry before its due time: {where} leased at {log_time}, due {m.due_ms}")
        if attempt != m.attempts + 1:
            self.violation(f"attempt count jumps from {m.attempts} to {attempt}: {where}")
        if token <= self.max_token:
            self.violation(f"fencing token {token} not above {self.max_token}: {where}")
        self.max_token = max(self.max_token, token)
        self.granted[token] = (ev.message_id, attempt, deadline)
        m.phase, m.attempts, m.token, m.token_open, m.deadline_ms = LEASED, attempt, token, True, deadline
        m.grants += 1

    def _extended(self, m: Msg, ev: Event, log_time: int) -> None:
        if m.phase != LEASED or _int(ev, "token") != m.token:
            self.violation(f"extend with a stale token accepted: {self._where(m, ev)}")
        if ev.ts_ms >= m.deadline_ms:
            self.violation(f"lease extended after its deadline {m.deadline_ms}: {self._where(m, ev)}")
        m.deadline_ms = _int(ev, "deadline_ms")

    def _failed(self, m: Msg, ev: Event, log_time: int) -> None:
        where = self._where(m, ev)
        token = _int(ev, "token")
        expired = ev.type is EventType.LEASE_EXPIRED
        if m.phase != LEASED or token != m.token or _int(ev, "attempt") != m.attempts:
            self.violation(f"{ev.type.value} with a stale token {token} accepted: {where}")
        if expired and ev.ts_ms < m.deadline_ms:
            self.violation(f"lease expired at {ev.ts_ms} before its deadline {m.deadline_ms}: {where}")
        if not expired and ev.ts_ms >= m.deadline_ms:
            self.violation(f"fail accepted at {ev.ts_ms} on a lease past its deadline {m.deadline_ms}: {where}")
        retry_after = None if expired else self.fail_retry_after.get(token)
        expected = decide(
            self.policies[m.kind], message_id=ev.message_id, attempt=m.attempts - m.budget_attempts,
            budget_start_ms=m.budget_start_ms, now_ms=ev.ts_ms, error_class=str(ev.data["error_class"]),
            permanent=bool(ev.data["permanent"]),
            not_before_ms=None if retry_after is None else ev.ts_ms + retry_after,
        )
        m.token_open = expired
        if isinstance(expected, DeadLetter):
            m.expect_dead = expected.reason.value
            m.phase = DEAD
            if "due_ms" in ev.data:
                self.violation(f"retried although the policy says {expected.reason.value}: {where}")
            return
        m.expect_dead = None
        due = ev.data.get("due_ms")
        if due != expected.due_ms:
            self.violation(f"retry due at {due}, the policy says {expected.due_ms}: {where}")
        m.phase, m.due_ms = WAITING, expected.due_ms

    def _dead(self, m: Msg, ev: Event, log_time: int) -> None:
        reason = str(ev.data["reason"])
        if m.expect_dead != reason:
            self.violation(
                f"dead letter ({reason}) without exhausted attempts or a permanent error "
                f"(policy says {m.expect_dead or 'retry'}): {self._where(m, ev)}"
            )
        m.phase, m.expect_dead = DEAD, None
        self.dead_letters += 1

    def _succeeded(self, m: Msg, ev: Event, log_time: int) -> None:
        where = self._where(m, ev)
        token = _int(ev, "token")
        if m.phase == DONE:
            self.violation(f"acked twice: {where}")
        elif ev.data["late"]:
            if m.phase not in (WAITING, DEAD) or token != m.token or not m.token_open:
                self.violation(f"late ack with a stale token {token} accepted (current {m.token}): {where}")
            self.late_acks += 1
        elif m.phase != LEASED or token != m.token:
            self.violation(f"ack with a stale token {token} accepted (current {m.token}): {where}")
        m.phase, m.token_open, m.purge_ms = DONE, False, ev.ts_ms + self.retention_ms

    def _redriven(self, m: Msg, ev: Event, log_time: int) -> None:
        delayed = m.phase == WAITING and m.due_ms > ev.ts_ms
        if m.phase != DEAD and not delayed:
            self.violation(f"redrive of a {m.phase} message: {self._where(m, ev)}")
        m.phase, m.due_ms, m.token_open = WAITING, ev.ts_ms, False
        m.budget_attempts, m.budget_start_ms = m.attempts, ev.ts_ms

    def _discarded(self, m: Msg, ev: Event, log_time: int) -> None:
        if m.phase not in (WAITING, DEAD):
            self.violation(f"discard of a {m.phase} message: {self._where(m, ev)}")
        m.phase, m.token_open, m.purge_ms = DISCARDED, False, ev.ts_ms + self.retention_ms

    def _purged(self, m: Msg, ev: Event, log_time: int) -> None:
        if m.phase not in (DONE, DISCARDED):
            self.violation(f"purge of a {m.phase} message: {self._where(m, ev)}")
        elif m.purge_ms is None or ev.ts_ms < m.purge_ms:
            self.violation(f"purged at {ev.ts_ms}, before its retention ended at {m.purge_ms}: {self._where(m, ev)}")
        self.purged[ev.message_id] = self.messages.pop(ev.message_id)
        if self.by_key.get(m.key) == ev.message_id:  # else a newer message holds the key already
            del self.by_key[m.key]


def _int(ev: Event, key: str) -> int:
    value = ev.data[key]
    assert isinstance(value, int) and not isinstance(value, bool), f"{ev.type.value}.{key} = {value!r}"
    return value


_HANDLERS: dict[EventType, Callable[[LogModel, Msg, Event, int], None]] = {
    EventType.LEASED: LogModel._leased,
    EventType.LEASE_EXTENDED: LogModel._extended,
    EventType.ATTEMPT_FAILED: LogModel._failed,
    EventType.LEASE_EXPIRED: LogModel._failed,
    EventType.DEAD_LETTERED: LogModel._dead,
    EventType.SUCCEEDED: LogModel._succeeded,
    EventType.REDRIVEN: LogModel._redriven,
    EventType.DISCARDED: LogModel._discarded,
    EventType.PURGED: LogModel._purged,
}
