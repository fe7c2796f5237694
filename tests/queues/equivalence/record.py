"""Record a log, and what the SQL queue machine made of it, for the store equivalence test.

The queue's rules moved out of the SQLite machine (queues/machine.py as of commit 9597459: bc0d106
and issue 20's in-doubt deadlines) into a
pure core over a storage port. That change must not change what any replica computes: for the
same log, the same result bytes for every command, the same answers to the same queries, and the
same state. This script records all three from the *old* machine:

    git worktree add /tmp/old-queue 9597459 && ln -s /work/main/.venv /tmp/old-queue/.venv
    cd /tmp/old-queue && PYTHONPATH=/tmp/old-queue .venv/bin/python /path/to/record.py --out recorded.msgpack.gz

It is self-contained (it imports only what the old machine's modules export) so that it can be run
against any older checkout again, for instance after a change of semantics lands on main before
the new core: re-record there, then make the new core pass `test_store_equivalence.py`.
The fixture was last recorded on main at fe4a6b3 (issue 26: a Fail's Retry-After as a duration,
`retry_after_ms`, beside the absolute `not_before_ms` of older workers; the simulation seeds'
leaders stamp the log's clock), which is why the script draws `retry_after_ms` (a checkout
before issue 26 has no such field).

What is recorded (msgpack, gzip):
  * `entries`: (index, now_ms, [(client_id, seq, data)] or None for a no-op entry, respond), in log
    order (respond: the apply of the node that proposed the entry, else a follower's):
    a scripted random workload over every command (sessions, retries, garbage bytes, clocks that
    go back, review, jobs, tokens, documents), then the committed log of two queue simulation
    seeds, each on a machine of its own (`logs`);
  * `results`: a digest of the result bytes of every command;
  * `checks`: at points in each log, the canonical state (`canonical_state`) and the answer bytes
    of a battery of queries with a pinned now_ms.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import random
import sqlite3
import sys
from pathlib import Path
from typing import Any

import msgspec

from delay.policy import DEFAULT_POLICY, ErrorClassRule, RetryPolicy
from queues import codec
from queues import query_codec as qc
from queues.audit_filter import AuditFilter
from queues.machine import QueueConfig, QueueMachine
from queues.model import (
    Ack,
    AckMany,
    Approve,
    ControlJob,
    DeadLetterFilter,
    Discard,
    EditRedrive,
    Enqueue,
    ExpireLeases,
    ExtendLease,
    Fail,
    ItemResult,
    JobAction,
    Lease,
    PauseKind,
    Propose,
    Purge,
    PutDocument,
    PutToken,
    QueueCommand,
    Redrive,
    RedriveJob,
    Reject,
    Release,
    ResumeKind,
    RevokeToken,
    Role,
    SetPolicy,
    SetQuota,
    SetRetention,
    StepJob,
)
from queues.replicated import ReplicatedQueueMachine
from raft_store.state_machine import Command

T0 = 1_700_000_000_000
CONFIG = QueueConfig(retention_ms=4_000, event_retention_ms=9_000, retention_floor_ms=1_000)
KINDS = ("transfer", "list_update", "callback", "transfer", "list_update", "callback", "refund")
CURRENCIES = ("CNY", "JPY", "USD", "cny")
ERRORS = ("timeout", "insufficient_funds", "http_500", "downstream_4xx")
ACTORS = ("alice", "bob", "carol")
POLICIES = (
    RetryPolicy(tiers_ms=(300, 900), tier_jitter_ratio=0.5, attempts_max=3),
    RetryPolicy(
        tiers_ms=(), backoff_min_ms=200, backoff_max_ms=3000, attempts_max=4,
        overrides=(ErrorClassRule(error_class="insufficient_funds", permanent=True),
                   ErrorClassRule(error_class="timeout", permanent=False, attempts_max=2)),
    ),
    RetryPolicy(tiers_ms=(500,), attempts_max=5, age_max_ms=4_000),
    DEFAULT_POLICY,
)  # fmt: skip


# ---- the canonical state of the old store ---------------------------------------------------------
def _rows(conn: sqlite3.Connection, sql: str) -> list[list[Any]]:
    return [[bytes(v) if isinstance(v, memoryview) else v for v in row] for row in conn.execute(sql)]


def canonical_state(conn: sqlite3.Connection) -> dict[str, Any]:
    """Everything replicated, as plain rows in a fixed order: what two equal states share,
    whatever the store. Derived indexes (due times, leases, dead letters by group...) are not in
    it: they follow from these rows, and the new store checks its own against them."""
    meta = conn.execute(
        "SELECT next_message_id, next_token, next_event_seq, rr_offset, clock_ms FROM queue_meta WHERE id = 0"
    ).fetchone()
    return {
        "applied_index": conn.execute("SELECT applied_index FROM _raft_meta WHERE id = 0").fetchone()[0],
        "meta": list(meta),
        "messages": _rows(conn, (
            "SELECT m.id, kind, idempotency_key, ref_key, content_hash, edited_payload, headers, created_ms, phase,"
            " due_ms, attempts, budget_attempts, budget_start_ms, last_error_class, last_error_text, token, token_open,"
            " lease_worker, lease_deadline_ms, dead_ms, dead_reason, dead_error_class, terminal_ms, purge_ms,"
            " request_id, edited_hash, version, previous_id, superseded_by, in_doubt_until_ms, b.payload"
            " FROM messages m LEFT JOIN bodies b ON b.id = m.id ORDER BY m.id"
        )),
        "attempts": _rows(conn, "SELECT * FROM attempts ORDER BY message_id, attempt"),
        "idempotency": _rows(conn, "SELECT key, message_id FROM idempotency ORDER BY key"),
        "events": _rows(conn, "SELECT seq, log_index, ts_ms, type, message_id, kind, data FROM events ORDER BY seq"),
        "kinds": _rows(conn, "SELECT kind, policy FROM kinds ORDER BY kind"),
        "settings": _rows(conn, "SELECT name, value FROM settings ORDER BY name"),
        "phase_counts": _rows(conn, "SELECT kind, phase, count FROM phase_counts WHERE count != 0 ORDER BY kind, phase"),
        "pauses": _rows(conn, "SELECT kind, holder, reason, since_ms FROM kind_pauses ORDER BY kind, holder"),
        "tokens": _rows(conn, (
            "SELECT name, role, secret_hash, created_ms, created_by, revoked_ms, rate_per_s, burst FROM tokens"
            " ORDER BY name"
        )),
        "access_version": conn.execute("SELECT version FROM access_meta WHERE id = 0").fetchone()[0],
        "documents": _rows(conn, (
            "SELECT namespace, name, body, updated_ms, updated_by FROM documents ORDER BY namespace, name"
        )),
        "document_versions": _rows(conn, "SELECT namespace, version FROM document_versions ORDER BY namespace"),
        "audit": _rows(conn, (
            "SELECT seq, log_index, ts_ms, actor, action, target, reason, before, after, prev_hash, hash FROM audit"
            " ORDER BY seq"
        )),
        "audit_messages": _rows(conn, "SELECT message_id, seq FROM audit_messages ORDER BY message_id, seq"),
        "audit_head": list(conn.execute("SELECT count, head FROM audit_meta WHERE id = 0").fetchone()),
        "proposals": _rows(conn, (
            "SELECT id, action, body, proposer, reason, targets, created_ms, expires_ms, state, decided_by,"
            " decided_ms, decision_reason FROM proposals ORDER BY id"
        )),
        "jobs": _rows(conn, (
            "SELECT id, actor, reason, proposal_id, approved_by, state, rate_per_s, created_ms, last_step_ms,"
            " finished_ms, rate_base, controlled_by, total, pending, redriven, refused, not_redriven FROM jobs"
            " ORDER BY id"
        )),
        "job_items": _rows(conn, "SELECT job_id, message_id, result, code, done_ms FROM job_items ORDER BY job_id, message_id"),
        "sessions": _rows(conn, "SELECT client_id, seq, result, touched_index FROM _sessions ORDER BY client_id"),
    }


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=12).digest()


def state_digests(state: dict[str, Any]) -> dict[str, bytes]:
    """Per part of the canonical state, a digest: intermediate checks keep only these (the last
    check of a log keeps the whole state, so a difference found there can be shown)."""
    return {name: digest(msgspec.msgpack.encode(value)) for name, value in state.items()}


# ---- the queries asked at each check ------------------------------------------------------------------
def query_battery(rng: random.Random, last_id: int, last_seq: int) -> list[qc.QueueQuery]:
    ids = tuple(range(1, last_id + 1))[-400:] or (1,)
    some = tuple(sorted(rng.sample(ids, min(len(ids), 20))))
    filters = [
        DeadLetterFilter(),
        DeadLetterFilter(kind="transfer"),
        DeadLetterFilter(error_class="insufficient_funds"),
        DeadLetterFilter(currency="CNY"),
        DeadLetterFilter(currency="CNY", amount_min_minor=100, amount_max_minor=600),
        DeadLetterFilter(amount_min_minor=1),
        DeadLetterFilter(attempts_min=2),
        DeadLetterFilter(attempts_max=1, kind="callback"),
        DeadLetterFilter(ref_key="order-3"),
        DeadLetterFilter(dead_from_ms=T0 + 20_000, dead_to_ms=T0 + 400_000),
    ]
    queries: list[qc.QueueQuery] = [
        qc.GetMessages(ids=ids[:1000]),
        qc.GetMessages(ids=some, with_history=False),
        qc.ByIdempotencyKeys(keys=(*(f"k{i}" for i in range(60)), "k3#v2", "k7#v2"), with_history=True),
        qc.ByRefKey(ref_key="order-2"),
        qc.ByRefKey(ref_key="order-5", limit=3),
        qc.Counts(),
        qc.OldestDueAge(),
        qc.EventsAfter(seq=0, limit=10_000),
        qc.EventsAfter(seq=max(0, last_seq - 50), limit=20),
        qc.EventsDigest(after=0),
        qc.EventsDigest(after=max(0, last_seq - 100), limit=64),
        qc.ScrubPayloads(after=0, limit=10_000),
        qc.Retention(),
        qc.Kinds(),
        qc.MessageEvents(ids=some),
        qc.Tokens(),
        qc.Tokens(known_version=3),
        qc.WorkDue(),
        qc.WorkDue(kinds=("transfer", "refund")),
        qc.MaintenanceDue(),
        qc.Documents(namespace="breakers"),
        qc.Documents(namespace="breakers", known_version=2),
        qc.AuditLog(after=0, limit=1000),
        qc.AuditLog(limit=7),
        qc.AuditLog(before=5, limit=3),
        qc.AuditLog(limit=50, filter=AuditFilter(actor="alice")),
        qc.AuditLog(limit=50, filter=AuditFilter(actions=("redriven", "discarded", "approve"))),
        qc.AuditLog(limit=50, filter=AuditFilter(target_prefix="token:")),
        qc.AuditLog(limit=50, filter=AuditFilter(exclude_target_prefixes=("token:", "document:"))),
        qc.AuditLog(limit=50, filter=AuditFilter(message_id=some[0])),
        qc.AuditLog(limit=50, filter=AuditFilter(from_ms=T0 + 10_000, to_ms=T0 + 900_000, target="kind:transfer")),
        qc.MessageAudit(ids=some),
        qc.Proposals(),
        qc.Proposals(pending_only=True),
        qc.Proposals(ids=(1, 2, 3, 99)),
        qc.Proposals(before_id=4, limit=2),
        qc.Jobs(),
        qc.Jobs(active_only=True),
        qc.Jobs(ids=(1, 2)),
        qc.JobItems(job_id=1, limit=1000),
        qc.JobItems(job_id=2, after_message_id=5, limit=3, result=rng.choice(list(ItemResult))),
    ]  # fmt: skip
    for dead_filter in filters:
        queries.append(qc.DeadLetters(filter=dead_filter, limit=1000))
        queries.append(qc.DeadLetters(filter=dead_filter, limit=2))
        queries.append(qc.DeadLetterSummary(filter=dead_filter))
    queries.append(qc.DeadLetters(cursor=f"{T0 + 50_000}.7", limit=5))
    queries.append(qc.DeadLetters(cursor="nonsense", limit=5))
    return queries


# ---- the scripted workload -------------------------------------------------------------------
class Script:
    """Random, seeded commands over every kind of command, steered by the machine's own answers."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.machine = ReplicatedQueueMachine(":memory:", CONFIG, clock_ms=lambda: T0)
        self.index = 0
        self.now_ms = T0
        self.entries: list[Any] = []
        self.results: list[bytes] = []
        self.checks: list[Any] = []
        self.ids: list[int] = []
        self.grants: list[tuple[int, int]] = []
        self.proposals: list[int] = []
        self.jobs: list[int] = []
        self.sessions: dict[int, int] = {}
        self.last_session: dict[int, list[tuple[int, int, bytes]]] = {}

    # -- driving
    def entry(self, commands: list[tuple[int, int, bytes]] | None, now_ms: int | None = None) -> list[bytes]:
        self.index += 1
        stamp = self.now_ms if now_ms is None else now_ms
        respond = self.rng.random() < 0.8  # else a follower's apply: nobody reads the results
        self.entries.append([self.index, stamp, commands, respond])
        if commands is None:
            self.machine.note_applied(self.index)
            return []
        results = self.machine.apply_batch(self.index, stamp, [Command(c, s, d) for c, s, d in commands], respond=respond)
        self.results.extend(results)
        for data in results:
            if data[:1] == b"\x01":  # not the sessions' stale answer
                self.learn(codec.decode_result(data))
        return results

    def learn(self, result: Any) -> None:
        for name in ("message_id",):
            value = getattr(result, name, 0)
            if value and value not in self.ids:
                self.ids.append(value)
        for grant in getattr(result, "grants", ()):
            self.grants.append((grant.message_id, grant.token))
        for new_id in getattr(result, "new_ids", ()):
            self.ids.append(new_id)
        proposal = getattr(result, "proposal_id", 0)
        if proposal and proposal not in self.proposals:
            self.proposals.append(proposal)
        job = getattr(result, "job_id", None)
        if job and job not in self.jobs:
            self.jobs.append(job)

    def one(self, command: QueueCommand) -> None:
        self.entry([(0, 0, codec.encode_command(command))])

    def check(self, full: bool = False) -> None:
        conn = self.machine.connection
        last_id = conn.execute("SELECT next_message_id FROM queue_meta").fetchone()[0] - 1
        last_seq = conn.execute("SELECT next_event_seq FROM queue_meta").fetchone()[0] - 1
        answers = []
        for query in query_battery(self.rng, last_id, last_seq):
            data = qc.encode_query(msgspec.structs.replace(query, now_ms=self.now_ms))
            answer = self.machine.query(data)
            answers.append([data, answer if full and len(answer) <= 2048 else digest(answer)])
        state = canonical_state(conn)
        self.checks.append({"after": len(self.entries), "state": state if full else state_digests(state), "queries": answers})

    # -- choices
    def some_id(self) -> int:
        if self.ids and self.rng.random() < 0.9:
            return self.rng.choice(self.ids[-60:])
        return self.rng.randint(1, 10_000)

    def some_grant(self) -> tuple[int, int]:
        """Mostly a live grant of the latest leases (a worker acting on its work), else an old one."""
        if self.grants and self.rng.random() < 0.7:
            return self.grants.pop(self.rng.randrange(max(0, len(self.grants) - 12), len(self.grants)))
        if self.grants and self.rng.random() < 0.8:
            return self.rng.choice(self.grants[-80:])
        return self.some_id(), self.rng.randint(1, 500)

    def payload_of(self, number: int) -> bytes:
        """The payload a caller sends for key k<number>: the same on every retry."""
        return random.Random(number).choice((b"", b"x")) + self.payload_with(random.Random(number * 7 + 1))

    def payload(self) -> bytes:
        return self.payload_with(self.rng)

    def payload_with(self, rng: random.Random) -> bytes:
        shape = rng.random()
        if shape < 0.55:
            amount: Any = rng.choice((rng.randint(0, 1000), rng.randint(-50, 50), 2**63 + 5, 1.5, "100", None))
            body: dict[str, Any] = {"currency": rng.choice(CURRENCIES), "amount_minor": amount, "n": rng.randint(0, 99)}
            if rng.random() < 0.1:
                del body["currency"]
            return msgspec.json.encode(body)
        if shape < 0.65:
            return b'{"currency":"CNY","amount_minor":5,"amount_minor":7}'
        if shape < 0.7:
            return b'[1, 2, {"currency": "CNY"}]'
        if shape < 0.75:
            return b'{"currency": "JPY", "amount_minor": 12e1}'
        if shape < 0.8:
            return bytes([0xFF, 0xFE, 0x00]) + rng.randbytes(4)
        return rng.randbytes(rng.randint(0, 40))

    def enqueue(self) -> Enqueue:
        rng = self.rng
        number = rng.randint(0, 400)
        key = f"k{number}"
        due = None
        if rng.random() < 0.1:
            due = self.now_ms + rng.choice((-5_000, 0, 700, 3_000, 2 * 366 * 86_400_000 + 1))
        return Enqueue(
            kind=KINDS[number % len(KINDS)] if rng.random() < 0.95 else rng.choice(KINDS), idempotency_key=key,
            ref_key=f"order-{number % 7}",
            payload=self.payload() if rng.random() < 0.1 else self.payload_of(number),
            headers={"traceparent": f"00-{rng.getrandbits(64):016x}"} if rng.random() < 0.3 else {},
            delay_ms=rng.choice((0, 0, 0, 200, 1_500, 5_000)), due_ms=due,
            request_id=rng.choice((0, rng.randint(1, 5), rng.getrandbits(63))),
        )  # fmt: skip

    def step(self) -> None:
        rng = self.rng
        self.now_ms += rng.choice((0, 0, 1, 50, 250, 900, 2_000)) if rng.random() < 0.97 else rng.choice((30_000, 200_000))
        op = rng.random()
        if op < 0.22:
            self.entry([(0, 0, codec.encode_command(self.enqueue())) for _ in range(rng.randint(1, 6))])
        elif op < 0.34:
            kinds = () if rng.random() < 0.7 else tuple(rng.sample(KINDS, 2))
            probe = rng.choice((None, None, "breaker", "ops"))
            lease = Lease(worker_id=f"w{rng.randint(0, 2)}", count_max=rng.randint(1, 12), lease_ms=rng.choice((300, 5_000, 60_000)),
                          kinds=kinds, probe=probe)  # fmt: skip
            client = rng.randint(1, 4)
            self.session_send(client, codec.encode_command(lease))
        elif op < 0.44:
            message_id, token = self.some_grant()
            kind = rng.random()
            if kind < 0.5:
                command: QueueCommand = Ack(message_id=message_id, token=token, summary="ok")
            elif kind < 0.8:
                command = Fail(message_id=message_id, token=token, error_class=rng.choice(ERRORS),
                               error_text="boom" * rng.randint(0, 3), permanent=rng.random() < 0.35,
                               not_before_ms=rng.choice((None, None, self.now_ms + 1_000, self.now_ms + 10**10)),
                               retry_after_ms=rng.choice((None, None, 0, 800, 5_000, 10**10)),
                               in_doubt_ms=rng.choice((None, None, 0, 400, 20_000)))  # fmt: skip
            elif kind < 0.9:
                command = ExtendLease(message_id=message_id, token=token, lease_ms=rng.choice((100, 5_000)))
            else:
                command = Release(message_id=message_id, token=token, interrupted=rng.random() < 0.5,
                                  in_doubt_ms=rng.choice((None, 0, 1_500)))
            self.session_send(rng.randint(1, 4), codec.encode_command(command))
        elif op < 0.48:
            acks = tuple(Ack(message_id=m, token=t) for m, t in (self.some_grant() for _ in range(rng.randint(1, 8))))
            self.one(AckMany(acks=acks))
        elif op < 0.51:
            self.one(ExpireLeases(limit=rng.randint(1, 20)))
        elif op < 0.54:
            self.one(Purge(limit=rng.randint(1, 30)))
        elif op < 0.58:
            choice = rng.random()
            if choice < 0.4:
                command = Redrive(actor=rng.choice(ACTORS), reason="r", ids=(self.some_id(), self.some_id()))
            elif choice < 0.6:
                command = Redrive(actor="alice", reason="f", filter=DeadLetterFilter(kind=rng.choice(KINDS)), limit=5)
            elif choice < 0.7:
                command = Redrive(actor="alice", reason="m", filter=DeadLetterFilter(currency="CNY", amount_min_minor=10))
            elif choice < 0.85:
                command = Redrive(actor="bob", reason="edit", ids=(self.some_id(),), payload=self.payload())
            else:
                command = Redrive(actor="bob", reason="bad", ids=(1, 2), payload=b"x")
            self.one(command)
        elif op < 0.61:
            self.one(Discard(message_id=self.some_id(), actor=rng.choice(ACTORS), reason="d", reason_code=rng.choice(("", "duplicate"))))
        elif op < 0.64:
            kind = rng.choice(KINDS)
            holder = rng.choice(("ops", "breaker"))
            if rng.random() < 0.5:
                self.one(PauseKind(kind=kind, holder=holder, reason="p", actor="alice"))
            else:
                self.one(ResumeKind(kind=kind, holder=holder, actor="bob"))
        elif op < 0.66:
            policy = rng.choice(POLICIES)
            if rng.random() < 0.1:
                policy = msgspec.structs.replace(policy, backoff_min_ms=5000, backoff_max_ms=4000)
            self.one(SetPolicy(kind=rng.choice(KINDS), policy=policy, actor="ops", reason="tune"))
        elif op < 0.67:
            self.one(SetRetention(actor="ops", reason="r", retention_ms=rng.choice((None, 500, 3_000, 6_000)),
                                  event_retention_ms=rng.choice((None, 999, 8_000, 12_000))))  # fmt: skip
        elif op < 0.70:
            name = rng.choice(("api", "worker", "ops"))
            secret = hashlib.sha256(rng.choice((b"a", b"b", b"c", name.encode()))).digest()
            choice = rng.random()
            if choice < 0.5:
                self.one(PutToken(name=name, role=rng.choice(list(Role)), secret_hash=secret, actor="admin", reason="t"))
            elif choice < 0.75:
                self.one(RevokeToken(name=name, actor="admin", reason="lost"))
            else:
                self.one(SetQuota(name=name, actor="admin", rate_per_s=rng.choice((None, 10)), burst=rng.choice((None, 20))))
        elif op < 0.72:
            body = rng.choice((b'{"mode":"open"}', b'{"mode":"closed","n":' + str(rng.randint(0, 9)).encode() + b"}",
                               None, b"[1]", b"{" + b'"x":"' + b"y" * 3000 + b'"}'))  # fmt: skip
            self.one(PutDocument(namespace=rng.choice(("breakers", "classes")), name=rng.choice(("pay", "list")),
                                 body=body, actor="ops", reason="doc"))  # fmt: skip
        elif op < 0.76:
            self.one(EditRedrive(message_id=self.some_id(), payload=self.payload(), actor=rng.choice(ACTORS),
                                 reason="fix", headers=rng.choice((None, {"x": "1"}))))  # fmt: skip
        elif op < 0.82:
            self.review()
        elif op < 0.86:
            self.job()
        elif op < 0.88:
            self.entry([(0, 0, rng.choice((b"", b"\x02abc", rng.randbytes(12), b"\x01" + rng.randbytes(9))))])
        elif op < 0.9:
            self.entry(None)
        elif op < 0.92:
            # a leader whose clock is behind: log time must not go back
            self.entry([(0, 0, codec.encode_command(self.enqueue()))], now_ms=self.now_ms - rng.randint(1, 5_000))
        elif op < 0.94:
            self.replay_session()
        else:
            mixed = [(0, 0, codec.encode_command(self.enqueue())) for _ in range(3)]
            mixed.insert(1, (0, 0, codec.encode_command(Discard(message_id=self.some_id(), actor="x", reason="y"))))
            mixed.append((0, 0, codec.encode_command(Lease(worker_id="wz", count_max=3, lease_ms=1_000))))
            self.entry(mixed)

    def session_send(self, client: int, data: bytes) -> None:
        seq = self.sessions.get(client, 0) + 1
        self.sessions[client] = seq
        self.last_session.setdefault(client, []).append((client, seq, data))
        self.entry([(client, seq, data)])

    def replay_session(self) -> None:
        """A client's retry of its last command (answered from the session), or of an older one (stale)."""
        if not self.last_session:
            return
        sent = self.last_session[self.rng.choice(sorted(self.last_session))]
        self.entry([sent[-1] if self.rng.random() < 0.7 else self.rng.choice(sent)])

    def review(self) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.45:
            kind = rng.random()
            if kind < 0.3:
                action: Any = Redrive(actor=rng.choice(ACTORS), reason="p", ids=(self.some_id(), self.some_id()))
            elif kind < 0.45:
                action = Redrive(actor="alice", reason="pf", filter=DeadLetterFilter(), limit=10)
            elif kind < 0.65:
                action = EditRedrive(message_id=self.some_id(), payload=self.payload(), actor=rng.choice(ACTORS), reason="e")
            elif kind < 0.85:
                action = Discard(message_id=self.some_id(), actor=rng.choice(ACTORS), reason="dp", reason_code="dup")
            else:
                action = RedriveJob(actor=rng.choice(ACTORS), reason="bulk", ids=tuple({self.some_id() for _ in range(6)}),
                                    rate_per_s=rng.choice((1, 3, 50)))  # fmt: skip
            self.one(Propose(action=action, ttl_ms=rng.choice((60_000, 600_000))))
        elif self.proposals and choice < 0.85:
            self.one(Approve(proposal_id=rng.choice(self.proposals[-8:]), approver=rng.choice(ACTORS), reason="ok"))
        elif self.proposals:
            self.one(Reject(proposal_id=rng.choice(self.proposals[-8:]), actor=rng.choice(ACTORS), reason="no"))

    def job(self) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.3:
            ids = tuple({self.some_id() for _ in range(rng.randint(1, 10))})
            self.one(RedriveJob(actor=rng.choice(ACTORS), reason="job", ids=ids, rate_per_s=rng.choice((1, 2, 100))))
        elif self.jobs and choice < 0.8:
            self.one(StepJob(job_id=rng.choice(self.jobs), limit=rng.randint(1, 5)))
        elif self.jobs:
            self.one(ControlJob(job_id=rng.choice(self.jobs), action=rng.choice(list(JobAction)), actor="bob", reason="c"))

    def run(self, steps: int, check_every: int) -> dict[str, Any]:
        self.check()
        for n, kind in enumerate(("transfer", "list_update", "callback", "refund")):
            self.one(SetPolicy(kind=kind, policy=POLICIES[n % 3], actor="ops", reason="short tiers"))
        for n in range(1, steps + 1):
            self.step()
            if n % check_every == 0:
                self.check()
        self.check(full=True)
        return {"entries": self.entries, "results": [digest(r) for r in self.results], "checks": self.checks,
                "config": _config()}  # fmt: skip


def _config() -> list[int]:
    return [CONFIG.retention_ms, CONFIG.event_retention_ms, CONFIG.retention_floor_ms]


# ---- the queue simulation's committed logs -------------------------------------------------------------
def simulation_log(seed: int) -> dict[str, Any]:
    """The committed entries of one queue simulation seed, replayed on a fresh machine."""
    from queues.simulation import cluster as sim

    seen: dict[int, Any] = {}
    original = sim.QueueCluster._apply_entry

    def tap(self: Any, node: Any, entry: Any) -> None:
        if entry.index not in seen:
            from raft_store.state_machine import decode_batch
            from raft_store.types import EntryKind

            if entry.kind is EntryKind.NORMAL:
                now_ms, commands = decode_batch(entry.data)
                seen[entry.index] = [entry.index, now_ms, [(c.client_id, c.seq, c.data) for c in commands], True]
            else:
                seen[entry.index] = [entry.index, 0, None, True]
        original(self, node, entry)

    sim.QueueCluster._apply_entry = tap  # type: ignore[method-assign]
    try:
        cluster = sim.QueueCluster(seed)
        cluster.run()
        config = cluster.queue_config
    finally:
        sim.QueueCluster._apply_entry = original  # type: ignore[method-assign]
    entries = [seen[i] for i in sorted(seen)]
    assert [e[0] for e in entries] == list(range(1, len(entries) + 1)), "a hole in the committed log"
    machine = QueueMachine(":memory:", config)
    results: list[bytes] = []
    checks = []
    for n, (index, now_ms, commands, _) in enumerate(entries, 1):
        if commands is None:
            machine.note_applied(index)
        else:
            results.extend(machine.apply_batch(index, now_ms, [Command(c, s, d) for c, s, d in commands]))
        if n % 400 == 0 or n == len(entries):
            state = canonical_state(machine.connection)
            checks.append({"after": n, "state": state if n == len(entries) else state_digests(state), "queries": []})
    return {
        "entries": entries, "results": [digest(r) for r in results], "checks": checks,
        "config": [config.retention_ms, config.event_retention_ms, config.retention_floor_ms],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args(argv)
    logs = [Script(seed).run(args.steps, 300) for seed in (1, 2, 3)]
    logs += [simulation_log(seed) for seed in (3001000, 3001001)]
    data = msgspec.msgpack.encode({"recorded_with": _describe(), "logs": logs})
    args.out.write_bytes(gzip.compress(data, 9, mtime=0))  # the same bytes for the same log
    print(f"{args.out}: {len(data)} bytes, {sum(len(log['entries']) for log in logs)} entries", file=sys.stderr)
    return 0


def _describe() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    return f"queues/machine.py (SQLite) at {head}"


if __name__ == "__main__":
    raise SystemExit(main())
