"""The queue's typed client over a Raft cluster: commands through the log, queries through reads.

    raft = RaftClient([("127.0.0.1", 7001), ...])
    queue = QueueClient(raft)
    r = await queue.enqueue("transfer", idempotency_key="req-1", ref_key="order-9", payload=b"...")
    grants = (await queue.lease("worker-1", count_max=100, lease_ms=30_000)).grants
    await queue.ack(grants[0].message_id, grants[0].token)
    page = (await queue.dead_letters(DeadLetterFilter(kind="transfer"))).value

Owns: encoding commands (queues.codec), decoding their results into the model's typed results,
and coalescing: commands submitted by concurrent callers in the same event-loop iteration travel
in one `propose_many` frame (one log entry, one fsync), each on its own exactly-once session lane.
Expected outcomes (EXISTS, CONFLICT, STALE_TOKEN, ...) are values in the results; `QueueError` is
raised only for a command the machine could not decode or found invalid, and
`raft_store.client.ClientError` when the cluster gave no answer: its subclass `OutcomeUnknown`
when the command reached a node and may have been applied (retry only in a way that is safe if it
was: an enqueue with the same idempotency key), and `Unavailable` when it certainly was not (no
node took it). Commands coalesced into one frame share one outcome.

Queries come from `QueueReads` (queues/client_reads.py), which this class extends: linearizable
by default (ReadIndex on the leader). `stale_ok=True` reads from the replica the read client talks
to without a ReadIndex round; every read returns the applied index its answer reflects, so a
caller can tell how stale it was. For follower reads pass a `reader`: a RaftClient whose only
address is the follower.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Final, TypeVar

import msgspec

from delay.policy import RetryPolicy
from queues import codec
from queues.client_reads import EventsPurged as EventsPurged
from queues.client_reads import QueueError as QueueError
from queues.client_reads import QueueReads
from queues.client_reads import Read as Read
from queues.model import (
    BATCH_IDS_MAX,
    ERROR_CLASS_PAYLOAD_CORRUPT,
    Ack,
    AckMany,
    Approve,
    BatchResult,
    ControlJob,
    DeadLetterFilter,
    Discard,
    DocumentResult,
    EditRedrive,
    Enqueue,
    EnqueueResult,
    ErrorResult,
    ExpireLeases,
    ExtendLease,
    Fail,
    JobAction,
    JobStepResult,
    KindResult,
    Lease,
    LeaseResult,
    Outcome,
    Outcomes,
    PauseKind,
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
    ReviewAction,
    ReviewResult,
    RevokeToken,
    Role,
    SetPolicy,
    SetQuota,
    SetRetention,
    StepJob,
    TokenResult,
    content_hash,
)
from raft_store.client import ClientError, Proposal, RaftClient

log = logging.getLogger("queues.client")

T = TypeVar("T")
R = TypeVar("R", bound=QueueResult)

COALESCE_COMMANDS_MAX: Final = 1024
"""Commands per frame when concurrent callers are coalesced (one log entry holds up to 8192)."""
COALESCE_HOLD_MAX_S: Final = 0.02
"""How long commands wait for this client's frame at the store before they go without its answer."""


class _Coalescer:
    """Gathers commands into one propose_many: at the end of the loop iteration they were submitted
    in when none of this client's frames is at the store, else when that frame's answer comes (the
    Nagle rule: immediate when nothing is waiting, batched while something is). The frame is on
    the leader's socket when `_flush` returns (`RaftClient.send_many`), not one or two loop
    iterations later, when the next burst of work may already have run ahead of it.

    Why hold while a frame is out: a producer's burst otherwise leaves as several frames a few
    iterations apart, each a task and an answer to wake for; held, the burst's commands travel
    together once the store has answered, and the API and the store overlap better (measured in
    docs/benchmarks.md, "the coalescer holds": the API's single POSTs faster in 5 of 6 alternated
    rounds, median +5 %, the machine busier by 0.14 cores). Held at most COALESCE_HOLD_MAX_S: a
    frame waiting on a retry or a stalled disk does not hold the rest behind it longer than that."""

    def __init__(self, raft: RaftClient, limit: int, hold_max_s: float = COALESCE_HOLD_MAX_S) -> None:
        self._raft = raft
        self._limit = limit
        self._hold_max_s = hold_max_s
        self._pending: list[tuple[bytes, bool, asyncio.Future[bytes]]] = []
        self._scheduled = False
        self._hold: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def submit(self, data: bytes, sessionless: bool) -> bytes:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._pending.append((data, sessionless, future))
        if not self._scheduled:
            if not self._sending:
                self._schedule(loop)
            elif self._hold is None:
                self._hold = loop.call_later(self._hold_max_s, self._held_long_enough)
        return await future

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = True
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        loop.call_soon(self._flush)

    def _held_long_enough(self) -> None:
        self._hold = None
        if self._pending and not self._scheduled:
            self._schedule(asyncio.get_running_loop())

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if self._pending and not self._scheduled:
            self._schedule(asyncio.get_running_loop())

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        for start in range(0, len(pending), self._limit):
            batch = pending[start : start + self._limit]
            proposal = self._raft.send_many([data for data, _, _ in batch], sessionless=[free for _, free, _ in batch])
            task = loop.create_task(self._send(batch, proposal))
            self._sending.add(task)  # a strong reference until it is done
            task.add_done_callback(self._answered)

    async def _send(self, batch: list[tuple[bytes, bool, asyncio.Future[bytes]]], proposal: Proposal) -> None:
        try:
            results = await self._raft.results(proposal)
        except BaseException as error:  # the whole frame's outcome is in doubt
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def travels_sessionless(command: QueueCommand) -> bool:
    """An enqueue is exactly-once by its idempotency key: a session lane adds nothing to it.

    Without a lane every replica skips a session read and write for each enqueue. A retry after
    a lost answer is applied again; it carries the request_id of its first attempt, so the
    machine recognises it and answers OK as the first application did (a repeat of the key by
    anyone else answers EXISTS)."""
    return isinstance(command, Enqueue) and command.request_id != 0


def _request_id() -> int:
    return secrets.randbits(63) or 1


def with_request_id(item: Enqueue) -> Enqueue:
    """The enqueue with a request id (its own, else a new one), so that it travels sessionless
    (above). Stamp once, before any retry: a retry of an applied enqueue is then answered OK."""
    return item if item.request_id else msgspec.structs.replace(item, request_id=_request_id())


def _stamped(command: QueueCommand) -> QueueCommand:
    """Every path a command takes to the log stamps enqueues: a single submit as much as a frame."""
    return with_request_id(command) if isinstance(command, Enqueue) else command


class QueueClient(QueueReads):
    """Commands through the log (below) and queries through reads (`QueueReads`)."""

    def __init__(
        self, raft: RaftClient, *, reader: RaftClient | None = None, coalesce: bool = True,
        coalesce_max: int = COALESCE_COMMANDS_MAX,
    ) -> None:
        self.raft = raft
        self.reader = reader or raft
        self._coalescer = _Coalescer(raft, coalesce_max) if coalesce else None

    # ---- commands -----------------------------------------------------------------------------
    async def submit(self, command: QueueCommand) -> QueueResult:
        """One command through the log; its decoded result."""
        command = _stamped(command)
        data = codec.encode_command(command)
        if self._coalescer is not None:
            raw = await self._coalescer.submit(data, travels_sessionless(command))
        elif travels_sessionless(command):
            (raw,) = await self.raft.propose_many([data], sessionless=[True])
        else:
            raw = await self.raft.propose(data)
        return _decode(raw)

    async def submit_many(self, commands: Sequence[QueueCommand]) -> list[QueueResult]:
        """Many commands in one frame and one log entry (each on its own session lane, but enqueues:
        they travel sessionless)."""
        if not commands:
            return []
        stamped = [_stamped(c) for c in commands]
        raws = await self.raft.propose_many(
            [codec.encode_command(c) for c in stamped], sessionless=[travels_sessionless(c) for c in stamped]
        )
        return [_decode(raw) for raw in raws]

    async def enqueue(
        self, kind: str, *, idempotency_key: str, ref_key: str, payload: bytes,
        headers: dict[str, str] | None = None, delay_ms: int = 0, due_ms: int | None = None,
    ) -> EnqueueResult:
        """The new message's id and state (OK), or the original's for a known key (EXISTS), or
        CONFLICT / UNKNOWN_KIND. Retrying with the same key after a ClientError is safe: after
        OutcomeUnknown the retry may answer EXISTS for the message the first attempt created."""
        command = Enqueue(kind=kind, idempotency_key=idempotency_key, ref_key=ref_key, payload=payload,
                          headers=headers or {}, delay_ms=delay_ms, due_ms=due_ms)
        return _expect(await self.submit(command), EnqueueResult)

    async def enqueue_many(self, items: Sequence[Enqueue]) -> list[EnqueueResult]:
        return [_expect(r, EnqueueResult) for r in await self.submit_many(items)]

    async def lease(
        self, worker_id: str, *, kinds: Sequence[str] = (), count_max: int = 100, lease_ms: int = 30_000,
        probe: str | None = None,
    ) -> LeaseResult:
        command = Lease(worker_id=worker_id, count_max=count_max, lease_ms=lease_ms, kinds=tuple(kinds), probe=probe)
        return await self.checked(_expect(await self.submit(command), LeaseResult))

    async def checked(self, result: LeaseResult) -> LeaseResult:
        """The result without the grants whose payload does not match the content hash stored with
        it (a payload corrupted at rest on the replica that granted it). Those attempts are failed
        at once as `payload_corrupt`, retryable: the reason shows in the message's history and, if
        no delivery is intact, in the dead-letter tier, and the payload never reaches a handler."""
        corrupt = [
            grant for grant in result.grants
            if grant.payload_hash and content_hash(grant.kind, grant.ref_key, grant.payload) != grant.payload_hash
        ]  # fmt: skip
        if not corrupt:
            return result
        for grant in corrupt:
            log.error("message %d attempt %d: the payload granted does not match its content hash; failing the"
                      " attempt as %s", grant.message_id, grant.attempt, ERROR_CLASS_PAYLOAD_CORRUPT)
            try:
                await self.fail(grant.message_id, grant.token, ERROR_CLASS_PAYLOAD_CORRUPT,
                                "the payload granted does not match the content hash stored with it")
            except (ClientError, QueueError) as error:  # its lease will expire: an attempt all the same
                log.warning("message %d: could not fail the corrupt attempt: %r", grant.message_id, error)
        dropped = {grant.message_id for grant in corrupt}
        return msgspec.structs.replace(result, grants=tuple(g for g in result.grants if g.message_id not in dropped))

    async def release(self, message_id: int, token: int, *, interrupted: bool = False) -> Outcome:
        """Hand a lease back: ready at once, the delivery not counted against the budget
        (`interrupted`: it had started, so the next delivery checks downstream first)."""
        return _expect(await self.submit(Release(message_id=message_id, token=token, interrupted=interrupted)), Outcome)

    async def extend(self, message_id: int, token: int, lease_ms: int) -> Outcome:
        return _expect(await self.submit(ExtendLease(message_id=message_id, token=token, lease_ms=lease_ms)), Outcome)

    async def ack(self, message_id: int, token: int, summary: str = "") -> Outcome:
        return _expect(await self.submit(Ack(message_id=message_id, token=token, summary=summary)), Outcome)

    async def ack_many(self, acks: Sequence[tuple[int, int]]) -> list[Outcome]:
        """(message_id, token) pairs acknowledged as AckMany commands of up to 1000 each.

        One command per 1000 acks: one session lane and one set-wise write on every replica,
        instead of a lane, a session row and three statements per ack."""
        items = [Ack(message_id=m, token=t) for m, t in acks]
        chunks = [AckMany(acks=tuple(items[i : i + BATCH_IDS_MAX])) for i in range(0, len(items), BATCH_IDS_MAX)]
        results = await self.submit_many(chunks) if chunks else []
        return [outcome for r in results for outcome in _expect(r, Outcomes).outcomes]

    async def fail(
        self, message_id: int, token: int, error_class: str, error_text: str = "", *, permanent: bool = False,
        retry_after_ms: int | None = None,
    ) -> Outcome:
        command = Fail(message_id=message_id, token=token, error_class=error_class, error_text=error_text,
                       permanent=permanent, retry_after_ms=retry_after_ms)
        return _expect(await self.submit(command), Outcome)

    async def redrive(
        self, actor: str, reason: str, *, ids: Sequence[int] = (), dead_filter: DeadLetterFilter | None = None,
        limit: int = 100, payload: bytes | None = None,
    ) -> BatchResult:
        command = Redrive(actor=actor, reason=reason, ids=tuple(ids), filter=dead_filter, limit=limit,
                          payload=payload)
        return _expect(await self.submit(command), BatchResult)

    async def discard(self, message_id: int, actor: str, reason: str, *, reason_code: str = "") -> Outcome:
        command = Discard(message_id=message_id, actor=actor, reason=reason, reason_code=reason_code)
        return _expect(await self.submit(command), Outcome)

    async def edit_redrive(
        self, message_id: int, payload: bytes, *, actor: str, reason: str, headers: dict[str, str] | None = None
    ) -> ReviewResult:
        """Redrive as a new version with this payload (validated by the caller against the kind's
        schema); `new_ids` holds the new version's id, the original is kept, superseded."""
        command = EditRedrive(message_id=message_id, payload=payload, actor=actor, reason=reason, headers=headers)
        return _expect(await self.submit(command), ReviewResult)

    async def propose(self, action: ReviewAction, *, ttl_ms: int) -> ReviewResult:
        """A four-eyes proposal of `action` (its actor is the proposer), open for `ttl_ms`."""
        return _expect(await self.submit(Propose(action=action, ttl_ms=ttl_ms)), ReviewResult)

    async def approve(self, proposal_id: int, *, approver: str, reason: str = "") -> ReviewResult:
        """Approve and perform a proposal, in one command (refused for its own proposer: OWN_PROPOSAL)."""
        return _expect(
            await self.submit(Approve(proposal_id=proposal_id, approver=approver, reason=reason)), ReviewResult
        )

    async def reject(self, proposal_id: int, *, actor: str, reason: str) -> ReviewResult:
        """Reject a proposal (or withdraw one's own): nothing is done."""
        return _expect(await self.submit(Reject(proposal_id=proposal_id, actor=actor, reason=reason)), ReviewResult)

    async def start_job(self, command: RedriveJob) -> ReviewResult:
        """Start a redrive job over these dead letters (ids resolved by the caller, at most 100,000):
        `job_id` names it, `refused` the ids that were not dead (recorded as refused items). To
        start it under four eyes, `propose(command, ttl_ms=)` instead: the approval starts it."""
        return _expect(await self.submit(command), ReviewResult)

    async def step_job(self, job_id: int, limit: int = 300) -> JobStepResult:
        """Redrive the job's next pending items, as many as its rate allows by the leader's time (at
        most `limit`): what the maintenance driver proposes; safe to call from anywhere, any time."""
        return _expect(await self.submit(StepJob(job_id=job_id, limit=limit)), JobStepResult)

    async def control_job(
        self, job_id: int, action: JobAction | str, *, actor: str, reason: str
    ) -> ReviewResult:
        """Pause, resume or cancel a job (audited); ILLEGAL_STATE, changing nothing, when the job's
        state does not allow it. A cancel leaves every pending item not redriven."""
        command = ControlJob(job_id=job_id, action=JobAction(action), actor=actor, reason=reason)
        return _expect(await self.submit(command), ReviewResult)

    async def pause(self, kind: str, holder: str, reason: str = "", *, actor: str = "") -> KindResult:
        return _expect(await self.submit(PauseKind(kind=kind, holder=holder, reason=reason, actor=actor)), KindResult)

    async def resume(self, kind: str, holder: str, *, actor: str = "") -> KindResult:
        return _expect(await self.submit(ResumeKind(kind=kind, holder=holder, actor=actor)), KindResult)

    async def set_policy(self, kind: str, policy: RetryPolicy, *, actor: str = "", reason: str = "") -> KindResult:
        """The kind registered or its policy replaced; `policy_before` in the result is what it was."""
        command = SetPolicy(kind=kind, policy=policy, actor=actor, reason=reason)
        return _expect(await self.submit(command), KindResult)

    async def put_token(self, name: str, role: Role, secret_hash: bytes, *, actor: str, reason: str = "") -> TokenResult:
        """Create or rotate `name`'s token (the secret's SHA-256 only; see queues/access.py)."""
        command = PutToken(name=name, role=role, secret_hash=secret_hash, actor=actor, reason=reason)
        return _expect(await self.submit(command), TokenResult)

    async def revoke_token(self, name: str, *, actor: str, reason: str = "") -> TokenResult:
        return _expect(await self.submit(RevokeToken(name=name, actor=actor, reason=reason)), TokenResult)

    async def set_quota(
        self, name: str, *, actor: str, rate_per_s: int | None = None, burst: int | None = None
    ) -> TokenResult:
        command = SetQuota(name=name, actor=actor, rate_per_s=rate_per_s, burst=burst)
        return _expect(await self.submit(command), TokenResult)

    async def set_retention(
        self, *, actor: str, reason: str, retention_ms: int | None = None, event_retention_ms: int | None = None
    ) -> RetentionResult:
        command = SetRetention(
            actor=actor, reason=reason, retention_ms=retention_ms, event_retention_ms=event_retention_ms
        )
        return _expect(await self.submit(command), RetentionResult)

    async def expire_leases(self, limit: int = 1000) -> BatchResult:
        return _expect(await self.submit(ExpireLeases(limit=limit)), BatchResult)

    async def purge(self, limit: int = 1000) -> BatchResult:
        return _expect(await self.submit(Purge(limit=limit)), BatchResult)

    async def put_document(
        self, namespace: str, name: str, body: bytes | None, *, actor: str, reason: str = "",
        expected_version: int | None = None,
    ) -> DocumentResult:
        """`expected_version`: write only if the namespace is still at that version (CONFLICT otherwise)."""
        command = PutDocument(namespace=namespace, name=name, body=body, actor=actor, reason=reason,
                              expected_version=expected_version)  # fmt: skip
        return _expect(await self.submit(command), DocumentResult)


def _decode(raw: bytes) -> QueueResult:
    try:
        return codec.decode_result(raw)
    except (ValueError, msgspec.DecodeError) as error:  # e.g. raft_store's stale-session marker
        raise QueueError(f"not a queue result: {raw[:32]!r}") from error


def _expect(result: QueueResult, kind: type[R]) -> R:
    if isinstance(result, kind):
        return result
    if isinstance(result, ErrorResult):
        raise QueueError(result)
    raise QueueError(f"expected {kind.__name__}, got {result!r}")
