"""The compensation queue as a replicated state machine over SQLite.

Owns: the queue's tables (messages, their payloads in a table apart, idempotency keys, attempts history,
leases with fencing tokens, the ordered event log, kinds with their retry policies and pause
holders) and `apply_command`, the deterministic function of (state, now_ms, command bytes) to
(state, result bytes, events). Sessions, the applied index and snapshots come from
`SqliteStateMachine`.

Lease expiry is applied in three places, all deterministic and all driven by the leader's now_ms:
  * `ExpireLeases(limit)`: the leader proposes it periodically; it expires the earliest-deadline
    leases first, bounded by `limit`;
  * lazily inside every `Lease`, before granting (bounded by `QueueConfig.expire_per_lease_max`),
    so a message whose lease expired is leasable again without waiting for the periodic command;
  * lazily for the one message a command addresses (ack, fail, extend, redrive, discard), so a
    command never acts on a lease that is already past its deadline.
An expiry is a failed attempt (error class `lease_expired`, retryable) run through the kind's retry
policy. The expired token stays "open" for an ack only until the next grant: a late ack from the
worker that did the work is accepted (no needless duplicate), a late fail or extend is refused
with LEASE_EXPIRED, and anything else with a token older than the latest grant is STALE_TOKEN (after NOT_FOUND,
DONE_ELSEWHERE and ILLEGAL_STATE in the documented precedence: docs/queue.md).

Must never: read a clock, use randomness, iterate unordered collections, or load all messages
into Python. Every scan goes through an index and has a named limit.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from delay.policy import DAY_MS, DEFAULT_POLICY, DELAY_MAX_MS, DeadLetter, RetryPolicy, decide
from queues import access, audit_chain, codec, documents, due_index, in_doubt, jobs, proposals, purging, review
from queues.lifecycle import Action, transition
from queues.model import (
    BUILTIN_KINDS,
    ERROR_CLASS_INTERRUPTED,
    ERROR_CLASS_LEASE_EXPIRED,
    LEASE_RESULT_BYTES_MAX,
    OPERATOR_EVENT_TYPES,
    Ack,
    AckMany,
    Approve,
    BatchResult,
    Code,
    ControlJob,
    Discard,
    EditRedrive,
    Enqueue,
    EnqueueResult,
    ErrorResult,
    EventType,
    EventValue,
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
    Phase,
    Propose,
    Purge,
    PutDocument,
    PutToken,
    QueueCommand,
    QueueResult,
    Redrive,
    RedriveJob,
    Reject,
    Release,
    ResumeKind,
    RetentionResult,
    RevokeToken,
    SetPolicy,
    SetQuota,
    SetRetention,
    State,
    StepJob,
    content_hash,
    state_of,
)
from queues.queries import dead_letter_ids, retention_in_force
from raft_store.sqlite_machine import SqliteStateMachine
from raft_store.state_machine import Command

KINDS_MAX: Final = 1024
PAUSE_HOLDERS_MAX: Final = 64
TABLE: Final = "messages"

_policy_encoder: Final = msgspec.msgpack.Encoder()
_policy_decoder: Final = msgspec.msgpack.Decoder(RetryPolicy)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueConfig:
    """Must be identical on every replica: it shapes the replicated state."""

    retention_ms: int = 7 * DAY_MS
    """Done and discarded messages stay as idempotency tombstones this long, then are purged."""
    event_retention_ms: int = 7 * DAY_MS
    """Events stay this long for projections to read, then Purge deletes them, oldest first.
    A reader that falls further behind is told so (`EventsAnswer.first_seq`), never silently
    skipped ahead: the Kafka contract, without which the table grows by every state change."""
    retention_floor_ms: int = DAY_MS
    """The shortest retention SetRetention accepts (the config's own values may be shorter, as the
    simulation's seconds are)."""
    expire_per_lease_max: int = 1024
    default_policy: RetryPolicy = DEFAULT_POLICY
    """The policy of the built-in kinds until a SetPolicy replaces it."""

    def validate(self) -> None:
        if not 0 < self.retention_ms <= DELAY_MAX_MS:
            raise ValueError("retention_ms must be in (0, DELAY_MAX_MS]")
        if not 0 < self.event_retention_ms <= DELAY_MAX_MS:
            raise ValueError("event_retention_ms must be in (0, DELAY_MAX_MS]")
        if not 0 < self.retention_floor_ms <= DELAY_MAX_MS:
            raise ValueError("retention_floor_ms must be in (0, DELAY_MAX_MS]")
        if not 1 <= self.expire_per_lease_max <= due_index.SCAN_LIMIT_MAX:
            raise ValueError(f"expire_per_lease_max must be in [1, {due_index.SCAN_LIMIT_MAX}]")
        self.default_policy.validate()


_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL, idempotency_key TEXT NOT NULL,
        ref_key TEXT NOT NULL, content_hash BLOB NOT NULL,
        edited_payload BLOB, headers BLOB NOT NULL, created_ms INTEGER NOT NULL,
        phase INTEGER NOT NULL, due_ms INTEGER NOT NULL, attempts INTEGER NOT NULL,
        budget_attempts INTEGER NOT NULL, budget_start_ms INTEGER NOT NULL,
        last_error_class TEXT, last_error_text TEXT, token INTEGER NOT NULL, token_open INTEGER NOT NULL,
        lease_worker TEXT, lease_deadline_ms INTEGER, dead_ms INTEGER, dead_reason TEXT,
        dead_error_class TEXT, terminal_ms INTEGER, purge_ms INTEGER, request_id INTEGER, edited_hash BLOB,
        version INTEGER, previous_id INTEGER, superseded_by INTEGER, in_doubt_until_ms INTEGER)""",
    # Payloads live apart from the message rows: a lease, ack or fail rewrites its message row, and
    # with a 1 KiB payload inline that row filled a third of a page; apart, a page holds about 25
    # message rows, so a batch of 1000 state changes writes about 40 pages to the WAL, not 330.
    "CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS messages_ref ON messages (ref_key, id)",
    "CREATE INDEX IF NOT EXISTS messages_dead ON messages (dead_ms, id) WHERE phase = 4",
    "CREATE INDEX IF NOT EXISTS messages_purge ON messages (purge_ms, id) WHERE purge_ms IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS idempotency (
        key TEXT PRIMARY KEY, message_id INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS attempts (
        message_id INTEGER NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,
        worker_id TEXT NOT NULL, leased_ms INTEGER NOT NULL, ended_ms INTEGER, outcome TEXT,
        error_class TEXT, error_text TEXT, PRIMARY KEY (message_id, attempt)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY, log_index INTEGER NOT NULL, ts_ms INTEGER NOT NULL,
        type TEXT NOT NULL, message_id INTEGER NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS kinds (kind TEXT PRIMARY KEY, policy BLOB NOT NULL) WITHOUT ROWID",
    # Values set at runtime by replicated commands (SetRetention), over the QueueConfig defaults.
    "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    # Messages per (kind, stored phase), kept in step by every transition (flushed once per entry):
    # counts() on a store of ten million messages is O(kinds), not a scan of ten million rows.
    """CREATE TABLE IF NOT EXISTS phase_counts (
        kind TEXT NOT NULL, phase INTEGER NOT NULL, count INTEGER NOT NULL,
        PRIMARY KEY (kind, phase)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS kind_pauses (
        kind TEXT NOT NULL, holder TEXT NOT NULL, reason TEXT NOT NULL, since_ms INTEGER NOT NULL,
        PRIMARY KEY (kind, holder)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS queue_meta (
        id INTEGER PRIMARY KEY, next_message_id INTEGER NOT NULL, next_token INTEGER NOT NULL,
        next_event_seq INTEGER NOT NULL, rr_offset INTEGER NOT NULL, clock_ms INTEGER NOT NULL)""",
    "INSERT OR IGNORE INTO queue_meta VALUES (0, 1, 1, 1, 0, 0)",
)

_ROW_COLUMNS: Final = (
    "id, kind, phase, due_ms, attempts, budget_attempts, budget_start_ms, token, token_open,"
    " lease_deadline_ms, idempotency_key"
)


@dataclass(frozen=True, slots=True)
class _Row:
    """The fields the lifecycle needs; payloads stay on disk until a grant or a query reads them."""

    id: int
    kind: str
    phase: Phase
    due_ms: int
    attempts: int
    budget_attempts: int
    budget_start_ms: int
    token: int
    token_open: bool
    lease_deadline_ms: int | None
    idempotency_key: str

    def state(self, now_ms: int) -> State:
        return state_of(self.phase, self.due_ms, now_ms)


_META_COLUMNS: Final = "next_message_id, next_token, next_event_seq, rr_offset, clock_ms"

_MESSAGE_INSERT: Final = (
    "INSERT INTO messages (id, kind, idempotency_key, ref_key, content_hash, headers, created_ms, phase, due_ms,"
    " attempts, budget_attempts, budget_start_ms, token, token_open, request_id)"
    " VALUES (?,?,?,?,?,?,?,?,?,0,0,?,0,0,?)"
)

_OPERATOR_EVENT_NAMES: Final = ", ".join(f"'{t.value}'" for t in OPERATOR_EVENT_TYPES)
_OPERATOR_EVENTS_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS events_operator ON events (message_id, seq)"
    f" WHERE type IN ({_OPERATOR_EVENT_NAMES})"
)
"""Partial: these events are rare (dead-lettering, redrive, discard), so the index costs the hot
path nothing, and a request's timeline finds who acted on it without scanning the event log."""

_EVENT_INSERT: Final = "INSERT INTO events (seq, log_index, ts_ms, type, message_id, kind, data) VALUES (?,?,?,?,?,?,?)"


@dataclass(slots=True)
class _Batch:
    """What one log entry's commands share: counters and buffers, written once at the entry's end.

    Why: every replica applies every command, and on a busy queue the per-statement cost of
    SQLite through Python (about 5 µs) is the cluster's ceiling. A counter bumped with an UPDATE per
    use, or an event inserted per statement, costs more than the work it records; here they are
    plain integers and lists, flushed by one UPDATE and one executemany in the same transaction.
    """

    log_index: int
    now_ms: int
    """The entry's time: the leader's stamp, but never earlier than any entry applied before it,
    so a new leader whose clock is behind cannot make a due time or a lease deadline come twice."""
    next_message_id: int
    next_token: int
    next_event_seq: int
    rr_offset: int
    events: list[tuple[int, int, int, str, int, str, bytes]]
    keys: dict[str, int]
    """Idempotency keys claimed in this entry (flushed at its end); looked up before the table."""
    bodies: list[tuple[int, bytes]]
    """Payloads of this entry's new messages, written by `flush_writes` before anything reads one."""
    moved: dict[tuple[str, int], int]
    """Net change of messages per (kind, phase) in this entry, added to phase_counts at its end."""
    new_rows: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    """Message rows of this entry's enqueues, inserted by `flush_writes` before anything reads one."""
    fresh: dict[str, tuple[int, bytes, int, int, None, int | None]] = dataclasses.field(default_factory=dict)
    """What `lookup_key` answers for a key claimed by a row still in `new_rows`."""
    known: dict[str, Any] | None = None
    """The entry's idempotency keys as the table held them before it: read in one query for a run
    of enqueues, instead of one query per enqueue. None until read."""
    known_stale: bool = False
    """A command other than an enqueue ran in this entry: `known` may be out of date."""

    def move(self, kind: str, before: Phase | None, after: Phase | None, count: int = 1) -> None:
        """Count `count` messages leaving phase `before` (None: new) for `after` (None: purged)."""
        if before is not None:
            key = (kind, int(before))
            self.moved[key] = self.moved.get(key, 0) - count
        if after is not None:
            key = (kind, int(after))
            self.moved[key] = self.moved.get(key, 0) + count

    def flush_writes(self, conn: sqlite3.Connection) -> None:
        """Write the buffered message rows and payloads: call before any statement that may read them."""
        if self.new_rows:
            conn.executemany(_MESSAGE_INSERT, self.new_rows)
            self.new_rows.clear()
            self.fresh.clear()
        if self.bodies:
            conn.executemany("INSERT INTO bodies (id, payload) VALUES (?, ?)", self.bodies)
            self.bodies.clear()


_PHASE_OF: Final = {phase.value: phase for phase in Phase}
_WAITING: Final = int(Phase.WAITING)


def _row_of(row: Any) -> _Row:
    return _Row(
        int(row[0]),
        row[1],
        _PHASE_OF[row[2]],
        int(row[3]),
        int(row[4]),
        int(row[5]),
        int(row[6]),
        int(row[7]),
        bool(row[8]),
        row[9],
        row[10],
    )


@dataclass(slots=True)
class _AckWrites:
    """The row changes of accepted acks, written together by `flush`."""

    messages: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    attempts: list[tuple[int, str, int, int]] = dataclasses.field(default_factory=list)

    def flush(self, conn: sqlite3.Connection) -> None:
        if self.messages:
            conn.executemany(
                f"UPDATE messages SET phase = {Phase.DONE.value}, token_open = 0, lease_worker = NULL,"
                " lease_deadline_ms = NULL, terminal_ms = ?, purge_ms = ?, dead_ms = NULL WHERE id = ?",
                self.messages,
            )
            conn.executemany(
                "UPDATE attempts SET ended_ms = ?, outcome = ? WHERE message_id = ? AND attempt = ?", self.attempts
            )


class StoreLayoutError(RuntimeError):
    """The store on disk was written by an incompatible version of this module."""


class QueueMachine(SqliteStateMachine):
    """The queue state machine. Drive it only through `apply_batch` with encoded commands."""

    def __init__(self, path: str, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self.config.validate()
        self._kinds: dict[str, RetryPolicy] | None = None
        self._paused: frozenset[str] | None = None
        self._retention: tuple[int, int] | None = None
        self._batch: _Batch | None = None
        self._decoded: dict[int, tuple[bytes, QueueCommand | ErrorResult]] = {}
        self._last_lease: LeaseResult | None = None
        super().__init__(path)

    @property
    def connection(self) -> sqlite3.Connection:
        """For read-only queries (queues/queries.py) between applies, on the applying thread."""
        return self._conn

    def log_time_ms(self) -> int:
        """The time of the last applied entry (the machine's clock; 0 before the first)."""
        (clock_ms,) = self._conn.execute("SELECT clock_ms FROM queue_meta WHERE id = 0").fetchone()
        return int(clock_ms)

    # ---- SqliteStateMachine hooks -----------------------------------------------------------
    def create_tables(self, conn: sqlite3.Connection) -> None:
        inline = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
        if "payload" in inline:
            raise StoreLayoutError(
                "this queue store keeps payloads inside the message rows (the layout before 2026-11-22);"
                " this version keeps them in a table apart: start the node on an empty data directory"
                " and let it catch up from the others"
            )
        had_counts = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'phase_counts'"
        ).fetchone()
        for statement in _SCHEMA:
            conn.execute(statement)
        if had_counts is None:  # a store from before the counters: count once, here
            conn.execute(
                "INSERT INTO phase_counts (kind, phase, count) SELECT kind, phase, count(*) FROM messages"
                " GROUP BY kind, phase"
            )
        columns = {row[1] for row in conn.execute("PRAGMA table_info(queue_meta)")}
        if "clock_ms" not in columns:  # a store written before the monotonic clock
            conn.execute("ALTER TABLE queue_meta ADD COLUMN clock_ms INTEGER NOT NULL DEFAULT 0")
        message_columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
        if "request_id" not in message_columns:
            conn.execute("ALTER TABLE messages ADD COLUMN request_id INTEGER")  # before sessionless enqueues
        if "edited_hash" not in message_columns:  # before grants carried payload hashes
            conn.execute("ALTER TABLE messages ADD COLUMN edited_hash BLOB")
        for column in ("version", "previous_id", "superseded_by"):  # before edits made new versions
            if column not in message_columns:
                conn.execute(f"ALTER TABLE messages ADD COLUMN {column} INTEGER")
        if "in_doubt_until_ms" not in message_columns:  # before grants carried the in-doubt deadline
            conn.execute("ALTER TABLE messages ADD COLUMN in_doubt_until_ms INTEGER")
        due_index.create_indexes(conn, TABLE)
        access.create_tables(conn)
        documents.create_tables(conn)
        audit_chain.create_tables(conn)
        proposals.create_tables(conn)
        jobs.create_tables(conn)
        conn.execute(_OPERATOR_EVENTS_INDEX)
        policy = _policy_encoder.encode(self.config.default_policy)
        for kind in BUILTIN_KINDS:
            conn.execute("INSERT OR IGNORE INTO kinds (kind, policy) VALUES (?, ?)", (kind, policy))
        self._forget_caches()

    def apply_batch(
        self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True
    ) -> list[bytes]:
        # Decoded once here, so a run of enqueues can have its idempotency keys read in one query.
        self._decoded = {id(c.data): (c.data, codec.decode_command(c.data)) for c in commands}
        try:
            return super().apply_batch(index, now_ms, commands, respond=respond)
        except BaseException:
            self._forget_caches()  # the transaction rolled back: so must what was cached from it
            raise
        finally:
            self._batch = None
            self._decoded = {}

    def begin_batch(self, conn: sqlite3.Connection, index: int, now_ms: int) -> None:
        row = conn.execute(f"SELECT {_META_COLUMNS} FROM queue_meta WHERE id = 0").fetchone()
        self._batch = _Batch(
            log_index=index,
            now_ms=max(now_ms, int(row[4])),
            next_message_id=int(row[0]),
            next_token=int(row[1]),
            next_event_seq=int(row[2]),
            rr_offset=int(row[3]),
            events=[],
            keys={},
            bodies=[],
            moved={},
        )

    def end_batch(self, conn: sqlite3.Connection) -> None:
        batch = self._batch
        assert batch is not None
        if batch.keys:
            conn.executemany(
                "INSERT INTO idempotency (key, message_id) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET message_id = excluded.message_id",
                list(batch.keys.items()),
            )
        batch.flush_writes(conn)
        if batch.events:
            conn.executemany(_EVENT_INSERT, batch.events)
        changed = [(kind, phase, delta) for (kind, phase), delta in sorted(batch.moved.items()) if delta]
        if changed:
            conn.executemany(
                "INSERT INTO phase_counts (kind, phase, count) VALUES (?, ?, ?)"
                " ON CONFLICT(kind, phase) DO UPDATE SET count = count + excluded.count",
                changed,
            )
        conn.execute(
            "UPDATE queue_meta SET next_message_id = ?, next_token = ?, next_event_seq = ?, rr_offset = ?,"
            " clock_ms = ? WHERE id = 0",
            (batch.next_message_id, batch.next_token, batch.next_event_seq, batch.rr_offset, batch.now_ms),
        )

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        cached = self._decoded.get(id(data))
        decoded = cached[1] if cached is not None and cached[0] is data else codec.decode_command(data)
        self._last_lease = None
        if isinstance(decoded, ErrorResult):
            return codec.encode_result(decoded)
        if self._batch is None:  # the per-entry state exists only inside apply_batch
            raise RuntimeError("QueueMachine.apply_command runs only inside apply_batch")
        result = _Apply(conn, self._batch, self.config, self).run(decoded)
        self._last_lease = result if isinstance(result, LeaseResult) else None
        return codec.encode_result(result)

    def session_record(self, data: bytes, result: bytes) -> bytes:
        """A lease result is kept as its (message id, token) pairs, not its payloads.

        A retried Lease must not grant twice; what it needs back is which grants are still its
        own. Keeping up to 8 MiB of payloads per lease in the session table, on every replica,
        cost more than the lease itself."""
        lease, self._last_lease = self._last_lease, None
        if lease is not None:
            return _LEASE_SESSION + _lease_session_encoder.encode(
                _LeaseSession(expired=lease.expired, grants=tuple((g.message_id, g.token) for g in lease.grants))
            )
        return result

    def session_replay(self, conn: sqlite3.Connection, now_ms: int, stored: bytes) -> bytes:
        if not stored.startswith(_LEASE_SESSION):
            return stored
        session = _lease_session_decoder.decode(stored[len(_LEASE_SESSION) :])
        assert self._batch is not None
        self._batch.flush_writes(conn)
        grants = [
            grant
            for message_id, token in session.grants
            if (grant := _regrant(conn, message_id, token, self._batch.now_ms)) is not None
        ]
        return codec.encode_result(LeaseResult(code=Code.OK, grants=tuple(grants), expired=session.expired))

    def restore_snapshot(self, path: Path, index: int) -> None:
        self._forget_caches()
        super().restore_snapshot(path, index)

    def restore_bytes(self, image: bytes, index: int) -> None:
        self._forget_caches()
        super().restore_bytes(image, index)

    # ---- caches of the small, rarely changed tables -------------------------------------------
    def _forget_caches(self) -> None:
        self.forget_kinds()
        self.forget_pauses()
        self.forget_retention()

    def forget_kinds(self) -> None:
        self._kinds = None

    def forget_retention(self) -> None:
        self._retention = None

    def forget_pauses(self) -> None:
        self._paused = None

    def entry_keys(self, conn: sqlite3.Connection) -> dict[str, Any]:
        """(id, content_hash, phase, due_ms, purge_ms, request_id) of the message holding each
        idempotency key of this entry's enqueues, as the table holds them: 500 keys per query."""
        keys = sorted({d.idempotency_key for _, d in self._decoded.values() if isinstance(d, Enqueue)})
        found: dict[str, Any] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                "SELECT i.key, m.id, m.content_hash, m.phase, m.due_ms, m.purge_ms, m.request_id FROM idempotency i"
                f" JOIN messages m ON m.id = i.message_id WHERE i.key IN ({marks})",
                chunk,
            ):
                found[row[0]] = row[1:]
        return found

    def kinds(self, conn: sqlite3.Connection) -> dict[str, RetryPolicy]:
        """Registered kinds and their policies, read once and kept until a SetPolicy or rollback."""
        if self._kinds is None:
            self._kinds = {
                kind: _policy_decoder.decode(blob)
                for kind, blob in conn.execute("SELECT kind, policy FROM kinds ORDER BY kind")
            }
        return self._kinds

    def retention(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """(tombstone retention, event retention) in force: SetRetention's values, else the config's."""
        if self._retention is None:
            config = self.config
            self._retention = retention_in_force(
                conn, retention_ms=config.retention_ms, event_retention_ms=config.event_retention_ms
            )
        return self._retention

    def paused(self, conn: sqlite3.Connection) -> frozenset[str]:
        if self._paused is None:
            self._paused = frozenset(row[0] for row in conn.execute("SELECT DISTINCT kind FROM kind_pauses"))
        return self._paused


_LEASE_SESSION: Final = b"\x00lease-session"


class _LeaseSession(msgspec.Struct, frozen=True, array_like=True):
    expired: int
    grants: tuple[tuple[int, int], ...]


_lease_session_encoder: Final = msgspec.msgpack.Encoder()
_lease_session_decoder: Final = msgspec.msgpack.Decoder(_LeaseSession)

_GRANT_COLUMNS: Final = (
    "id, kind, idempotency_key, ref_key,"
    " coalesce(edited_payload, (SELECT payload FROM bodies WHERE bodies.id = messages.id)), headers, attempts, due_ms,"
    " iif(edited_payload IS NULL, content_hash, edited_hash), last_error_class, in_doubt_until_ms, budget_attempts"
)
"""The hash is the one stored with the payload granted (at enqueue, or at an edited redrive), read
from another row than the payload, so a client can tell a payload corrupted at rest (see Grant)."""

_QUIET_GRANT_COLUMNS: Final = (
    "id, kind, NULL, NULL,"
    " coalesce(length(edited_payload), (SELECT length(payload) FROM bodies WHERE bodies.id = messages.id)),"
    " NULL, attempts, due_ms, NULL, NULL, NULL, NULL"
)


def _regrant(conn: sqlite3.Connection, message_id: int, token: int, now_ms: int) -> Grant | None:
    """The grant of `token` if it is still the message's live lease, for a retried Lease."""
    row = conn.execute(
        f"SELECT {_GRANT_COLUMNS}, phase, token, lease_deadline_ms FROM messages WHERE id = ?", (message_id,)
    ).fetchone()
    if row is None or row[12] != Phase.LEASED or row[13] != token or row[14] <= now_ms:
        return None
    return _grant_of(row, token=token, attempt=int(row[6]), deadline_ms=int(row[14]), now_ms=now_ms)


def _grant_of(row: Any, *, token: int, attempt: int, deadline_ms: int, now_ms: int) -> Grant:
    """A Grant from a row of `_GRANT_COLUMNS` (sqlite3 rows are untyped tuples)."""
    return Grant(
        message_id=int(row[0]),
        token=token,
        kind=row[1],
        idempotency_key=row[2],
        ref_key=row[3],
        payload=row[4],
        headers=codec.decode_headers(row[5]),
        attempt=attempt,
        due_ms=int(row[7]),
        deadline_ms=deadline_ms,
        payload_hash=row[8] or b"",
        previous_error_class=row[9],
        in_doubt_ms=None if row[10] is None else int(row[10]) - now_ms,
        budget_attempt=attempt - int(row[11]),
    )


class _Apply:
    """One command's application inside the batch transaction."""

    def __init__(self, conn: sqlite3.Connection, batch: _Batch, config: QueueConfig, machine: QueueMachine) -> None:
        self.conn = conn
        self.batch = batch
        self.now_ms = batch.now_ms
        self.config = config
        self.machine = machine

    def run(self, command: QueueCommand) -> QueueResult:
        if isinstance(command, Enqueue):
            return self.enqueue(command)
        # Anything else may read or change message rows: write the buffered ones first, and stop
        # trusting the keys read before the entry (this command may discard or purge their holders).
        self.batch.flush_writes(self.conn)
        self.batch.known_stale = True
        match command:
            case Lease():
                return self.lease(command)
            case ExtendLease():
                return self.extend(command)
            case Ack():
                return self.ack(command)
            case AckMany():
                return self.ack_many(command)
            case Fail():
                return self.fail(command)
            case Release():
                return self.release(command)
            case ExpireLeases():
                return BatchResult(code=Code.OK, ids=tuple(self.expire_due(command.limit)))
            case Redrive():
                return self.redrive(command)
            case Discard():
                return self.discard(command)
            case PauseKind():
                return self.pause(command)
            case ResumeKind():
                return self.resume(command)
            case SetPolicy():
                return self.set_policy(command)
            case Purge():
                return purging.purge(self, command)
            case SetRetention():
                return self.set_retention(command)
            case PutToken():
                return access.put_token(self.conn, self.now_ms, command, self.emit_audited)
            case RevokeToken():
                return access.revoke_token(self.conn, self.now_ms, command, self.emit_audited)
            case SetQuota():
                return access.set_quota(self.conn, command, self.emit_audited)
            case PutDocument():
                return documents.put(self.conn, self.now_ms, command, self.emit_audited)
            case EditRedrive():
                return review.Review(self).edit_redrive(command)
            case Propose():
                return review.Review(self).propose(command)
            case Approve():
                return review.Review(self).approve(command)
            case Reject():
                return review.Review(self).reject(command)
            case RedriveJob():
                return review.Review(self).start_job(command)
            case StepJob():
                return jobs.step(self, command)
            case ControlJob():
                return jobs.control(self, command)

    # ---- shared helpers ---------------------------------------------------------------------
    def emit(self, type_: EventType, message_id: int, kind: str, data: dict[str, EventValue]) -> None:
        batch = self.batch
        batch.events.append(
            (
                batch.next_event_seq,
                batch.log_index,
                self.now_ms,
                type_._value_,  # the plain attribute: `.value` is a descriptor call per event
                message_id,
                kind,
                codec.encode_event_data(data),
            )
        )
        batch.next_event_seq += 1

    def emit_audited(self, type_: EventType, message_id: int, kind: str, data: dict[str, EventValue]) -> None:
        """Emit an operator's event and write its audit entry, derived from the same data, in the
        same apply: every operator command goes through here, so none can act without a record."""
        self.emit(type_, message_id, kind, data)
        entry = review.audit_of_event(type_, message_id, kind, data)
        audit_chain.append(
            self.conn, log_index=self.batch.log_index, ts_ms=self.now_ms, actor=entry.actor, action=entry.action,
            target=entry.target, reason=entry.reason, before=entry.before, after=entry.after,
            message_ids=(message_id,) if message_id else (),
        )  # fmt: skip

    def audit(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        reason: str,
        before: dict[str, EventValue],
        after: dict[str, EventValue],
        message_ids: Sequence[int] = (),
    ) -> int:
        """Write an audit entry for an action that is not one event (an edit, a proposal's decision)."""
        return audit_chain.append(
            self.conn, log_index=self.batch.log_index, ts_ms=self.now_ms, actor=actor, action=action, target=target,
            reason=reason, before=before, after=after, message_ids=message_ids,
        )  # fmt: skip

    def load(self, message_id: int) -> _Row | None:
        row = self.conn.execute(f"SELECT {_ROW_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        return None if row is None else _row_of(row)

    def load_many(self, message_ids: Sequence[int]) -> dict[int, _Row]:
        """Rows of the given messages (those that exist), 500 ids per query."""
        ids = list(dict.fromkeys(message_ids))
        found: dict[int, _Row] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self.conn.execute(f"SELECT {_ROW_COLUMNS} FROM messages WHERE id IN ({marks})", chunk):
                found[int(row[0])] = _row_of(row)
        return found

    def load_current(self, message_id: int) -> _Row | None:
        """The message, with its lease expired first if the deadline passed."""
        row = self.load(message_id)
        if (
            row is not None
            and row.phase is Phase.LEASED
            and row.lease_deadline_ms is not None
            and row.lease_deadline_ms <= self.now_ms
        ):
            self.expire_one(row)
            row = self.load(message_id)
        return row

    def policy(self, kind: str) -> RetryPolicy:
        policy = self.machine.kinds(self.conn).get(kind)
        assert policy is not None, f"message of unregistered kind {kind}"
        return policy

    def kind_known(self, kind: str) -> bool:
        return kind in self.machine.kinds(self.conn)

    def holders(self, kind: str) -> tuple[str, ...]:
        rows = self.conn.execute(
            "SELECT holder FROM kind_pauses WHERE kind = ? ORDER BY holder", (kind,)
        ).fetchall()
        return tuple(row[0] for row in rows)

    # ---- enqueue ----------------------------------------------------------------------------
    def lookup_key(self, key: str) -> Any:
        """(id, content_hash, phase, due_ms, purge_ms, request_id) of the message holding `key`."""
        batch = self.batch
        fresh = batch.fresh.get(key)
        if fresh is not None:
            return fresh
        claimed = batch.keys.get(key)
        if claimed is not None:
            return self.conn.execute(
                "SELECT id, content_hash, phase, due_ms, purge_ms, request_id FROM messages WHERE id = ?", (claimed,)
            ).fetchone()
        if not batch.known_stale:
            if batch.known is None:
                batch.known = self.machine.entry_keys(self.conn)
            return batch.known.get(key)
        return self.conn.execute(
            "SELECT m.id, m.content_hash, m.phase, m.due_ms, m.purge_ms, m.request_id FROM idempotency i"
            " JOIN messages m ON m.id = i.message_id WHERE i.key = ?",
            (key,),
        ).fetchone()

    def enqueue(self, command: Enqueue) -> QueueResult:
        if not self.kind_known(command.kind):
            return EnqueueResult(code=Code.UNKNOWN_KIND)
        now_ms = self.now_ms
        due_ms = command.due_ms if command.due_ms is not None else now_ms + command.delay_ms
        if due_ms > now_ms + DELAY_MAX_MS:
            return ErrorResult(code=Code.INVALID, detail="due time beyond DELAY_MAX_MS")
        digest = content_hash(command.kind, command.ref_key, command.payload)
        existing = self.lookup_key(command.idempotency_key)
        if existing is not None and (existing[4] is None or existing[4] > now_ms):
            if existing[1] != digest:
                code = Code.CONFLICT
            elif command.request_id and existing[5] == command.request_id:
                code = Code.OK  # the same request retried by its client: answered as the first time
            else:
                code = Code.EXISTS
            state = state_of(Phase(existing[2]), existing[3], now_ms)
            return EnqueueResult(code=code, message_id=int(existing[0]), state=state, due_ms=int(existing[3]))
        batch = self.batch
        message_id = batch.next_message_id
        batch.next_message_id += 1
        request_id = command.request_id or None
        batch.new_rows.append(
            (
                message_id,
                command.kind,
                command.idempotency_key,
                command.ref_key,
                digest,
                codec.encode_headers(command.headers),
                now_ms,
                _WAITING,
                due_ms,
                now_ms,
                request_id,
            )
        )
        batch.fresh[command.idempotency_key] = (message_id, digest, _WAITING, due_ms, None, request_id)
        batch.keys[command.idempotency_key] = message_id
        batch.move(command.kind, None, Phase.WAITING)
        batch.bodies.append((message_id, command.payload))
        self.emit(
            EventType.ENQUEUED,
            message_id,
            command.kind,
            {"idempotency_key": command.idempotency_key, "ref_key": command.ref_key, "due_ms": due_ms},
        )
        return EnqueueResult(
            code=Code.OK, message_id=message_id, state=state_of(Phase.WAITING, due_ms, now_ms), due_ms=due_ms
        )

    # ---- lease ------------------------------------------------------------------------------
    def eligible_kinds(self, requested: tuple[str, ...], probe: str | None = None) -> list[str]:
        """Registered kinds (of those requested), sorted by name, that are unpaused, or paused by the
        probing holder alone."""
        paused = self.machine.paused(self.conn)
        wanted = set(requested)
        return [
            kind
            for kind in self.machine.kinds(self.conn)
            if (not requested or kind in wanted)
            and (kind not in paused or (probe is not None and self.holders(kind) == (probe,)))
        ]

    def pick_fair(self, kinds: list[str], count_max: int) -> list[int]:
        """Round-robin over kinds (rotating start), oldest due first within a kind: O(kinds + count)."""
        start = self.batch.rr_offset % len(kinds)
        self.batch.rr_offset += 1
        order = kinds[start:] + kinds[:start]
        cursors = [
            due_index.due_cursor(self.conn, TABLE, kind=kind, now_ms=self.now_ms, limit=count_max)
            for kind in order
        ]
        picks: list[int] = []
        while cursors and len(picks) < count_max:
            still_open: list[sqlite3.Cursor] = []
            for cursor in cursors:
                if len(picks) == count_max:
                    break
                found = cursor.fetchone()
                if found is not None:
                    picks.append(int(found[0]))
                    still_open.append(cursor)
            cursors = still_open
        return picks

    def lease(self, command: Lease) -> QueueResult:
        expired = self.expire_due(self.config.expire_per_lease_max)
        kinds = self.eligible_kinds(command.kinds, command.probe)
        if not kinds:
            return LeaseResult(code=Code.OK, expired=len(expired))
        grants: list[Grant] = []
        updates: list[tuple[int, int, str, int, int]] = []
        attempts: list[tuple[int, int, int, str, int]] = []
        result_bytes = 0
        now_ms, worker_id, batch = self.now_ms, command.worker_id, self.batch
        deadline_ms = now_ms + command.lease_ms
        respond = self.machine.responding
        leased: dict[str, int] = {}  # kind -> grants, counted into the batch once
        for row in self.grant_rows(self.pick_fair(kinds, command.count_max), respond=respond):
            size = len(row[4]) if respond else int(row[4])
            if grants and result_bytes + size > LEASE_RESULT_BYTES_MAX:
                break
            message_id, kind, due_ms = int(row[0]), row[1], int(row[7])
            token = batch.next_token
            batch.next_token += 1
            attempt = int(row[6]) + 1
            updates.append((attempt, token, worker_id, deadline_ms, message_id))
            attempts.append((message_id, attempt, token, worker_id, now_ms))
            if respond:
                grant = _grant_of(row, token=token, attempt=attempt, deadline_ms=deadline_ms, now_ms=now_ms)
            else:  # what the state and the session record need, without the payload
                grant = Grant(message_id=message_id, token=token, kind=kind, idempotency_key="", ref_key="",
                              payload=b"", headers={}, attempt=attempt, due_ms=due_ms, deadline_ms=deadline_ms)
            leased[kind] = leased.get(kind, 0) + 1
            self.emit(
                EventType.LEASED,
                message_id,
                kind,
                {
                    "token": token,
                    "attempt": attempt,
                    "worker_id": worker_id,
                    "deadline_ms": deadline_ms,
                    "lateness_ms": now_ms - due_ms,
                },
            )
            grants.append(grant)
            result_bytes += size
        for kind, count in leased.items():
            batch.move(kind, Phase.WAITING, Phase.LEASED, count)
        self.conn.executemany(
            f"UPDATE messages SET phase = {Phase.LEASED.value}, attempts = ?, token = ?, token_open = 1,"
            " lease_worker = ?, lease_deadline_ms = ? WHERE id = ?",
            updates,
        )
        self.conn.executemany(
            "INSERT INTO attempts (message_id, attempt, token, worker_id, leased_ms) VALUES (?,?,?,?,?)", attempts
        )
        return LeaseResult(code=Code.OK, grants=tuple(grants), expired=len(expired))

    def grant_rows(self, picks: list[int], *, respond: bool = True) -> Iterator[Any]:
        """Rows of `_GRANT_COLUMNS` for the picks, in pick order, read 64 at a time.

        Chunks keep the read set-based without pulling up to 1000 payloads of 256 KiB when the
        8 MiB result budget stops the lease after a few dozen. Without `respond`, the rows carry
        the payload's length in its place: a follower needs it for that budget, not the bytes."""
        columns = _GRANT_COLUMNS if respond else _QUIET_GRANT_COLUMNS
        for start in range(0, len(picks), 64):
            chunk = picks[start : start + 64]
            marks = ",".join("?" * len(chunk))
            found = {
                int(row[0]): row
                for row in self.conn.execute(f"SELECT {columns} FROM messages WHERE id IN ({marks})", chunk)
            }
            for message_id in chunk:
                yield found[message_id]

    # ---- expiry and failure -----------------------------------------------------------------
    def expire_due(self, limit: int) -> list[int]:
        ids = due_index.expired_lease_ids(self.conn, TABLE, now_ms=self.now_ms, limit=limit)
        for message_id in ids:
            row = self.load(message_id)
            assert row is not None
            self.expire_one(row)
        return ids

    def expire_one(self, row: _Row) -> None:
        assert row.phase is Phase.LEASED
        self.fail_attempt(row, error_class=ERROR_CLASS_LEASE_EXPIRED, error_text="lease deadline passed",
                          permanent=False, not_before_ms=None, expired=True, in_doubt_ms=None)  # fmt: skip

    def fail_attempt(
        self,
        row: _Row,
        *,
        error_class: str,
        error_text: str,
        permanent: bool,
        not_before_ms: int | None,
        expired: bool,
        in_doubt_ms: int | None,
    ) -> Outcome:
        """Run the retry policy for the attempt that just failed (or expired) and record it, with
        its in-doubt deadline (queues/in_doubt.py; a reported one also holds the retry back)."""
        allowed = transition(State.LEASED, Action.EXPIRE if expired else Action.FAIL)
        assert not isinstance(allowed, Code)
        attempt = row.attempts - row.budget_attempts
        decision = decide(
            self.policy(row.kind),
            message_id=row.id,
            attempt=attempt,
            budget_start_ms=row.budget_start_ms,
            now_ms=self.now_ms,
            error_class=error_class,
            permanent=permanent,
            not_before_ms=not_before_ms,
        )
        self.conn.execute(
            "UPDATE attempts SET ended_ms = ?, outcome = ?, error_class = ?, error_text = ?"
            " WHERE message_id = ? AND attempt = ?",
            (self.now_ms, "expired" if expired else "failed", error_class, error_text, row.id, row.attempts),
        )
        data: dict[str, EventValue] = {
            "token": row.token,
            "attempt": row.attempts,
            "error_class": error_class,
            "permanent": permanent,
        }
        # An expired token stays open for a late ack; an explicit fail consumes it.
        token_open = 1 if expired else 0
        in_doubt_until = in_doubt.until(lease_deadline_ms=row.lease_deadline_ms, now_ms=self.now_ms,
                                        in_doubt_ms=in_doubt_ms)
        if isinstance(decision, DeadLetter):
            self.batch.move(row.kind, row.phase, Phase.DEAD)
            self.conn.execute(
                "UPDATE messages SET phase = ?, token_open = ?, lease_worker = NULL,"
                " lease_deadline_ms = NULL, last_error_class = ?, last_error_text = ?, dead_ms = ?,"
                f" dead_reason = ?, dead_error_class = ?, {in_doubt.SET} WHERE id = ?",
                (
                    Phase.DEAD,
                    token_open,
                    error_class,
                    error_text,
                    self.now_ms,
                    decision.reason.value,
                    error_class,
                    *in_doubt.params(in_doubt_until),
                    row.id,
                ),
            )
            self.emit(
                EventType.LEASE_EXPIRED if expired else EventType.ATTEMPT_FAILED, row.id, row.kind, data
            )
            self.emit(
                EventType.DEAD_LETTERED,
                row.id,
                row.kind,
                {"reason": decision.reason.value, "attempt": row.attempts},
            )
            assert State.DEAD in allowed
            return Outcome(code=Code.OK, message_id=row.id, state=State.DEAD)
        self.batch.move(row.kind, row.phase, Phase.WAITING)
        due_ms = decision.due_ms if in_doubt_ms is None or in_doubt_until is None else max(decision.due_ms, in_doubt_until)
        self.conn.execute(
            "UPDATE messages SET phase = ?, due_ms = ?, token_open = ?, lease_worker = NULL,"
            f" lease_deadline_ms = NULL, last_error_class = ?, last_error_text = ?, {in_doubt.SET} WHERE id = ?",
            (Phase.WAITING, due_ms, token_open, error_class, error_text, *in_doubt.params(in_doubt_until), row.id),
        )
        data["due_ms"] = due_ms
        self.emit(EventType.LEASE_EXPIRED if expired else EventType.ATTEMPT_FAILED, row.id, row.kind, data)
        state = state_of(Phase.WAITING, due_ms, self.now_ms)
        assert state in allowed
        return Outcome(code=Code.OK, message_id=row.id, state=state, due_ms=due_ms)


    # ---- per-message commands from workers --------------------------------------------------
    def check_token(self, row: _Row | None, token: int, action: Action) -> Outcome | None:
        """Refusal precedence: not found, done under another lease, expired lease, illegal state,
        stale token."""
        if row is None:
            return Outcome(code=Code.NOT_FOUND)
        if row.phase is Phase.LEASED and row.token_open and token == row.token:
            # The common case, a live lease used by its holder (callers expire a lease past its
            # deadline first); the lifecycle allows every worker action from LEASED.
            return None
        state = row.state(self.now_ms)
        if row.phase is Phase.DONE and token < row.token:
            return Outcome(code=Code.DONE_ELSEWHERE, message_id=row.id, state=state)
        if (
            action is not Action.ACK
            and row.phase is not Phase.LEASED
            and token == row.token
            and row.token_open
        ):
            return Outcome(code=Code.LEASE_EXPIRED, message_id=row.id, state=state)
        if isinstance(transition(state, action), Code):
            return Outcome(code=Code.ILLEGAL_STATE, message_id=row.id, state=state)
        if token != row.token or not row.token_open:
            return Outcome(code=Code.STALE_TOKEN, message_id=row.id, state=state)
        return None

    def extend(self, command: ExtendLease) -> QueueResult:
        row = self.load_current(command.message_id)
        refusal = self.check_token(row, command.token, Action.EXTEND)
        if refusal is not None:
            return refusal
        assert row is not None
        deadline_ms = self.now_ms + command.lease_ms
        self.conn.execute("UPDATE messages SET lease_deadline_ms = ? WHERE id = ?", (deadline_ms, row.id))
        self.emit(
            EventType.LEASE_EXTENDED, row.id, row.kind, {"token": row.token, "deadline_ms": deadline_ms}
        )
        return Outcome(code=Code.OK, message_id=row.id, state=State.LEASED, deadline_ms=deadline_ms)

    def ack(self, command: Ack) -> QueueResult:
        acks = _AckWrites()
        outcome = self.ack_row(self.load_current(command.message_id), command, acks)
        acks.flush(self.conn)
        return outcome

    def ack_many(self, command: AckMany) -> QueueResult:
        rows = self.load_many([ack.message_id for ack in command.acks])
        acks = _AckWrites()
        outcomes: list[Outcome] = []
        acked: set[int] = set()  # accepted in this command: a repeat must find the message done
        for ack in command.acks:
            row = rows.get(ack.message_id)
            if row is not None and row.id in acked:
                row = dataclasses.replace(row, phase=Phase.DONE, token_open=False)
            deadline = row.lease_deadline_ms if row is not None and row.phase is Phase.LEASED else None
            if row is not None and deadline is not None and deadline <= self.now_ms:
                row = self.load_current(row.id)  # lazily expired, as for a lone ack
            outcome = self.ack_row(row, ack, acks)
            if outcome.code is Code.OK:
                acked.add(ack.message_id)
            outcomes.append(outcome)
        acks.flush(self.conn)
        return Outcomes(code=Code.OK, outcomes=tuple(outcomes))

    def ack_row(self, row: _Row | None, command: Ack, acks: _AckWrites) -> Outcome:
        """Judge one ack against its message's current row; the writes go to `acks`."""
        if row is not None and row.phase is Phase.DONE and command.token == row.token:
            return Outcome(code=Code.ALREADY_ACKED, message_id=row.id, state=State.DONE)
        refusal = self.check_token(row, command.token, Action.ACK)
        if refusal is not None:
            return refusal
        assert row is not None
        late = row.phase is not Phase.LEASED
        self.batch.move(row.kind, row.phase, Phase.DONE)
        acks.messages.append((self.now_ms, self.now_ms + self.machine.retention(self.conn)[0], row.id))
        acks.attempts.append((self.now_ms, "succeeded_late" if late else "succeeded", row.id, row.attempts))
        self.emit(
            EventType.SUCCEEDED,
            row.id,
            row.kind,
            {"token": row.token, "attempt": row.attempts, "summary": command.summary, "late": late},
        )
        return Outcome(code=Code.OK, message_id=row.id, state=State.DONE)

    def fail(self, command: Fail) -> QueueResult:
        row = self.load_current(command.message_id)
        refusal = self.check_token(row, command.token, Action.FAIL)
        if refusal is not None:
            return refusal
        assert row is not None
        not_before_ms = command.not_before_ms
        if command.retry_after_ms is not None:  # a duration from now, on the log's clock
            not_before_ms = max(not_before_ms or 0, self.now_ms + command.retry_after_ms)
        return self.fail_attempt(row, error_class=command.error_class, error_text=command.error_text,
                                 permanent=command.permanent, not_before_ms=not_before_ms, expired=False,
                                 in_doubt_ms=command.in_doubt_ms)  # fmt: skip

    # ---- operator commands ------------------------------------------------------------------
    def release(self, command: Release) -> QueueResult:
        row = self.load_current(command.message_id)
        refusal = self.check_token(row, command.token, Action.RELEASE)
        if refusal is not None:
            return refusal
        assert row is not None
        self.batch.move(row.kind, row.phase, Phase.WAITING)
        due_ms, in_doubt_until = self.now_ms, None
        if command.interrupted:  # it may have sent: in doubt as a failed attempt is
            in_doubt_until = in_doubt.until(lease_deadline_ms=row.lease_deadline_ms, now_ms=self.now_ms,
                                            in_doubt_ms=command.in_doubt_ms)
            if command.in_doubt_ms is not None and in_doubt_until is not None:
                due_ms = max(due_ms, in_doubt_until)
        # budget_attempts + 1: the next delivery is judged by the policy as if this one never was.
        self.conn.execute(
            "UPDATE messages SET phase = ?, due_ms = ?, token_open = 0, lease_worker = NULL, lease_deadline_ms = NULL,"
            f" budget_attempts = budget_attempts + 1, last_error_class = iif(?, ?, last_error_class), {in_doubt.SET}"
            " WHERE id = ?",
            (Phase.WAITING, due_ms, command.interrupted, ERROR_CLASS_INTERRUPTED, *in_doubt.params(in_doubt_until), row.id),
        )
        outcome = "interrupted" if command.interrupted else "released"
        self.conn.execute(
            "UPDATE attempts SET ended_ms = ?, outcome = ? WHERE message_id = ? AND attempt = ?",
            (self.now_ms, outcome, row.id, row.attempts),
        )
        self.emit(
            EventType.RELEASED, row.id, row.kind,
            {"token": row.token, "attempt": row.attempts, "interrupted": command.interrupted},
        )  # fmt: skip
        return Outcome(code=Code.OK, message_id=row.id, state=state_of(Phase.WAITING, due_ms, self.now_ms), due_ms=due_ms)

    def redrive_targets(self, command: Redrive) -> list[int] | ErrorResult:
        if command.payload is not None and (len(command.ids) != 1 or command.filter is not None):
            return ErrorResult(code=Code.INVALID, detail="an edited payload needs exactly one id")
        if bool(command.ids) == (command.filter is not None):
            return ErrorResult(code=Code.INVALID, detail="give ids or a filter, not both or neither")
        if command.filter is None:
            return list(dict.fromkeys(command.ids))
        return dead_letter_ids(self.conn, command.filter, limit=command.limit)

    def edited_hash(self, row: _Row, payload: bytes | None) -> bytes | None:
        """The content hash of an edited payload, stored beside it as enqueue stores the original's."""
        if payload is None:
            return None
        (ref_key,) = self.conn.execute("SELECT ref_key FROM messages WHERE id = ?", (row.id,)).fetchone()
        return content_hash(row.kind, str(ref_key), payload)

    def redrive(self, command: Redrive, approval: dict[str, EventValue] | None = None) -> BatchResult | ErrorResult:
        """`approval`: the proposal and approver that released this redrive, recorded with it."""
        targets = self.redrive_targets(command)
        if isinstance(targets, ErrorResult):
            return targets
        done: list[int] = []
        refused: list[tuple[int, Code]] = []
        for message_id in targets:
            code = self.redrive_one(
                message_id, actor=command.actor, reason=command.reason, payload=command.payload, approval=approval
            )
            if code is None:
                done.append(message_id)
            else:
                refused.append((message_id, code))
        return BatchResult(code=Code.OK, ids=tuple(done), refused=tuple(refused))

    def redrive_one(
        self, message_id: int, *, actor: str, reason: str, payload: bytes | None = None,
        approval: dict[str, EventValue] | None = None, dead_only: bool = False,
    ) -> Code | None:  # fmt: skip
        """Redrive one message, audited, or say why not (None: done). Every redrive goes through
        here (a command's ids or filter, an approved proposal, a redrive job's item), so the rules
        and the record are the same for all; `dead_only` (a job) refuses a message that is not dead."""
        row = self.load_current(message_id)
        if row is None:
            return Code.NOT_FOUND
        state = row.state(self.now_ms)
        if isinstance(transition(state, Action.REDRIVE), Code) or (dead_only and state is not State.DEAD):
            return Code.ILLEGAL_STATE
        self.batch.move(row.kind, row.phase, Phase.WAITING)
        self.conn.execute(
            "UPDATE messages SET phase = ?, due_ms = ?, budget_attempts = attempts, budget_start_ms = ?,"
            " token_open = 0, dead_ms = NULL, dead_reason = NULL, dead_error_class = NULL,"
            " edited_payload = coalesce(?, edited_payload), edited_hash = coalesce(?, edited_hash) WHERE id = ?",
            (Phase.WAITING, self.now_ms, self.now_ms, payload, self.edited_hash(row, payload), message_id),
        )
        self.emit_audited(
            EventType.REDRIVEN, message_id, row.kind,
            {"actor": actor, "reason": reason, "from_state": state.value, "edited": payload is not None,
             **(approval or {})},
        )  # fmt: skip
        return None

    def discard(self, command: Discard, approval: dict[str, EventValue] | None = None) -> Outcome:
        row = self.load_current(command.message_id)
        if row is None:
            return Outcome(code=Code.NOT_FOUND)
        state = row.state(self.now_ms)
        if isinstance(transition(state, Action.DISCARD), Code):
            return Outcome(code=Code.ILLEGAL_STATE, message_id=row.id, state=state)
        self.batch.move(row.kind, row.phase, Phase.DISCARDED)
        self.conn.execute(
            "UPDATE messages SET phase = ?, token_open = 0, terminal_ms = ?, purge_ms = ?, dead_ms = NULL"
            " WHERE id = ?",
            (Phase.DISCARDED, self.now_ms, self.now_ms + self.machine.retention(self.conn)[0], row.id),
        )
        data: dict[str, EventValue] = {"actor": command.actor, "reason": command.reason, "from_state": state.value}
        if command.reason_code:
            data["reason_code"] = command.reason_code
        self.emit_audited(EventType.DISCARDED, row.id, row.kind, {**data, **(approval or {})})
        return Outcome(code=Code.OK, message_id=row.id, state=State.DISCARDED)

    def pause(self, command: PauseKind) -> QueueResult:
        if not self.kind_known(command.kind):
            return KindResult(code=Code.UNKNOWN_KIND, kind=command.kind)
        holders = self.holders(command.kind)
        if command.holder in holders:
            return KindResult(code=Code.ALREADY_PAUSED, kind=command.kind, holders=holders)
        if len(holders) >= PAUSE_HOLDERS_MAX:
            return KindResult(code=Code.INVALID, kind=command.kind, holders=holders)
        self.conn.execute(
            "INSERT INTO kind_pauses (kind, holder, reason, since_ms) VALUES (?,?,?,?)",
            (command.kind, command.holder, command.reason, self.now_ms),
        )
        self.machine.forget_pauses()
        self.emit_audited(
            EventType.PAUSED, 0, command.kind, {"holder": command.holder, "reason": command.reason, "actor": command.actor}
        )
        return KindResult(code=Code.OK, kind=command.kind, holders=self.holders(command.kind))

    def resume(self, command: ResumeKind) -> QueueResult:
        if not self.kind_known(command.kind):
            return KindResult(code=Code.UNKNOWN_KIND, kind=command.kind)
        holders = self.holders(command.kind)
        if command.holder not in holders:
            return KindResult(code=Code.NOT_PAUSED, kind=command.kind, holders=holders)
        self.conn.execute(
            "DELETE FROM kind_pauses WHERE kind = ? AND holder = ?", (command.kind, command.holder)
        )
        self.machine.forget_pauses()
        holders = self.holders(command.kind)
        self.emit_audited(
            EventType.RESUMED, 0, command.kind,
            {"holder": command.holder, "still_paused": bool(holders), "actor": command.actor},
        )
        return KindResult(code=Code.OK, kind=command.kind, holders=holders)

    def set_policy(self, command: SetPolicy) -> QueueResult:
        problems = command.policy.problems()
        if problems:
            return ErrorResult(code=Code.INVALID, detail="; ".join(problems)[:200])
        before = self.machine.kinds(self.conn).get(command.kind)
        if before is None:
            (count,) = self.conn.execute("SELECT count(*) FROM kinds").fetchone()
            if count >= KINDS_MAX:
                return ErrorResult(code=Code.INVALID, detail=f"more than {KINDS_MAX} kinds")
        self.conn.execute(
            "INSERT INTO kinds (kind, policy) VALUES (?, ?)"
            " ON CONFLICT(kind) DO UPDATE SET policy = excluded.policy",
            (command.kind, _policy_encoder.encode(command.policy)),
        )
        self.machine.forget_kinds()
        self.emit_audited(
            EventType.POLICY_SET, 0, command.kind,
            {"policy": msgspec.json.encode(command.policy).decode(), "actor": command.actor, "reason": command.reason,
             "policy_before": None if before is None else msgspec.json.encode(before).decode()},
        )  # fmt: skip
        return KindResult(
            code=Code.OK, kind=command.kind, holders=self.holders(command.kind), policy_before=before
        )

    def set_retention(self, command: SetRetention) -> QueueResult:
        floor = self.config.retention_floor_ms
        wanted = {"retention_ms": command.retention_ms, "event_retention_ms": command.event_retention_ms}
        given = {name: value for name, value in wanted.items() if value is not None}
        if not given:
            return ErrorResult(code=Code.INVALID, detail="set retention_ms, event_retention_ms or both")
        short = [name for name, value in given.items() if value < floor]
        if short:
            return ErrorResult(code=Code.INVALID, detail=f"{', '.join(short)} under the floor of {floor} ms")
        before = self.machine.retention(self.conn)
        self.conn.executemany(
            "INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            sorted(given.items()),
        )
        self.machine.forget_retention()
        after = (given.get("retention_ms", before[0]), given.get("event_retention_ms", before[1]))
        self.emit_audited(
            EventType.RETENTION_SET, 0, "",
            {"actor": command.actor, "reason": command.reason, "retention_ms": after[0],
             "event_retention_ms": after[1], "retention_ms_before": before[0], "event_retention_ms_before": before[1]},
        )  # fmt: skip
        return RetentionResult(code=Code.OK, retention_ms=after[0], event_retention_ms=after[1])
