"""The queue state machine against a plain in-Python reference model (Hypothesis stateful test).

Every command goes through the exact path replicas use: encoded bytes inside
`apply_batch(index, now_ms, [Command(client_id, seq, data)])`. After every step the machine's
query output is compared with the model, and the safety invariants are checked: tokens strictly
increase, no message is leased twice concurrently, nothing is dropped (every enqueued id is in
exactly one state until its tombstone is purged), attempt counts are exact, nothing is leased
before its due time, and dead letters appear only after exhausted attempts, age, or a permanent
error. Snapshot -> restore into a fresh machine must reproduce the whole state.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delay.policy import DEFAULT_POLICY, DeadLetter, ErrorClassRule, RetryPolicy, decide
from queues import codec
from queues.core import reads as queries
from queues.core.keys import u64_of
from queues.core.port import Table
from queues.machine import QueueConfig, QueueMachine
from queues.model import (
    BUILTIN_KINDS,
    ERROR_CLASS_LEASE_EXPIRED,
    EVENTS_PURGE_MAX,
    Ack,
    AckMany,
    BatchResult,
    Code,
    DeadLetterFilter,
    Discard,
    Enqueue,
    EnqueueResult,
    ErrorResult,
    Event,
    EventType,
    ExpireLeases,
    ExtendLease,
    Fail,
    Grant,
    KindResult,
    Lease,
    LeaseResult,
    Outcome,
    Outcomes,
    PauseKind,
    Purge,
    QueueCommand,
    QueueResult,
    Redrive,
    Release,
    ResumeKind,
    RetentionResult,
    SetPolicy,
    SetRetention,
    State,
    content_hash,
)
from queues.stores.lmdb_store import LmdbStore
from raft_store.state_machine import Command

RETENTION_MS = 120_000
EVENT_RETENTION_MS = 30_001
RETENTION_FLOOR_MS = 30_000
"""1 ms more than one 30 s time step: a purge even 1 ms early deletes events that must stay."""
START_MS = 1_700_000_000_000
KINDS = (*BUILTIN_KINDS, "refund")  # "refund" is unknown until a SetPolicy registers it
KEYS = ("k1", "k2", "k3", "k4", "k5", "k6")
REFS = ("order-1", "order-2", "packet-9")
PAYLOADS = (b"a", b"bb", b"payload-3")
HOLDERS = ("ops-alice", "ops-bob")
ERROR_CLASSES = ("timeout", "insufficient_funds", "http_500")
POLICIES = (
    RetryPolicy(tiers_ms=(1000, 5000), tier_jitter_ratio=0.5, attempts_max=3),
    RetryPolicy(
        tiers_ms=(),
        backoff_min_ms=500,
        backoff_max_ms=8000,
        attempts_max=4,
        overrides=(
            ErrorClassRule(error_class="insufficient_funds", permanent=True),
            ErrorClassRule(error_class="timeout", permanent=False, attempts_max=2),
        ),
    ),
    RetryPolicy(tiers_ms=(2000,), attempts_max=10, age_max_ms=20_000),
    DEFAULT_POLICY,
)
MESSAGE_CHOICE = st.integers(0, 1000)
WORK_OUTCOMES = (
    "ack",
    "ack",
    "fail",
    "fail",
    "permanent",
    "retry_after",
    "abandon",
    "fail_then_ack",
    "ack_twice",
)
TIME_STEPS_MS = (0, 1, 499, 1000, 2500, 6000, 30_000, 600_000, 3_600_000)


# ---- the reference model ----------------------------------------------------------------------
@dataclass
class RefMessage:
    id: int
    kind: str
    key: str
    ref_key: str
    payload: bytes
    content: bytes
    due_ms: int
    budget_start_ms: int
    phase: str = "waiting"  # waiting, leased, done, dead, discarded
    attempts: int = 0
    budget_attempts: int = 0
    token: int = 0
    token_open: bool = False
    deadline_ms: int | None = None
    dead_reason: str | None = None
    dead_ms: int | None = None
    purge_ms: int | None = None
    edited_payload: bytes | None = None
    last_permanent: bool = False
    last_error_class: str | None = None
    dead_justified: bool = False

    def state(self, now_ms: int) -> State:
        if self.phase == "waiting":
            return State.READY if self.due_ms <= now_ms else State.DELAYED
        return State(self.phase)


@dataclass
class RefQueue:
    now_ms: int = START_MS
    messages: dict[int, RefMessage] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)
    policies: dict[str, RetryPolicy] = field(
        default_factory=lambda: dict.fromkeys(BUILTIN_KINDS, DEFAULT_POLICY)
    )
    holders: dict[str, set[str]] = field(default_factory=dict)
    next_id: int = 1
    next_token: int = 1
    rr_offset: int = 0
    purged: set[int] = field(default_factory=set)
    retention_ms: int = RETENTION_MS
    event_retention_ms: int = EVENT_RETENTION_MS

    def enqueue(self, c: Enqueue) -> tuple[object, ...]:
        if c.kind not in self.policies:
            return (Code.UNKNOWN_KIND, 0, None)
        content = content_hash(c.kind, c.ref_key, c.payload)
        old = self.messages.get(self.keys.get(c.idempotency_key, 0))
        if old is not None and (old.purge_ms is None or old.purge_ms > self.now_ms):
            code = Code.EXISTS if old.content == content else Code.CONFLICT
            return (code, old.id, old.state(self.now_ms))
        due_ms = c.due_ms if c.due_ms is not None else self.now_ms + c.delay_ms
        m = RefMessage(
            self.next_id, c.kind, c.idempotency_key, c.ref_key, c.payload, content, due_ms, self.now_ms
        )
        self.messages[m.id] = m
        self.keys[c.idempotency_key] = m.id
        self.next_id += 1
        return (Code.OK, m.id, m.state(self.now_ms))

    def fail_attempt(
        self, m: RefMessage, error_class: str, permanent: bool, nb: int | None, expired: bool
    ) -> None:
        decision = decide(
            self.policies[m.kind],
            message_id=m.id,
            attempt=m.attempts - m.budget_attempts,
            budget_start_ms=m.budget_start_ms,
            now_ms=self.now_ms,
            error_class=error_class,
            permanent=permanent,
            not_before_ms=nb,
        )
        m.token_open = expired
        m.deadline_ms = None
        m.last_permanent = permanent
        m.last_error_class = error_class
        if isinstance(decision, DeadLetter):
            m.phase, m.dead_reason, m.dead_ms = "dead", decision.reason.value, self.now_ms
            m.dead_justified = self.dead_justified(m, error_class, permanent)
        else:
            m.phase, m.due_ms = "waiting", decision.due_ms

    def dead_justified(self, m: RefMessage, error_class: str, permanent: bool) -> bool:
        """Independently of decide(): was this attempt permanent, the budget spent, or an age set?"""
        policy = self.policies[m.kind]
        override = policy.rule_for(error_class)
        if override is not None:
            permanent = override.permanent
        attempts_max = policy.attempts_max
        if override is not None and override.attempts_max is not None:
            attempts_max = override.attempts_max
        spent = m.attempts - m.budget_attempts >= attempts_max
        return permanent or spent or policy.age_max_ms is not None

    def expire(self, limit: int) -> list[int]:
        due = sorted(
            (m.deadline_ms, m.id)
            for m in self.messages.values()
            if m.phase == "leased" and m.deadline_ms is not None and m.deadline_ms <= self.now_ms
        )[:limit]
        for _, message_id in due:
            self.fail_attempt(self.messages[message_id], ERROR_CLASS_LEASE_EXPIRED, False, None, True)
        return [message_id for _, message_id in due]

    def current(self, message_id: int) -> RefMessage | None:
        m = self.messages.get(message_id)
        if (
            m is not None
            and m.phase == "leased"
            and m.deadline_ms is not None
            and m.deadline_ms <= self.now_ms
        ):
            self.fail_attempt(m, ERROR_CLASS_LEASE_EXPIRED, False, None, True)
        return m

    def lease(self, c: Lease) -> tuple[list[tuple[int, int, int, int, bytes, str | None]], int]:
        expired = self.expire(1024)
        kinds = sorted(k for k in self.policies if not self.holders.get(k) and (not c.kinds or k in c.kinds))
        if not kinds:
            return [], len(expired)
        start = self.rr_offset % len(kinds)
        self.rr_offset += 1
        order = kinds[start:] + kinds[:start]
        lists = [
            sorted(
                (
                    m
                    for m in self.messages.values()
                    if m.kind == k and m.phase == "waiting" and m.due_ms <= self.now_ms
                ),
                key=lambda m: (m.due_ms, m.id),
            )
            for k in order
        ]
        picks: list[RefMessage] = []
        for round_ in range(c.count_max):
            for candidates in lists:
                if len(picks) < c.count_max and round_ < len(candidates):
                    picks.append(candidates[round_])
        grants = []
        for m in picks:
            assert m.phase == "waiting"
            previous = m.last_error_class
            m.phase, m.attempts, m.token, m.token_open = "leased", m.attempts + 1, self.next_token, True
            m.deadline_ms = self.now_ms + c.lease_ms
            self.next_token += 1
            payload = m.edited_payload if m.edited_payload is not None else m.payload
            grants.append((m.id, m.token, m.attempts, m.due_ms, payload, previous))
        return grants, len(expired)

    def refusal(self, m: RefMessage | None, token: int, action: str) -> Code | None:
        if m is None:
            return Code.NOT_FOUND
        if m.phase == "done" and token < m.token:
            return Code.DONE_ELSEWHERE
        state = m.state(self.now_ms)
        if action != "ack" and m.phase != "leased" and token == m.token and m.token_open:
            return Code.LEASE_EXPIRED
        legal = {
            "ack": {State.LEASED, State.DELAYED, State.READY, State.DEAD},
            "fail": {State.LEASED},
            "extend": {State.LEASED},
            "release": {State.LEASED},
        }[action]
        if state not in legal:
            return Code.ILLEGAL_STATE
        if token != m.token or not m.token_open:
            return Code.STALE_TOKEN
        return None

    def ack(self, c: Ack) -> Code:
        m = self.current(c.message_id)
        if m is not None and m.phase == "done" and c.token == m.token:
            return Code.ALREADY_ACKED
        refused = self.refusal(m, c.token, "ack")
        if refused is not None:
            return refused
        assert m is not None
        m.phase, m.token_open, m.deadline_ms, m.purge_ms = "done", False, None, self.now_ms + self.retention_ms
        return Code.OK

    def fail(self, c: Fail) -> Code:
        m = self.current(c.message_id)
        refused = self.refusal(m, c.token, "fail")
        if refused is not None:
            return refused
        assert m is not None
        not_before_ms = c.not_before_ms
        if c.retry_after_ms is not None:
            not_before_ms = max(not_before_ms or 0, self.now_ms + c.retry_after_ms)
        self.fail_attempt(m, c.error_class, c.permanent, not_before_ms, False)
        return Code.OK

    def release(self, c: Release) -> Code:
        m = self.current(c.message_id)
        refused = self.refusal(m, c.token, "release")
        if refused is not None:
            return refused
        assert m is not None
        m.phase, m.due_ms, m.token_open, m.deadline_ms = "waiting", self.now_ms, False, None
        m.budget_attempts += 1
        return Code.OK

    def extend(self, c: ExtendLease) -> Code:
        m = self.current(c.message_id)
        refused = self.refusal(m, c.token, "extend")
        if refused is not None:
            return refused
        assert m is not None
        m.deadline_ms = self.now_ms + c.lease_ms
        return Code.OK

    def redrive(self, c: Redrive) -> tuple[list[int], list[tuple[int, Code]]]:
        if c.filter is not None:
            dead = sorted(
                (m.dead_ms or 0, m.id)
                for m in self.messages.values()
                if m.phase == "dead" and (c.filter.kind is None or m.kind == c.filter.kind)
            )
            targets = [message_id for _, message_id in dead[: c.limit]]
        else:
            targets = list(dict.fromkeys(c.ids))
        done, refused = [], []
        for message_id in targets:
            m = self.current(message_id)
            if m is None:
                refused.append((message_id, Code.NOT_FOUND))
            elif m.state(self.now_ms) not in (State.DELAYED, State.DEAD):
                refused.append((message_id, Code.ILLEGAL_STATE))
            else:
                m.phase, m.due_ms, m.budget_attempts, m.budget_start_ms = (
                    "waiting",
                    self.now_ms,
                    m.attempts,
                    self.now_ms,
                )
                m.token_open, m.dead_ms, m.dead_reason = False, None, None
                if c.payload is not None:
                    m.edited_payload = c.payload
                done.append(message_id)
        return done, refused

    def discard(self, c: Discard) -> tuple[Code, State | None]:
        m = self.current(c.message_id)
        if m is None:
            return Code.NOT_FOUND, None
        state = m.state(self.now_ms)
        if state not in (State.DELAYED, State.READY, State.DEAD):
            return Code.ILLEGAL_STATE, state
        m.phase, m.token_open, m.purge_ms, m.dead_ms = "discarded", False, self.now_ms + self.retention_ms, None
        return Code.OK, State.DISCARDED

    def purge(self, limit: int) -> list[int]:
        due = sorted(
            (m.purge_ms, m.id)
            for m in self.messages.values()
            if m.purge_ms is not None and m.purge_ms <= self.now_ms
        )[:limit]
        for _, message_id in due:
            m = self.messages.pop(message_id)
            self.purged.add(message_id)
            if self.keys.get(m.key) == message_id:
                del self.keys[m.key]
        return [message_id for _, message_id in due]


# ---- the test machine -------------------------------------------------------------------------
def dump(machine: QueueMachine, now_ms: int) -> tuple[object, ...]:
    """Everything a client can read, plus every table's bytes: equal dumps mean equal state."""
    conn = machine.view
    ids = [u64_of(key) for key, _ in conn.scan(Table.MESSAGES)]
    return (
        [queries.get_message(conn, message_id, now_ms=now_ms) for message_id in ids],
        queries.events_after(conn, 0, limit=10_000),
        queries.counts(conn, now_ms=now_ms),
        queries.kinds(conn),
        queries.oldest_due_age_ms(conn, now_ms=now_ms),
        machine.store_digest(),
        machine.applied_index(),
    )


class QueueComparison(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.config = QueueConfig(
            retention_ms=RETENTION_MS, event_retention_ms=EVENT_RETENTION_MS, retention_floor_ms=RETENTION_FLOOR_MS
        )
        self.events_seen: dict[int, Event] = {}  # every event ever kept, by seq: purges delete them
        self.machine = self.new_machine()
        self.model = RefQueue()
        self.index = 0
        self.session_seq = 0
        self.tokens_granted: list[int] = []

    def new_machine(self) -> QueueMachine:
        """A machine over the in-memory SQLite store (the LMDB class below runs the same rules on LMDB)."""
        return QueueMachine(":memory:", self.config)

    def teardown(self) -> None:
        self.machine.close()
        self.tmp.cleanup()

    # ---- driving ---------------------------------------------------------------------------
    def apply_raw(self, data: bytes, client_id: int = 0, seq: int = 0) -> bytes:
        self.index += 1
        (result,) = self.machine.apply_batch(self.index, self.model.now_ms, [Command(client_id, seq, data)])
        return result

    def apply(self, command: QueueCommand) -> QueueResult:
        result = codec.decode_result(self.apply_raw(codec.encode_command(command)))
        event(f"{type(command).__name__} -> {result.code.name}")
        if isinstance(result, LeaseResult):
            event(f"lease granted {min(len(result.grants), 2)}+, expired {min(result.expired, 1)}+")
        if isinstance(result, Outcome) and result.state is not None:
            event(f"{type(command).__name__} -> {result.state.name}")
        return result

    def pick(self, choice: int, prefer: str = "leased") -> int:
        """A known message id most of the time (`prefer`red phase first), sometimes an unknown one."""
        preferred = sorted(i for i, m in self.model.messages.items() if m.phase == prefer)
        known = preferred + preferred + sorted(self.model.messages) + [self.model.next_id + 5]
        return known[choice % len(known)]

    def token_for(self, message_id: int, mode: int) -> int:
        m = self.model.messages.get(message_id)
        current = m.token if m is not None else 0
        return max(1, [current, current - 1, current + 1, 7][mode])

    # ---- rules -----------------------------------------------------------------------------
    @rule(step_ms=st.sampled_from(TIME_STEPS_MS))
    def advance_time(self, step_ms: int) -> None:
        self.model.now_ms += step_ms

    @rule(
        kind=st.sampled_from(KINDS),
        key=st.sampled_from(KEYS),
        ref=st.sampled_from(REFS),
        payload=st.sampled_from(PAYLOADS),
        delay_ms=st.sampled_from((0, 0, 1500, 90_000)),
        absolute=st.booleans(),
    )
    def enqueue(self, kind: str, key: str, ref: str, payload: bytes, delay_ms: int, absolute: bool) -> None:
        command = Enqueue(
            kind=kind,
            idempotency_key=key,
            ref_key=ref,
            payload=payload,
            headers={"traceparent": "00-ab"},
            delay_ms=0 if absolute else delay_ms,
            due_ms=self.model.now_ms + delay_ms - 10 if absolute else None,
        )
        result = self.apply(command)
        assert isinstance(result, EnqueueResult)
        assert (result.code, result.message_id, result.state) == self.model.enqueue(command)

    @rule(key=st.sampled_from(KEYS), payload=st.sampled_from(PAYLOADS))
    def enqueue_retried_in_session(self, key: str, payload: bytes) -> None:
        """A client retrying the same (client_id, seq) gets the first answer, byte for byte."""
        self.session_seq += 1
        command = Enqueue(kind="transfer", idempotency_key=key, ref_key="order-1", payload=payload)
        first = self.apply_raw(codec.encode_command(command), client_id=42, seq=self.session_seq)
        again = self.apply_raw(codec.encode_command(command), client_id=42, seq=self.session_seq)
        assert first == again
        result = codec.decode_result(first)
        assert isinstance(result, EnqueueResult)
        assert (result.code, result.message_id, result.state) == self.model.enqueue(command)

    def do_lease(self, kinds: tuple[str, ...], count_max: int, lease_ms: int) -> tuple[Grant, ...]:
        before = {mid: m.phase for mid, m in self.model.messages.items()}
        command = Lease(worker_id="w1", kinds=kinds, count_max=count_max, lease_ms=lease_ms)
        result = self.apply(command)
        expected, expired = self.model.lease(command)
        assert isinstance(result, LeaseResult) and result.code is Code.OK
        got = [(g.message_id, g.token, g.attempt, g.due_ms, g.payload, g.previous_error_class) for g in result.grants]
        assert got == expected
        assert result.expired == expired
        ids = [g.message_id for g in result.grants]
        assert len(set(ids)) == len(ids), "a message granted twice in one lease"
        for grant in result.grants:
            assert grant.due_ms <= self.model.now_ms, "leased before its due time"
            assert grant.deadline_ms == self.model.now_ms + lease_ms
            # Never granted while another lease on it is live (an expired one was expired first).
            assert before[grant.message_id] in ("waiting", "leased")
            assert not self.tokens_granted or grant.token > self.tokens_granted[-1], "token did not increase"
            self.tokens_granted.append(grant.token)
        return result.grants

    def do_ack(self, message_id: int, token: int, summary: str = "") -> None:
        command = Ack(message_id=message_id, token=token, summary=summary)
        result = self.apply(command)
        assert isinstance(result, Outcome)
        assert result.code is self.model.ack(command)

    def do_fail(
        self, message_id: int, token: int, error_class: str, permanent: bool, retry_after_ms: int | None
    ) -> None:
        not_before_ms = None if retry_after_ms is None else self.model.now_ms + retry_after_ms
        command = Fail(
            message_id=message_id,
            token=token,
            error_class=error_class,
            error_text="downstream said no",
            permanent=permanent,
            retry_after_ms=retry_after_ms,
        )
        result = self.apply(command)
        assert isinstance(result, Outcome)
        assert result.code is self.model.fail(command)
        if result.code is Code.OK:
            m = self.model.messages[message_id]
            assert result.state is m.state(self.model.now_ms)
            if m.phase == "waiting":
                assert result.due_ms == m.due_ms
                assert m.due_ms > self.model.now_ms, "a retry due immediately: no backoff"
                if not_before_ms is not None:
                    cap_ms = self.model.now_ms + self.model.policies[m.kind].retry_after_max_ms
                    assert m.due_ms >= min(not_before_ms, cap_ms), "Retry-After not honoured"

    @initialize(kinds=st.lists(st.sampled_from(BUILTIN_KINDS), min_size=2, max_size=6))
    def seed(self, kinds: list[str]) -> None:
        for i, kind in enumerate(kinds):
            self.enqueue(
                kind=kind, key=f"seed-{i}", ref=REFS[i % 3], payload=b"s", delay_ms=0, absolute=False
            )

    @rule(
        kinds=st.lists(st.sampled_from(KINDS), max_size=2, unique=True).map(tuple),
        count_max=st.integers(1, 5),
        lease_ms=st.sampled_from((1000, 5000, 60_000)),
    )
    def lease(self, kinds: tuple[str, ...], count_max: int, lease_ms: int) -> None:
        self.do_lease(kinds, count_max, lease_ms)

    @rule(
        count_max=st.integers(1, 4),
        outcomes=st.lists(st.sampled_from(WORK_OUTCOMES), min_size=4, max_size=4),
        error_class=st.sampled_from(ERROR_CLASSES),
    )
    def work(self, count_max: int, outcomes: list[str], error_class: str) -> None:
        """A worker's loop: lease a batch, then ack, fail, or abandon each message."""
        for grant, outcome in zip(self.do_lease((), count_max, 2000), outcomes, strict=False):
            if outcome in ("ack", "ack_twice"):
                self.do_ack(grant.message_id, grant.token, "ok")
                if outcome == "ack_twice":  # the worker's retried ack: ALREADY_ACKED, not an error
                    self.do_ack(grant.message_id, grant.token, "ok")
            elif outcome == "fail_then_ack":  # an ack arriving after its own fail must be refused
                self.do_fail(grant.message_id, grant.token, error_class, False, None)
                self.do_ack(grant.message_id, grant.token, "late")
            elif outcome != "abandon":
                retry_after_ms = 45_000 if outcome == "retry_after" else None
                self.do_fail(
                    grant.message_id, grant.token, error_class, outcome == "permanent", retry_after_ms
                )

    @rule(
        picks=st.lists(st.tuples(MESSAGE_CHOICE, st.sampled_from((0, 0, 0, 1, 2, 3))), min_size=1, max_size=6),
        lease_first=st.booleans(),
    )
    def ack_many(self, picks: list[tuple[int, int]], lease_first: bool) -> None:
        """A worker's batch of acks in one AckMany: each judged as a lone ack, in order (repeats too)."""
        acks: list[Ack] = []
        if lease_first:
            acks += [Ack(message_id=g.message_id, token=g.token) for g in self.do_lease((), 3, 2000)]
        for message_id, mode in picks:
            chosen = self.pick(message_id)
            acks.append(Ack(message_id=chosen, token=self.token_for(chosen, mode)))
        result = self.apply(AckMany(acks=tuple(acks)))
        assert isinstance(result, Outcomes)
        assert [o.code for o in result.outcomes] == [self.model.ack(a) for a in acks]

    @rule(
        message_id=MESSAGE_CHOICE,
        mode=st.sampled_from((0, 0, 0, 1, 2, 3)),
        summary=st.sampled_from(("", "paid")),
    )
    def ack(self, message_id: int, mode: int, summary: str) -> None:
        message_id = self.pick(message_id)
        self.do_ack(message_id, self.token_for(message_id, mode), summary)

    @rule(
        message_id=MESSAGE_CHOICE,
        mode=st.sampled_from((0, 0, 0, 1, 2, 3)),
        error_class=st.sampled_from(ERROR_CLASSES),
        permanent=st.booleans(),
        retry_after_ms=st.sampled_from((None, None, 1, 45_000, 10**10)),
    )
    def fail(
        self, message_id: int, mode: int, error_class: str, permanent: bool, retry_after_ms: int | None
    ) -> None:
        message_id = self.pick(message_id)
        self.do_fail(message_id, self.token_for(message_id, mode), error_class, permanent, retry_after_ms)

    @rule(
        message_id=MESSAGE_CHOICE,
        mode=st.sampled_from((0, 0, 0, 1, 2, 3)),
        lease_ms=st.sampled_from((1000, 20_000)),
    )
    def extend(self, message_id: int, mode: int, lease_ms: int) -> None:
        message_id = self.pick(message_id)
        command = ExtendLease(
            message_id=message_id, token=self.token_for(message_id, mode), lease_ms=lease_ms
        )
        result = self.apply(command)
        assert isinstance(result, Outcome)
        assert result.code is self.model.extend(command)

    @rule(message_id=MESSAGE_CHOICE, mode=st.sampled_from((0, 0, 0, 1, 2, 3)))
    def release(self, message_id: int, mode: int) -> None:
        """A draining worker hands a lease back: ready now, the delivery not counted."""
        message_id = self.pick(message_id)
        command = Release(message_id=message_id, token=self.token_for(message_id, mode))
        result = self.apply(command)
        assert isinstance(result, Outcome)
        assert result.code is self.model.release(command)

    @rule(limit=st.integers(1, 3))
    def expire_leases(self, limit: int) -> None:
        result = self.apply(ExpireLeases(limit=limit))
        assert isinstance(result, BatchResult)
        assert list(result.ids) == self.model.expire(limit)

    @rule(
        ids=st.lists(MESSAGE_CHOICE, min_size=1, max_size=3),
        by_filter=st.booleans(),
        kind=st.sampled_from((None, *BUILTIN_KINDS)),
        edit=st.sampled_from((None, b"edited")),
    )
    def redrive(self, ids: list[int], by_filter: bool, kind: str | None, edit: bytes | None) -> None:
        ids = [self.pick(choice, prefer="dead") for choice in ids]
        if by_filter:
            command = Redrive(actor="alice", reason="fixed", filter=DeadLetterFilter(kind=kind), limit=2)
        else:
            command = Redrive(
                actor="alice", reason="fixed", ids=tuple(ids[:1] if edit else ids), payload=edit
            )
        result = self.apply(command)
        assert isinstance(result, BatchResult) and result.code is Code.OK
        done, refused = self.model.redrive(command)
        assert (list(result.ids), list(result.refused)) == (done, refused)

    @rule(message_id=MESSAGE_CHOICE)
    def discard(self, message_id: int) -> None:
        message_id = self.pick(message_id)
        result = self.apply(Discard(message_id=message_id, actor="bob", reason="duplicate order"))
        assert isinstance(result, Outcome)
        assert (result.code, result.state) == self.model.discard(
            Discard(message_id=message_id, actor="b", reason="")
        )

    @rule(kind=st.sampled_from(KINDS), holder=st.sampled_from(HOLDERS), pause=st.booleans())
    def pause_or_resume(self, kind: str, holder: str, pause: bool) -> None:
        command: QueueCommand = (
            PauseKind(kind=kind, holder=holder, reason="downstream outage")
            if pause
            else ResumeKind(kind=kind, holder=holder)
        )
        result = self.apply(command)
        assert isinstance(result, KindResult)
        held = self.model.holders.setdefault(kind, set())
        if kind not in self.model.policies:
            assert result.code is Code.UNKNOWN_KIND
        elif pause and holder in held:
            assert result.code is Code.ALREADY_PAUSED
        elif not pause and holder not in held:
            assert result.code is Code.NOT_PAUSED
        else:
            assert result.code is Code.OK
            held.add(holder) if pause else held.discard(holder)
        if kind in self.model.policies:
            assert result.holders == tuple(sorted(held))

    @rule(kind=st.sampled_from(KINDS), policy=st.sampled_from(POLICIES))
    def set_policy(self, kind: str, policy: RetryPolicy) -> None:
        result = self.apply(SetPolicy(kind=kind, policy=policy))
        assert isinstance(result, KindResult) and result.code is Code.OK
        self.model.policies[kind] = policy

    @rule(
        retention_ms=st.sampled_from((None, 29_999, 30_000, 60_000, RETENTION_MS)),
        event_retention_ms=st.sampled_from((None, 29_999, 60_001, EVENT_RETENTION_MS)),
    )
    def set_retention(self, retention_ms: int | None, event_retention_ms: int | None) -> None:
        before = dump(self.machine, self.model.now_ms)[:5], list(self.machine.view.scan(Table.SETTINGS))
        result = self.apply(
            SetRetention(actor="ops", reason="test", retention_ms=retention_ms, event_retention_ms=event_retention_ms)
        )
        given = [v for v in (retention_ms, event_retention_ms) if v is not None]
        if not given or min(given) < RETENTION_FLOOR_MS:
            assert isinstance(result, ErrorResult) and result.code is Code.INVALID
            after = dump(self.machine, self.model.now_ms)[:5], list(self.machine.view.scan(Table.SETTINGS))
            assert after == before  # refused: nothing changed (but the applied index)
            return
        self.model.retention_ms = retention_ms or self.model.retention_ms
        self.model.event_retention_ms = event_retention_ms or self.model.event_retention_ms
        assert result == RetentionResult(
            code=Code.OK, retention_ms=self.model.retention_ms, event_retention_ms=self.model.event_retention_ms
        )

    @rule(limit=st.integers(1, 4))
    def purge(self, limit: int) -> None:
        conn = self.machine.view
        kept = queries.events_after(conn, 0, limit=10_000)
        result = self.apply(Purge(limit=limit))
        assert isinstance(result, BatchResult)
        assert list(result.ids) == self.model.purge(limit)
        first = queries.first_event_seq(conn)
        removed = [e for e in kept if e.seq < first]
        assert result.events_purged == len(removed)
        assert all(e.seq >= first for e in queries.events_after(conn, 0, limit=10_000))
        cutoff = self.model.now_ms - self.model.event_retention_ms
        assert all(e.ts_ms <= cutoff for e in removed), "an event was purged before its retention ended"
        still_old = [e for e in kept if e.seq >= first and e.ts_ms <= cutoff]
        assert not still_old or len(removed) == EVENTS_PURGE_MAX, "an event past its retention was kept"
        if removed:
            event("purged events")

    @rule(data=st.binary(max_size=40))
    def garbage_is_an_error_result(self, data: bytes) -> None:
        before = dump(self.machine, self.model.now_ms)[:5]
        result = codec.decode_result(self.apply_raw(data))
        assert isinstance(result, ErrorResult)
        assert result.code in (Code.DECODE_ERROR, Code.INVALID, Code.UNSUPPORTED_VERSION)
        assert dump(self.machine, self.model.now_ms)[:5] == before

    @rule()
    def snapshot_then_restore(self) -> None:
        path = Path(self.tmp.name) / f"snap-{self.index}.db"
        index = self.machine.write_snapshot(path)
        fresh = self.new_machine()
        fresh.restore_snapshot(path, index)
        assert dump(fresh, self.model.now_ms) == dump(self.machine, self.model.now_ms)
        self.machine.close()
        self.machine = fresh

    # ---- invariants ------------------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        conn, now_ms = self.machine.view, self.model.now_ms
        stored = {u64_of(key) for key, _ in conn.scan(Table.MESSAGES)}
        assert stored == set(self.model.messages), "a message was dropped or invented"
        for message_id in self.model.purged:
            assert queries.get_message(conn, message_id, now_ms=now_ms) is None
        for message_id, m in self.model.messages.items():
            view = queries.get_message(conn, message_id, now_ms=now_ms)
            assert view is not None
            assert view.state is m.state(now_ms), (message_id, view.state, m)
            assert view.attempts == m.attempts == len(view.history), "attempt count drifted"
            assert [a.attempt for a in view.history] == list(range(1, m.attempts + 1))
            assert view.token == m.token
            assert view.lease_deadline_ms == m.deadline_ms
            if m.phase == "waiting":
                assert view.due_ms == m.due_ms
            assert view.dead_reason == m.dead_reason
            if m.phase == "dead":
                self.check_dead_letter(m)
        # counts() reads the replicated counters: they must equal the model's states exactly
        expected: dict[tuple[str, State], int] = {}
        for m in self.model.messages.values():
            key = (m.kind, m.state(now_ms))
            expected[key] = expected.get(key, 0) + 1
        counted = {(c.kind, c.state): c.count for c in queries.counts(conn, now_ms=now_ms)}
        assert counted == expected, "phase counters drifted from the messages"

    def check_dead_letter(self, m: RefMessage) -> None:
        assert m.dead_justified, f"dead letter {m.id} without exhausted attempts, age or a permanent error"

    @invariant()
    def events_are_dense_and_acked_once(self) -> None:
        conn = self.machine.view
        kept = queries.events_after(conn, 0, limit=10_000)
        first = queries.first_event_seq(conn)
        assert [e.seq for e in kept] == list(range(first, first + len(kept))), "kept events are not a dense suffix"
        for e in kept:
            assert self.events_seen.setdefault(e.seq, e) == e, f"event {e.seq} changed"
        events = [self.events_seen[seq] for seq in sorted(self.events_seen)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert all(a.log_index <= b.log_index for a, b in itertools.pairwise(events))
        succeeded = [e.message_id for e in events if e.type is EventType.SUCCEEDED]
        assert len(succeeded) == len(set(succeeded)), "a message succeeded twice"


QueueComparison.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQueueComparison = QueueComparison.TestCase


class QueueComparisonOnLmdb(QueueComparison):
    """The same rules, model and invariants on the nodes' store."""

    def new_machine(self) -> QueueMachine:
        self.machines = getattr(self, "machines", 0) + 1
        return QueueMachine(LmdbStore(Path(self.tmp.name) / f"queue-{self.machines}.lmdb"), self.config)


QueueComparisonOnLmdb.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQueueComparisonOnLmdb = QueueComparisonOnLmdb.TestCase
