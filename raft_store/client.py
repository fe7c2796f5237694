"""The native client: finds the leader, follows redirects, retries, and applies each command once.

Exactly-once uses client sessions (Raft dissertation 6.3). The state machine remembers, per
session id, the last sequence number applied and its result. A session runs one command at a
time, so a client that wants many commands in flight holds many sessions ("lanes"): a command
takes a free lane, keeps that lane's (id, seq) across every retry, and gives the lane back with
seq+1 once answered. A lane whose command ended in doubt (timeout) is never reused, so a later
command cannot be mistaken for the doubtful one.

When the deadline passes the caller is told what is known, because the two cases need opposite
handling: `Unavailable` when no attempt can have been applied (nothing reached a node, or every
node that got it answered that it did not log it), `OutcomeUnknown` when one may have been. Only
a retry with the command's own idempotency key is safe after `OutcomeUnknown`: the session the
command travelled on is dropped with the failure.

Every connection opens with the handshake of raft_store/handshake.py (the cluster secret, proven
both ways; TLS when configured). A node that refuses our secret, or cannot prove it holds it,
ends the call at once with `AuthenticationFailed`: retrying with the same secret cannot help.

Node ids, needed to follow a leader hint, are learned only from the addresses the client was
given (a node's status says its id) and from the client addresses nodes advertise; never from
the peer addresses nodes use among themselves, which clients may have no route to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raft_store import codec
from raft_store.auth import StoreAuth
from raft_store.client_connection import Address, Connection, show_address
from raft_store.codec import FrameType, Status
from raft_store.handshake import HANDSHAKE_TIMEOUT_S, DialerHandshake, HandshakeFailed

AUTO_BATCH_MAX = 1024  # commands per automatic batch frame


class ClientError(Exception):
    """The cluster refused the request, or gave no answer within the deadline. Callers that must
    know whether a command may have been applied catch the subclasses."""


class RequestRefused(ClientError):
    """The request is wrong (Status.ERROR): retrying will not help."""


class AuthenticationFailed(ClientError):
    """A node refused this client's cluster secret, or could not prove it holds it: the secret
    file is wrong, or the node is not ours. Nothing was sent to it."""


class Unavailable(ClientError):
    """No answer within the deadline, and certainly not applied: no attempt's request reached a
    node that could have logged it (connections failed, or every node that got it answered that
    it did not log it). Retrying later is safe in every way.

    `last_error` describes the last attempt; `last_address` is the node it went to (None when
    the deadline allowed no attempt)."""

    def __init__(self, message: str, *, last_error: str, last_address: Address | None) -> None:
        super().__init__(message)
        self.last_error = last_error
        self.last_address = last_address


class OutcomeUnknown(ClientError):
    """No answer within the deadline, and the request may have been applied: an attempt reached
    a node (`reached`) that then gave no definitive answer (timeout, connection lost, or it
    stopped leading after logging it). A retry must carry the same idempotency key, because the
    session the command travelled on is dropped and cannot deduplicate it any more.

    `last_error` and `last_address` describe the last attempt, which may differ from `reached`."""

    def __init__(self, message: str, *, reached: Address, last_error: str, last_address: Address | None) -> None:
        super().__init__(message)
        self.reached = reached
        self.last_error = last_error
        self.last_address = last_address


class _NotSent(Exception):
    """An attempt failed before its request was written: no node has seen it."""


class _NoAnswer(Exception):
    """An attempt's request was written and no definitive answer came: a node may act on it."""


@dataclass(frozen=True, slots=True)
class LongPoll:
    """How a stale read waits at the node (`RaftClient.read`)."""

    after_index: int
    """Answer once a command after this index has applied (the index the caller's last answer reflected)..."""
    seconds: float
    """...or after this long, from the state as it is then."""
    wakes_one: bool = False
    """Of the reads waiting with the same query, the node answers one per apply (codec.Read.wakes_one)."""


Build = Callable[[int], tuple[FrameType, bytes]]
"""Makes a request's frame for a request id (each attempt has its own id)."""


def _parse(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


_RETRY_ADVICE = {
    "command": "a retry must carry the same idempotency key (the session it travelled on is dropped)",
    "admin request": "check `raft-store status` before repeating it",
    "read": "a read changes nothing, so retrying is safe",
}
"""What a caller may do after OutcomeUnknown, per kind of request."""


@dataclass(slots=True)
class _Trail:
    """What the attempts of one request established, for the error raised at its deadline."""

    noun: str  # a key of _RETRY_ADVICE: what the caller asked for
    last_error: str = "no attempt"
    last_address: Address | None = None
    doubt: str = ""  # why an attempt may have been applied; empty while none may have
    reached: Address | None = None

    def in_doubt(self, address: Address, why: str) -> None:
        self.doubt, self.reached = why, address
        self.last_error = f"{show_address(address)}: {why}"

    def error(self, deadline_s: float) -> ClientError:
        if self.reached is not None:
            return OutcomeUnknown(
                f"outcome unknown: the {self.noun} reached {show_address(self.reached)} and {self.doubt}; it may or may"
                f" not have been applied: {_RETRY_ADVICE[self.noun]}. Gave up after {deadline_s} s;"
                f" last: {self.last_error}",
                reached=self.reached,
                last_error=self.last_error,
                last_address=self.last_address,
            )
        return Unavailable(
            f"unavailable: the {self.noun} was not applied: no node took it within {deadline_s} s, so retrying"
            f" later is safe. Last: {self.last_error}",
            last_error=self.last_error,
            last_address=self.last_address,
        )


@dataclass(slots=True)
class _Lane:
    session_id: int
    seq: int


@dataclass(slots=True)
class _Sent:
    """An attempt whose request is written: the node may act on it from now on."""

    address: Address
    conn: Connection
    request_id: int
    future: asyncio.Future[tuple[FrameType, bytes]]
    timer: asyncio.TimerHandle
    timeout_s: float


@dataclass(slots=True)
class Proposal:
    """Commands in one frame (`RaftClient.send_many`): the frame's builder, the session lanes its
    commands travel on, and its first attempt when that is already written."""

    build: Build
    lanes: list[_Lane]
    sent: _Sent | None = None


async def _answer(sent: _Sent) -> codec.Result:
    """The node's answer to a written attempt, or _NoAnswer: it may act on the request all the same."""
    try:
        _, reply = await sent.future
        return codec.decode_result(reply)
    except TimeoutError:
        raise _NoAnswer(f"no answer came within {sent.timeout_s} s") from None
    except (OSError, codec.CodecError) as exc:
        raise _NoAnswer(f"the connection failed after the request was sent ({exc!r})") from None
    finally:
        sent.timer.cancel()
        sent.conn.pending.pop(sent.request_id, None)


def _expire(future: asyncio.Future[tuple[FrameType, bytes]]) -> None:
    if not future.done():
        future.set_exception(TimeoutError("no answer within the attempt timeout"))


class RaftClient:
    def __init__(
        self,
        addresses: Sequence[Address],
        *,
        auth: StoreAuth,
        cluster_id: int = 1,
        attempt_timeout_s: float = 2.0,
        deadline_s: float = 30.0,
    ) -> None:
        if not addresses:
            raise ValueError("need at least one node address")
        self.addresses = list(addresses)
        self.auth = auth
        self.cluster_id = cluster_id
        self.attempt_timeout_s = attempt_timeout_s
        self.deadline_s = deadline_s
        self._ids: dict[int, Address] = {}
        self._leader: Address | None = None
        self._conns: dict[Address, Connection] = {}
        self._connecting: dict[Address, asyncio.Future[Connection]] = {}
        self._lanes: list[_Lane] = []
        self._request_id = 0
        self._rotate = 0
        self._batch: list[tuple[bytes, asyncio.Future[bytes]]] = []
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self.retries = 0
        self.redirects = 0

    # ---- public API ---------------------------------------------------------------------
    async def propose(self, data: bytes) -> bytes:
        """One command. Commands proposed by concurrent callers in the same event-loop turn
        travel in one frame (and one log entry): the per-request cost at the client and the
        leader is paid once per batch, not once per command, and share its fate: a batch that
        ends in OutcomeUnknown raises it for each of its commands."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush_batch)
        self._batch.append((data, future))
        return await future

    def _flush_batch(self) -> None:
        while self._batch:
            items = self._batch[:AUTO_BATCH_MAX]
            del self._batch[:AUTO_BATCH_MAX]
            proposal = self.send_many([data for data, _ in items])
            task = asyncio.get_running_loop().create_task(self._send_batch(items, proposal))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    async def _send_batch(self, items: list[tuple[bytes, asyncio.Future[bytes]]], proposal: Proposal) -> None:
        try:
            results = await self.results(proposal)
        except BaseException as exc:
            for _, future in items:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else ClientError(repr(exc)))
            return
        for (_, future), result in zip(items, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def propose_many(self, commands: Sequence[bytes], *, sessionless: Sequence[bool] = ()) -> list[bytes]:
        """Commands go in one frame and, at the leader, in one log entry when they fit.

        Each command travels on a session lane, so a retry after a lost answer returns the stored
        result instead of applying twice; a command marked in `sessionless` travels without one
        (client id 0) because it is idempotent by its own content, and a retry of it may apply
        again, which for such a command changes nothing.

        Without an answer by the deadline it raises OutcomeUnknown (the frame reached a node that
        may have logged it: retry only with the commands' own idempotency keys) or Unavailable
        (certainly not applied)."""
        return await self.results(self._commands(commands, sessionless))

    def send_many(self, commands: Sequence[bytes], *, sessionless: Sequence[bool] = ()) -> Proposal:
        """`propose_many`'s first attempt made now: with a connection to the leader open, the frame
        is on its socket when this returns, not one or two loop iterations later. `await
        client.results(proposal)` retries and raises as `propose_many` does (the attempt counts as written)."""
        proposal = self._commands(commands, sessionless)
        address = self._leader
        conn = self._conns.get(address) if address is not None else None
        if address is not None and conn is not None and conn.alive:
            proposal.sent = self._send(address, conn, proposal.build, 0.0)
            assert conn.out is not None
            conn.out.flush()
        return proposal

    async def results(self, proposal: Proposal) -> list[bytes]:
        """The results of a proposal from `send_many` (or `propose_many`'s own)."""
        # If this raises, the lanes' outcomes are in doubt: they are dropped, never reused.
        result = await self._call_with_retries(proposal.build, "command", first=proposal.sent)
        for lane in proposal.lanes:
            lane.seq += 1
            self._lanes.append(lane)
        return list(result.results)

    def _commands(self, commands: Sequence[bytes], sessionless: Sequence[bool]) -> Proposal:
        lanes: list[_Lane] = []
        triples: list[tuple[int, int, bytes]] = []
        for i, data in enumerate(commands):
            if sessionless and sessionless[i]:
                triples.append((0, 0, data))
            else:
                lane = self._take_lane()
                lanes.append(lane)
                triples.append((lane.session_id, lane.seq, data))
        frame = tuple(triples)
        return Proposal(
            lambda request_id: (FrameType.PROPOSE, codec.encode_propose(codec.Propose(request_id, frame))), lanes
        )

    async def read(self, query: bytes, *, linearizable: bool = True, wait: LongPoll | None = None) -> tuple[bytes, int]:
        """Returns (answer, applied index the answer reflects). Raises Unavailable or
        OutcomeUnknown as commands do; a read changes nothing either way, but the difference says
        whether any node got it (a cluster without a leader) or one got it and went quiet.

        With `wait` (a stale read only) the node holds the read until a command after
        `wait.after_index` has applied, or for `wait.seconds`: a long poll, so a caller hears of a
        change one apply after it without asking again and again."""
        if wait is not None and linearizable:
            raise ValueError("a waiting read must be stale (linearizable=False)")
        wait_ms = 0 if wait is None else max(0, min(round(wait.seconds * 1000), codec.READ_WAIT_MS_MAX))
        after, wakes_one = (wait.after_index, wait.wakes_one) if wait is not None else (0, False)

        def build(request_id: int) -> tuple[FrameType, bytes]:
            read = codec.Read(request_id, linearizable, query, after, wait_ms, wakes_one)
            return FrameType.READ, codec.encode_read(read)

        result = await self._call_with_retries(build, "read", wait_ms / 1000)
        answer, applied = result.results
        return answer, int.from_bytes(applied, "big")

    async def admin(self, op: str, node: int, address: str | None = None) -> bytes:
        body: dict[str, Any] = {"op": op, "node": node}
        if address:
            body["address"] = address

        def build(request_id: int) -> tuple[FrameType, bytes]:
            return FrameType.ADMIN, json.dumps({**body, "request_id": request_id}).encode()

        result = await self._call_with_retries(build, "admin request")
        return result.results[0] if result.results else b""

    async def status(self, address: Address) -> dict[str, Any]:
        """The node's status answer (role, term, commit, lag, ...).

        It also teaches the client node ids for leader hints: the id of `address` when it is an
        address the client was given, and the node's advertised "client_addresses". Never its
        "addresses": those are peer addresses, which may be on a network clients cannot reach."""
        conn = await self._connect(address)
        future: asyncio.Future[tuple[FrameType, bytes]] = asyncio.get_running_loop().create_future()
        conn.status_waiters.append(future)
        conn.write(codec.frame(FrameType.STATUS, b""))
        _, body = await asyncio.wait_for(future, self.attempt_timeout_s)
        status: dict[str, Any] = json.loads(body)
        if address in self.addresses:
            self._ids[int(status["node"])] = address
        for node, advertised in status.get("client_addresses", {}).items():
            self._ids.setdefault(int(node), _parse(str(advertised)))
        return status

    async def close(self) -> None:
        """Closes every connection, those being opened too: a connect still in its handshake is
        cancelled (and one that finished opening meanwhile is registered, then closed), so a
        client closed during a first call leaves no socket and no reader task behind."""
        opening = list(self._connecting.values())
        for future in opening:
            future.cancel()
        if opening:
            await asyncio.gather(*opening, return_exceptions=True)  # their done callbacks ran first
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()

    # ---- internals ------------------------------------------------------------------------
    def _take_lane(self) -> _Lane:
        if self._lanes:
            return self._lanes.pop()
        return _Lane(secrets.randbits(62) + 1, 1)

    async def _connect(self, address: Address) -> Connection:
        conn = self._conns.get(address)
        if conn is not None and conn.alive:
            return conn
        pending = self._connecting.get(address)
        if pending is None:  # calls that connect at once share one connection (which close() closes)
            pending = self._connecting[address] = asyncio.ensure_future(
                _open(address, self.auth, self.cluster_id, self.attempt_timeout_s))
            pending.add_done_callback(lambda done: self._opened(address, done))
        return await asyncio.shield(pending)

    def _opened(self, address: Address, done: asyncio.Future[Connection]) -> None:
        self._connecting.pop(address, None)
        if not done.cancelled() and done.exception() is None:
            self._conns[address] = done.result()

    def _target(self) -> Address:
        if self._leader is not None:
            return self._leader
        self._rotate += 1
        # The given addresses first, then the client addresses nodes advertised: a client given
        # one node still finds the others when that one is down.
        rotation = self.addresses + [a for a in self._ids.values() if a not in self.addresses]
        return rotation[self._rotate % len(rotation)]

    async def _call_with_retries(
        self, build: Build, noun: str, held_s: float = 0.0, first: _Sent | None = None
    ) -> codec.Result:
        """Attempts until an answer or the deadline, then raises what the attempts established:
        OutcomeUnknown if any attempt may have been applied, else Unavailable. `held_s`: how long
        a node may hold the request before it answers (a waiting read), added to each attempt's
        timeout and to the deadline. `first`: an attempt already written (`send_many`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s + held_s
        backoff_s = 0.01
        trail = _Trail(noun)
        while first is not None or loop.time() < deadline:
            address = self._target() if first is None else first.address
            trail.last_address = address
            try:
                if first is not None:
                    sent, first = first, None
                    result = await _answer(sent)
                else:
                    result = await self._attempt(address, build, held_s)
            except _NotSent as exc:
                trail.last_error = f"{show_address(address)}: {exc}"
            except _NoAnswer as exc:
                trail.in_doubt(address, str(exc))
            else:
                if result.status is Status.OK:
                    self._leader = address
                    return result
                if result.status is Status.ERROR:
                    raise RequestRefused(b"; ".join(result.results).decode(errors="replace"))
                if result.status is Status.IN_DOUBT:
                    trail.in_doubt(address, "that node logged it, then stopped leading before it committed")
                else:  # NOT_LEADER, DROPPED: that node did not log it
                    trail.last_error = f"{show_address(address)}: {result.status.name}"
                if await self._redirect(address, result.leader_hint, trail):
                    self.retries += 1
                    continue
            self.retries += 1
            self._leader = None
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 0.5)
        raise trail.error(self.deadline_s)

    async def _attempt(self, address: Address, build: Build, held_s: float = 0.0) -> codec.Result:
        """One try at one node: its answer, or _NotSent / _NoAnswer saying whether the request
        was written (once written, the node may act on it whatever happens next)."""
        try:
            conn = await self._connect(address)
        except (OSError, TimeoutError) as exc:
            raise _NotSent(f"cannot connect: {exc!r}") from None
        return await _answer(self._send(address, conn, build, held_s))

    def _send(self, address: Address, conn: Connection, build: Build, held_s: float) -> _Sent:
        """Writes one attempt's request (from here on the node may act on it)."""
        loop = asyncio.get_running_loop()
        self._request_id += 1
        request_id = self._request_id
        data = codec.frame(*build(request_id))
        future: asyncio.Future[tuple[FrameType, bytes]] = loop.create_future()
        conn.pending[request_id] = future
        conn.write(data)
        timeout_s = self.attempt_timeout_s + held_s
        # One timer per attempt, no wrapper task: asyncio.wait_for costs more than the rest of a
        # request on the hot path.
        return _Sent(address, conn, request_id, future, loop.call_later(timeout_s, _expire, future), timeout_s)

    async def _redirect(self, address: Address, leader: int, trail: _Trail) -> bool:
        """Sends the next attempt to the hinted leader; False when there is no hint to follow."""
        if not leader:
            return False
        hinted = self._ids.get(leader)
        if hinted is None:
            await self._learn_ids()
            hinted = self._ids.get(leader)
        if hinted is None:
            trail.last_error += (
                f" (the leader is node {leader}, and no address for clients is known for it: give"
                " the client its address, or configure the nodes' client addresses)"
            )
            return False
        if hinted == address:
            return False
        self.redirects += 1
        self._leader = hinted
        return True

    async def _learn_ids(self) -> None:
        for address in self.addresses:
            if address in self._ids.values():
                continue
            with contextlib.suppress(Exception):
                await self.status(address)


async def _open(address: Address, auth: StoreAuth, cluster_id: int, timeout_s: float) -> Connection:
    """A connection to `address`, its handshake done (AuthenticationFailed when the node refuses us)."""
    loop = asyncio.get_running_loop()
    handshake = DialerHandshake(auth.secrets.presented(), 0, cluster_id)
    context = auth.client_ssl
    try:
        _, opened = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(address, handshake), *address, ssl=context,
                                   server_hostname=address[0] if context is not None else None),
            timeout_s,
        )  # fmt: skip
    except ssl.SSLCertVerificationError as exc:
        raise AuthenticationFailed(f"{show_address(address)}: its TLS certificate is not one we trust: {exc}") from None
    try:
        await asyncio.wait_for(asyncio.shield(opened.ready), min(timeout_s, HANDSHAKE_TIMEOUT_S))
    except HandshakeFailed as exc:
        await opened.close()
        raise AuthenticationFailed(f"{show_address(address)}: {exc}") from None
    except BaseException:
        await opened.close()
        raise
    return opened
