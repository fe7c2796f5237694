"""The compensation queue as a replicated state machine over SQLite.

Owns: the queue's tables (messages with their payloads, idempotency keys, attempts history,
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
with LEASE_EXPIRED, and anything with a token older than the latest grant is STALE_TOKEN.

Must never: read a clock, use randomness, iterate unordered collections, or load all messages
into Python. Every scan goes through an index and has a named limit.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Final

import msgspec

from delay import index as due_index
from delay.policy import DAY_MS, DEFAULT_POLICY, DELAY_MAX_MS, DeadLetter, RetryPolicy, decide
from queues import codec
from queues.lifecycle import TERMINAL, Action, transition
from queues.model import (
    BUILTIN_KINDS,
    ERROR_CLASS_LEASE_EXPIRED,
    LEASE_RESULT_BYTES_MAX,
    Ack,
    BatchResult,
    Code,
    Discard,
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
    PauseKind,
    Phase,
    Purge,
    QueueCommand,
    QueueResult,
    Redrive,
    ResumeKind,
    SetPolicy,
    State,
    state_of,
)
from queues.queries import dead_letter_ids
from raft_store.sqlite_machine import SqliteStateMachine

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
    expire_per_lease_max: int = 1024
    default_policy: RetryPolicy = DEFAULT_POLICY
    """The policy of the built-in kinds until a SetPolicy replaces it."""

    def validate(self) -> None:
        if not 0 < self.retention_ms <= DELAY_MAX_MS:
            raise ValueError("retention_ms must be in (0, DELAY_MAX_MS]")
        if not 1 <= self.expire_per_lease_max <= due_index.SCAN_LIMIT_MAX:
            raise ValueError(f"expire_per_lease_max must be in [1, {due_index.SCAN_LIMIT_MAX}]")
        self.default_policy.validate()


_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL, idempotency_key TEXT NOT NULL,
        ref_key TEXT NOT NULL, payload BLOB NOT NULL, content_hash BLOB NOT NULL,
        edited_payload BLOB, headers BLOB NOT NULL, created_ms INTEGER NOT NULL,
        phase INTEGER NOT NULL, due_ms INTEGER NOT NULL, attempts INTEGER NOT NULL,
        budget_attempts INTEGER NOT NULL, budget_start_ms INTEGER NOT NULL,
        last_error_class TEXT, last_error_text TEXT, token INTEGER NOT NULL, token_open INTEGER NOT NULL,
        lease_worker TEXT, lease_deadline_ms INTEGER, dead_ms INTEGER, dead_reason TEXT,
        dead_error_class TEXT, terminal_ms INTEGER, purge_ms INTEGER)""",
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
    """CREATE TABLE IF NOT EXISTS kind_pauses (
        kind TEXT NOT NULL, holder TEXT NOT NULL, reason TEXT NOT NULL, since_ms INTEGER NOT NULL,
        PRIMARY KEY (kind, holder)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS queue_meta (
        id INTEGER PRIMARY KEY, next_message_id INTEGER NOT NULL, next_token INTEGER NOT NULL,
        next_event_seq INTEGER NOT NULL, rr_offset INTEGER NOT NULL)""",
    "INSERT OR IGNORE INTO queue_meta VALUES (0, 1, 1, 1, 0)",
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


def content_hash(kind: str, ref_key: str, payload: bytes) -> bytes:
    """What makes two enqueues with one idempotency key 'the same' (headers are trace context)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (kind.encode(), ref_key.encode()):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    digest.update(payload)
    return digest.digest()


class QueueMachine(SqliteStateMachine):
    """The queue state machine. Drive it only through `apply_batch` with encoded commands."""

    def __init__(self, path: str, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self.config.validate()
        super().__init__(path)

    @property
    def connection(self) -> sqlite3.Connection:
        """For read-only queries (queues/queries.py) between applies, on the applying thread."""
        return self._conn

    # ---- SqliteStateMachine hooks -----------------------------------------------------------
    def create_tables(self, conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        due_index.create_indexes(conn, TABLE)
        policy = _policy_encoder.encode(self.config.default_policy)
        for kind in BUILTIN_KINDS:
            conn.execute("INSERT OR IGNORE INTO kinds (kind, policy) VALUES (?, ?)", (kind, policy))

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        decoded = codec.decode_command(data)
        if isinstance(decoded, ErrorResult):
            return codec.encode_result(decoded)
        apply = _Apply(conn, now_ms, self.applied_index() + 1, self.config)
        return codec.encode_result(apply.run(decoded))


class _Apply:
    """One command's application inside the batch transaction."""

    def __init__(self, conn: sqlite3.Connection, now_ms: int, log_index: int, config: QueueConfig) -> None:
        self.conn = conn
        self.now_ms = now_ms
        self.log_index = log_index
        self.config = config

    def run(self, command: QueueCommand) -> QueueResult:
        match command:
            case Enqueue():
                return self.enqueue(command)
            case Lease():
                return self.lease(command)
            case ExtendLease():
                return self.extend(command)
            case Ack():
                return self.ack(command)
            case Fail():
                return self.fail(command)
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
                return self.purge(command)

    # ---- shared helpers ---------------------------------------------------------------------
    def _next(self, column: str) -> int:
        assert column in ("next_message_id", "next_token", "next_event_seq")
        row = self.conn.execute(
            f"UPDATE queue_meta SET {column} = {column} + 1 WHERE id = 0 RETURNING {column} - 1"
        ).fetchone()
        return int(row[0])

    def emit(self, type_: EventType, message_id: int, kind: str, data: dict[str, EventValue]) -> None:
        self.conn.execute(
            "INSERT INTO events (seq, log_index, ts_ms, type, message_id, kind, data) VALUES (?,?,?,?,?,?,?)",
            (
                self._next("next_event_seq"),
                self.log_index,
                self.now_ms,
                type_.value,
                message_id,
                kind,
                codec.encode_event_data(data),
            ),
        )

    def load(self, message_id: int) -> _Row | None:
        row = self.conn.execute(f"SELECT {_ROW_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            return None
        return _Row(
            int(row[0]),
            row[1],
            Phase(row[2]),
            int(row[3]),
            int(row[4]),
            int(row[5]),
            int(row[6]),
            int(row[7]),
            bool(row[8]),
            row[9],
            row[10],
        )

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
        row = self.conn.execute("SELECT policy FROM kinds WHERE kind = ?", (kind,)).fetchone()
        assert row is not None, f"message of unregistered kind {kind}"
        return _policy_decoder.decode(row[0])

    def kind_known(self, kind: str) -> bool:
        return self.conn.execute("SELECT 1 FROM kinds WHERE kind = ?", (kind,)).fetchone() is not None

    def holders(self, kind: str) -> tuple[str, ...]:
        rows = self.conn.execute(
            "SELECT holder FROM kind_pauses WHERE kind = ? ORDER BY holder", (kind,)
        ).fetchall()
        return tuple(row[0] for row in rows)

    # ---- enqueue ----------------------------------------------------------------------------
    def enqueue(self, command: Enqueue) -> QueueResult:
        if not self.kind_known(command.kind):
            return EnqueueResult(code=Code.UNKNOWN_KIND)
        now_ms = self.now_ms
        due_ms = command.due_ms if command.due_ms is not None else now_ms + command.delay_ms
        if due_ms > now_ms + DELAY_MAX_MS:
            return ErrorResult(code=Code.INVALID, detail="due time beyond DELAY_MAX_MS")
        digest = content_hash(command.kind, command.ref_key, command.payload)
        existing = self.conn.execute(
            "SELECT m.id, m.content_hash, m.phase, m.due_ms, m.purge_ms FROM idempotency i"
            " JOIN messages m ON m.id = i.message_id WHERE i.key = ?",
            (command.idempotency_key,),
        ).fetchone()
        if existing is not None and (existing[4] is None or existing[4] > now_ms):
            code = Code.EXISTS if existing[1] == digest else Code.CONFLICT
            state = state_of(Phase(existing[2]), existing[3], now_ms)
            return EnqueueResult(code=code, message_id=int(existing[0]), state=state)
        message_id = self._next("next_message_id")
        self.conn.execute(
            "INSERT INTO messages (id, kind, idempotency_key, ref_key, payload, content_hash, headers,"
            " created_ms, phase, due_ms, attempts, budget_attempts, budget_start_ms, token, token_open)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,0,0,?,0,0)",
            (
                message_id,
                command.kind,
                command.idempotency_key,
                command.ref_key,
                command.payload,
                digest,
                codec.encode_headers(command.headers),
                now_ms,
                Phase.WAITING,
                due_ms,
                now_ms,
            ),
        )
        self.conn.execute(
            "INSERT INTO idempotency (key, message_id) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET message_id = excluded.message_id",
            (command.idempotency_key, message_id),
        )
        self.emit(
            EventType.ENQUEUED,
            message_id,
            command.kind,
            {"idempotency_key": command.idempotency_key, "ref_key": command.ref_key, "due_ms": due_ms},
        )
        return EnqueueResult(
            code=Code.OK, message_id=message_id, state=state_of(Phase.WAITING, due_ms, now_ms)
        )

    # ---- lease ------------------------------------------------------------------------------
    def eligible_kinds(self, requested: tuple[str, ...]) -> list[str]:
        """Registered, unpaused kinds (of those requested), sorted by name."""
        rows = self.conn.execute(
            "SELECT kind FROM kinds k WHERE NOT EXISTS (SELECT 1 FROM kind_pauses p WHERE p.kind = k.kind)"
            " ORDER BY kind"
        ).fetchall()
        wanted = set(requested)
        return [row[0] for row in rows if not requested or row[0] in wanted]

    def pick_fair(self, kinds: list[str], count_max: int) -> list[int]:
        """Round-robin over kinds (rotating start), oldest due first within a kind: O(kinds + count)."""
        row = self.conn.execute(
            "UPDATE queue_meta SET rr_offset = rr_offset + 1 WHERE id = 0 RETURNING rr_offset - 1"
        )
        start = int(row.fetchone()[0]) % len(kinds)
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
        kinds = self.eligible_kinds(command.kinds)
        if not kinds:
            return LeaseResult(code=Code.OK, expired=len(expired))
        grants: list[Grant] = []
        result_bytes = 0
        for message_id in self.pick_fair(kinds, command.count_max):
            grant = self.grant(
                message_id, command, budget_bytes=LEASE_RESULT_BYTES_MAX - result_bytes, first=not grants
            )
            if grant is None:
                break
            grants.append(grant)
            result_bytes += len(grant.payload)
        return LeaseResult(code=Code.OK, grants=tuple(grants), expired=len(expired))

    def grant(self, message_id: int, command: Lease, *, budget_bytes: int, first: bool) -> Grant | None:
        row = self.conn.execute(
            "SELECT kind, idempotency_key, ref_key, coalesce(edited_payload, payload), headers, attempts,"
            " due_ms FROM messages WHERE id = ?",
            (message_id,),
        ).fetchone()
        payload: bytes = row[3]
        if len(payload) > budget_bytes and not first:
            return None
        token = self._next("next_token")
        attempt = int(row[5]) + 1
        deadline_ms = self.now_ms + command.lease_ms
        self.conn.execute(
            "UPDATE messages SET phase = ?, attempts = ?, token = ?, token_open = 1, lease_worker = ?,"
            " lease_deadline_ms = ? WHERE id = ?",
            (Phase.LEASED, attempt, token, command.worker_id, deadline_ms, message_id),
        )
        self.conn.execute(
            "INSERT INTO attempts (message_id, attempt, token, worker_id, leased_ms) VALUES (?,?,?,?,?)",
            (message_id, attempt, token, command.worker_id, self.now_ms),
        )
        due_ms = int(row[6])
        self.emit(
            EventType.LEASED,
            message_id,
            row[0],
            {
                "token": token,
                "attempt": attempt,
                "worker_id": command.worker_id,
                "deadline_ms": deadline_ms,
                "lateness_ms": self.now_ms - due_ms,
            },
        )
        return Grant(
            message_id=message_id,
            token=token,
            kind=row[0],
            idempotency_key=row[1],
            ref_key=row[2],
            payload=payload,
            headers=codec.decode_headers(row[4]),
            attempt=attempt,
            due_ms=due_ms,
            deadline_ms=deadline_ms,
        )

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
        self.fail_attempt(
            row,
            error_class=ERROR_CLASS_LEASE_EXPIRED,
            error_text="lease deadline passed",
            permanent=False,
            not_before_ms=None,
            expired=True,
        )

    def fail_attempt(
        self,
        row: _Row,
        *,
        error_class: str,
        error_text: str,
        permanent: bool,
        not_before_ms: int | None,
        expired: bool,
    ) -> Outcome:
        """Run the retry policy for the attempt that just failed (or expired) and record it."""
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
        if isinstance(decision, DeadLetter):
            self.conn.execute(
                "UPDATE messages SET phase = ?, token_open = ?, lease_worker = NULL,"
                " lease_deadline_ms = NULL, last_error_class = ?, last_error_text = ?, dead_ms = ?,"
                " dead_reason = ?, dead_error_class = ? WHERE id = ?",
                (
                    Phase.DEAD,
                    token_open,
                    error_class,
                    error_text,
                    self.now_ms,
                    decision.reason.value,
                    error_class,
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
        self.conn.execute(
            "UPDATE messages SET phase = ?, due_ms = ?, token_open = ?, lease_worker = NULL,"
            " lease_deadline_ms = NULL, last_error_class = ?, last_error_text = ? WHERE id = ?",
            (Phase.WAITING, decision.due_ms, token_open, error_class, error_text, row.id),
        )
        data["due_ms"] = decision.due_ms
        self.emit(EventType.LEASE_EXPIRED if expired else EventType.ATTEMPT_FAILED, row.id, row.kind, data)
        state = state_of(Phase.WAITING, decision.due_ms, self.now_ms)
        assert state in allowed
        return Outcome(code=Code.OK, message_id=row.id, state=state, due_ms=decision.due_ms)

    # ---- per-message commands from workers --------------------------------------------------
    def check_token(self, row: _Row | None, token: int, action: Action) -> Outcome | None:
        """Refusal precedence: not found, expired lease, illegal state, stale token."""
        if row is None:
            return Outcome(code=Code.NOT_FOUND)
        state = row.state(self.now_ms)
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
        row = self.load_current(command.message_id)
        if row is not None and row.phase is Phase.DONE and command.token == row.token:
            return Outcome(code=Code.ALREADY_ACKED, message_id=row.id, state=State.DONE)
        refusal = self.check_token(row, command.token, Action.ACK)
        if refusal is not None:
            return refusal
        assert row is not None
        late = row.phase is not Phase.LEASED
        self.conn.execute(
            "UPDATE messages SET phase = ?, token_open = 0, lease_worker = NULL, lease_deadline_ms = NULL,"
            " terminal_ms = ?, purge_ms = ?, dead_ms = NULL WHERE id = ?",
            (Phase.DONE, self.now_ms, self.now_ms + self.config.retention_ms, row.id),
        )
        self.conn.execute(
            "UPDATE attempts SET ended_ms = ?, outcome = ? WHERE message_id = ? AND attempt = ?",
            (self.now_ms, "succeeded_late" if late else "succeeded", row.id, row.attempts),
        )
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
        return self.fail_attempt(
            row,
            error_class=command.error_class,
            error_text=command.error_text,
            permanent=command.permanent,
            not_before_ms=command.not_before_ms,
            expired=False,
        )

    # ---- operator commands ------------------------------------------------------------------
    def redrive_targets(self, command: Redrive) -> list[int] | ErrorResult:
        if command.payload is not None and (len(command.ids) != 1 or command.filter is not None):
            return ErrorResult(code=Code.INVALID, detail="an edited payload needs exactly one id")
        if bool(command.ids) == (command.filter is not None):
            return ErrorResult(code=Code.INVALID, detail="give ids or a filter, not both or neither")
        if command.filter is None:
            return list(dict.fromkeys(command.ids))
        return dead_letter_ids(self.conn, command.filter, limit=command.limit)

    def redrive(self, command: Redrive) -> QueueResult:
        targets = self.redrive_targets(command)
        if isinstance(targets, ErrorResult):
            return targets
        done: list[int] = []
        refused: list[tuple[int, Code]] = []
        for message_id in targets:
            row = self.load_current(message_id)
            if row is None:
                refused.append((message_id, Code.NOT_FOUND))
                continue
            state = row.state(self.now_ms)
            if isinstance(transition(state, Action.REDRIVE), Code):
                refused.append((message_id, Code.ILLEGAL_STATE))
                continue
            self.conn.execute(
                "UPDATE messages SET phase = ?, due_ms = ?, budget_attempts = attempts, budget_start_ms = ?,"
                " token_open = 0, dead_ms = NULL, dead_reason = NULL, dead_error_class = NULL,"
                " edited_payload = coalesce(?, edited_payload) WHERE id = ?",
                (Phase.WAITING, self.now_ms, self.now_ms, command.payload, message_id),
            )
            self.emit(
                EventType.REDRIVEN,
                message_id,
                row.kind,
                {
                    "actor": command.actor,
                    "reason": command.reason,
                    "from_state": state.value,
                    "edited": command.payload is not None,
                },
            )
            done.append(message_id)
        return BatchResult(code=Code.OK, ids=tuple(done), refused=tuple(refused))

    def discard(self, command: Discard) -> QueueResult:
        row = self.load_current(command.message_id)
        if row is None:
            return Outcome(code=Code.NOT_FOUND)
        state = row.state(self.now_ms)
        if isinstance(transition(state, Action.DISCARD), Code):
            return Outcome(code=Code.ILLEGAL_STATE, message_id=row.id, state=state)
        self.conn.execute(
            "UPDATE messages SET phase = ?, token_open = 0, terminal_ms = ?, purge_ms = ?, dead_ms = NULL"
            " WHERE id = ?",
            (Phase.DISCARDED, self.now_ms, self.now_ms + self.config.retention_ms, row.id),
        )
        self.emit(
            EventType.DISCARDED,
            row.id,
            row.kind,
            {"actor": command.actor, "reason": command.reason, "from_state": state.value},
        )
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
        self.emit(EventType.PAUSED, 0, command.kind, {"holder": command.holder, "reason": command.reason})
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
        holders = self.holders(command.kind)
        self.emit(
            EventType.RESUMED, 0, command.kind, {"holder": command.holder, "still_paused": bool(holders)}
        )
        return KindResult(code=Code.OK, kind=command.kind, holders=holders)

    def set_policy(self, command: SetPolicy) -> QueueResult:
        problems = command.policy.problems()
        if problems:
            return ErrorResult(code=Code.INVALID, detail="; ".join(problems)[:200])
        if not self.kind_known(command.kind):
            (count,) = self.conn.execute("SELECT count(*) FROM kinds").fetchone()
            if count >= KINDS_MAX:
                return ErrorResult(code=Code.INVALID, detail=f"more than {KINDS_MAX} kinds")
        self.conn.execute(
            "INSERT INTO kinds (kind, policy) VALUES (?, ?)"
            " ON CONFLICT(kind) DO UPDATE SET policy = excluded.policy",
            (command.kind, _policy_encoder.encode(command.policy)),
        )
        self.emit(
            EventType.POLICY_SET, 0, command.kind, {"policy": msgspec.json.encode(command.policy).decode()}
        )
        return KindResult(code=Code.OK, kind=command.kind, holders=self.holders(command.kind))

    def purge(self, command: Purge) -> QueueResult:
        rows = self.conn.execute(
            "SELECT id, kind, idempotency_key, phase FROM messages INDEXED BY messages_purge"
            " WHERE purge_ms <= ? ORDER BY purge_ms, id LIMIT ?",
            (self.now_ms, command.limit),
        ).fetchall()
        for message_id, kind, key, phase in rows:
            assert state_of(Phase(phase), 0, self.now_ms) in TERMINAL
            self.conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            self.conn.execute("DELETE FROM attempts WHERE message_id = ?", (message_id,))
            self.conn.execute("DELETE FROM idempotency WHERE key = ? AND message_id = ?", (key, message_id))
            self.emit(EventType.PURGED, message_id, kind, {})
        return BatchResult(code=Code.OK, ids=tuple(int(row[0]) for row in rows))
