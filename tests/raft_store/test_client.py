"""What the client tells its caller, against fake nodes on loopback that answer as a script says.

The fakes speak the real frame protocol (raft_store.codec, raft_store.transport), so the client
under test is the production one, connections and timers included. Deadlines are short: each
test takes a fraction of a second.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from queues.client import COALESCE_COMMANDS_MAX, _Coalescer
from raft_store import codec
from raft_store.auth import StoreAuth
from raft_store.client import ClientError, OutcomeUnknown, RaftClient, RequestRefused, Unavailable
from raft_store.codec import FrameType, Status
from raft_store.testing.credentials import accept_dialer, cluster_auth
from raft_store.testing.processes import free_ports
from raft_store.transport import read_frame

Address = tuple[str, int]


class Act(enum.Enum):
    SILENT = "silent"  # take the request, never answer
    HANG_UP = "hang up"  # take the request, close the connection


Script = Callable[[int], Status | Act]
"""How a fake node treats its n-th request (counting from 1)."""


@dataclass
class FakeNode:
    node_id: int
    script: Script
    auth: StoreAuth
    leader_hint: int = 0
    status_fields: dict[str, Any] = field(default_factory=dict)
    requests: int = 0
    frames: list[int] = field(default_factory=list)
    """Commands in each propose frame, in the order they came."""
    connections: int = 0
    gate: asyncio.Event | None = None
    """Set: proposals are answered only once it is set (what comes meanwhile is still read)."""
    address: Address = ("127.0.0.1", 0)
    _server: asyncio.Server | None = None
    _serving: dict[asyncio.Task[Any], asyncio.StreamWriter] = field(default_factory=dict)
    _gated: list[asyncio.Task[None]] = field(default_factory=list)

    @staticmethod
    async def _answer_at_gate(gate: asyncio.Event, writer: asyncio.StreamWriter, answer: bytes) -> None:
        await gate.wait()
        if not writer.is_closing():
            writer.write(answer)

    async def start(self) -> Address:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = self._server.sockets[0].getsockname()[:2]
        return self.address

    async def stop(self) -> None:
        assert self._server is not None
        for task in self._gated:
            task.cancel()
        self._server.close()
        for writer in self._serving.values():
            writer.close()
        await asyncio.gather(*self._serving, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._serving[task] = writer
        try:
            await accept_dialer(reader, writer, self.auth)
            while True:
                ftype, body = await read_frame(reader)
                if ftype is FrameType.STATUS:
                    status = {"node": self.node_id, "role": "follower", **self.status_fields}
                    writer.write(codec.frame(FrameType.STATUS_RESULT, json.dumps(status).encode()))
                    continue
                self.requests += 1
                if ftype is FrameType.PROPOSE:
                    self.frames.append(len(codec.decode_propose(body).commands))
                act = self.script(self.requests)
                if act is Act.HANG_UP:
                    return
                if act is Act.SILENT:
                    continue
                request_id, results = _answer(ftype, body, act)
                result = codec.Result(request_id, act, self.leader_hint, results)
                answer = codec.frame(FrameType.RESULT, codec.encode_result(result))
                if self.gate is not None and ftype is FrameType.PROPOSE:
                    self._gated.append(asyncio.create_task(self._answer_at_gate(self.gate, writer, answer)))
                    continue
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            del self._serving[task]


def _answer(ftype: FrameType, body: bytes, status: Status) -> tuple[int, tuple[bytes, ...]]:
    if ftype is FrameType.PROPOSE:
        propose = codec.decode_propose(body)
        ok = tuple(b"applied" for _ in propose.commands)
        return propose.request_id, ok if status is Status.OK else ()
    assert ftype is FrameType.READ
    read = codec.decode_read(body)
    return read.request_id, (b"answer", (7).to_bytes(8, "big")) if status is Status.OK else ()


def always(act: Status | Act) -> Script:
    return lambda _: act


def first_then(first: Status | Act, then: Status | Act) -> Script:
    return lambda n: first if n == 1 else then


AUTH: list[StoreAuth] = []
"""The fake cluster's secret, made once per module by the `auth` fixture."""


@pytest.fixture(autouse=True, scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> StoreAuth:
    AUTH[:] = [cluster_auth(tmp_path_factory.mktemp("fake-cluster"))]
    return AUTH[0]


def quick_client(*addresses: Address) -> RaftClient:
    return RaftClient(list(addresses), auth=AUTH[0], attempt_timeout_s=0.05, deadline_s=0.3)


def patient_client(*addresses: Address) -> RaftClient:
    """For tests that count frames, requests or connections to a node that always answers: a
    50 ms attempt timeout on a loaded CI machine re-sends a frame (a CI run saw the 2,500-command
    burst's first frame answered late and written twice), which is the client's right behaviour
    but not what these tests are about."""
    return RaftClient(list(addresses), auth=AUTH[0], attempt_timeout_s=10.0, deadline_s=30.0)


@pytest.fixture
async def fake(auth: StoreAuth) -> Any:
    nodes: list[FakeNode] = []

    async def make(node_id: int, script: Script, **fields: Any) -> FakeNode:
        node = FakeNode(node_id, script, auth, **fields)
        await node.start()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        await node.stop()


# ---- outcome unknown or certainly not applied ----------------------------------------------
NOT_APPLIED = {
    "not leader": always(Status.NOT_LEADER),
    "dropped": always(Status.DROPPED),
    "not leader, then dropped": first_then(Status.NOT_LEADER, Status.DROPPED),
}
MAYBE_APPLIED = {
    "silent": always(Act.SILENT),
    "silent once, then not leader": first_then(Act.SILENT, Status.NOT_LEADER),
    "hangs up once, then not leader": first_then(Act.HANG_UP, Status.NOT_LEADER),
    "in doubt once, then not leader": first_then(Status.IN_DOUBT, Status.NOT_LEADER),
}


@pytest.mark.parametrize("script", NOT_APPLIED.values(), ids=NOT_APPLIED.keys())
async def test_a_command_no_node_logged_is_unavailable(fake: Any, script: Script) -> None:
    node = await fake(1, script)
    client = quick_client(node.address)
    with pytest.raises(Unavailable) as raised:
        await client.propose(b"x")
    await client.close()
    error = raised.value
    assert not isinstance(error, OutcomeUnknown) and isinstance(error, ClientError)
    assert node.requests >= 2, "the client retries until the deadline"
    assert error.last_address == node.address
    assert error.last_error.startswith(f"127.0.0.1:{node.address[1]}: ")
    assert "was not applied" in str(error)


@pytest.mark.parametrize("script", MAYBE_APPLIED.values(), ids=MAYBE_APPLIED.keys())
async def test_a_command_a_node_may_have_logged_is_outcome_unknown(fake: Any, script: Script) -> None:
    node = await fake(1, script)
    client = quick_client(node.address)
    with pytest.raises(OutcomeUnknown) as raised:
        await client.propose(b"x")
    await client.close()
    error = raised.value
    assert node.requests >= 2, "later attempts answered, and cannot undo the doubt of the first"
    assert error.reached == node.address and error.last_address == node.address
    assert "may or may not have been applied" in str(error)
    assert "same idempotency key" in str(error)


async def test_a_timeout_says_where_the_command_went_and_how_long_it_waited(fake: Any) -> None:
    node = await fake(1, first_then(Act.SILENT, Status.NOT_LEADER))
    client = quick_client(node.address)
    with pytest.raises(OutcomeUnknown) as raised:
        await client.propose(b"x")
    await client.close()
    message = str(raised.value)
    assert message.startswith(f"outcome unknown: the command reached 127.0.0.1:{node.address[1]} and no answer came"
                              " within 0.05 s")
    assert raised.value.last_error == f"127.0.0.1:{node.address[1]}: NOT_LEADER"


async def test_no_connection_is_unavailable() -> None:
    (port,) = free_ports(1)
    client = quick_client(("127.0.0.1", port))
    with pytest.raises(Unavailable) as raised:
        await client.propose(b"x")
    await client.close()
    assert raised.value.last_address == ("127.0.0.1", port)
    assert "cannot connect" in raised.value.last_error


async def test_one_node_in_doubt_among_refusals_is_outcome_unknown(fake: Any) -> None:
    refusing = await fake(1, always(Status.NOT_LEADER))
    silent = await fake(2, always(Act.SILENT))
    client = quick_client(refusing.address, silent.address)
    with pytest.raises(OutcomeUnknown) as raised:
        await client.propose(b"x")
    await client.close()
    assert raised.value.reached == silent.address
    assert refusing.requests >= 1


async def test_an_answer_after_a_timeout_is_the_answer(fake: Any) -> None:
    node = await fake(1, first_then(Act.SILENT, Status.OK))
    client = quick_client(node.address)
    assert await client.propose(b"x") == b"applied"
    await client.close()


async def test_a_refused_request_is_request_refused(fake: Any) -> None:
    node = await fake(1, always(Status.ERROR))
    client = quick_client(node.address)
    with pytest.raises(RequestRefused):
        await client.propose(b"x")
    await client.close()


@pytest.mark.parametrize(
    ("script", "expected"),
    [(always(Status.NOT_LEADER), Unavailable), (first_then(Act.SILENT, Status.NOT_LEADER), OutcomeUnknown)],
    ids=["not leader", "silent once, then not leader"],
)
async def test_reads_raise_the_same_classes(fake: Any, script: Script, expected: type[ClientError]) -> None:
    node = await fake(1, script)
    client = quick_client(node.address)
    with pytest.raises(expected) as raised:
        await client.read(b"q")
    await client.close()
    assert str(raised.value).split(":")[0] in ("unavailable", "outcome unknown")
    assert " the read " in str(raised.value)


# ---- which addresses client traffic goes to -------------------------------------------------
async def test_peer_addresses_in_a_status_answer_are_not_used(fake: Any) -> None:
    """A node's "addresses" are where peers reach it; a client may have no route there. The trap
    stands at node 2's peer address and would answer OK: the client must never call it."""
    trap = await fake(2, always(Status.OK))
    follower = await fake(1, always(Status.NOT_LEADER), leader_hint=2)
    follower.status_fields = {"addresses": {"1": "127.0.0.1:1", "2": f"127.0.0.1:{trap.address[1]}"}}
    client = quick_client(follower.address)
    with pytest.raises(Unavailable) as raised:
        await client.propose(b"x")
    await client.close()
    assert trap.connections == 0
    assert "the leader is node 2, and no address for clients is known for it" in raised.value.last_error


async def test_a_leader_hint_goes_to_the_advertised_client_address(fake: Any) -> None:
    trap = await fake(2, always(Status.OK))
    leader = await fake(2, always(Status.OK))
    follower = await fake(1, always(Status.NOT_LEADER), leader_hint=2)
    follower.status_fields = {
        "addresses": {"1": "127.0.0.1:1", "2": f"127.0.0.1:{trap.address[1]}"},
        "client_addresses": {"2": f"localhost:{leader.address[1]}"},
    }
    client = patient_client(follower.address)
    assert await client.propose(b"x") == b"applied"
    await client.close()
    assert (leader.requests, trap.connections, client.redirects) == (1, 0, 1)


async def test_a_status_of_an_address_the_client_was_not_given_teaches_nothing(fake: Any) -> None:
    other = await fake(2, always(Status.OK))
    follower = await fake(1, always(Status.NOT_LEADER), leader_hint=2)
    client = quick_client(follower.address)
    await client.status(other.address)  # an operator looking: not an address to send commands to
    with pytest.raises(Unavailable):
        await client.propose(b"x")
    await client.close()
    assert other.requests == 0


# ---- frames written at once, and the coalescer that uses them ---------------------------------
async def test_send_many_has_its_answer_like_propose_many(fake: Any) -> None:
    node = await fake(1, always(Status.OK))
    client = patient_client(node.address)
    assert await client.propose_many([b"warm"]) == [b"applied"]  # the leader is known and connected
    proposal = client.send_many([b"a", b"b", b"c"])
    assert proposal.sent is not None, "the first attempt is written by send_many itself"
    assert await client.results(proposal) == [b"applied"] * 3
    assert node.frames == [1, 3]
    await client.close()


async def test_send_many_before_any_connection_makes_its_attempt_in_results(fake: Any) -> None:
    node = await fake(1, always(Status.OK))
    client = patient_client(node.address)
    proposal = client.send_many([b"a"])
    assert proposal.sent is None
    assert await client.results(proposal) == [b"applied"]
    await client.close()


@pytest.mark.parametrize(
    ("then", "expected"),
    [(Act.SILENT, OutcomeUnknown), (Act.HANG_UP, OutcomeUnknown), (Status.NOT_LEADER, Unavailable)],
    ids=["silent", "hangs up", "not leader"],
)
async def test_a_frame_send_many_wrote_is_told_apart_as_any_other(
    fake: Any, then: Status | Act, expected: type[ClientError]
) -> None:
    node = await fake(1, first_then(Status.OK, then))
    client = quick_client(node.address)
    await client.propose_many([b"warm"])
    proposal = client.send_many([b"a"])
    assert proposal.sent is not None
    with pytest.raises(expected):
        await client.results(proposal)
    await client.close()


@pytest.mark.parametrize(("burst", "frames"), [(5, [5]), (30, [30]), (2500, [1024, 1024, 452])])
async def test_the_queue_coalescer_sends_an_iteration_s_commands_in_frames_of_at_most_its_limit(
    fake: Any, burst: int, frames: list[int]
) -> None:
    """queues.client's coalescer, through send_many: one frame per iteration (up to the limit)."""
    node = await fake(1, always(Status.OK))
    client = patient_client(node.address)
    await client.propose_many([b"warm"])
    coalescer = _Coalescer(client, COALESCE_COMMANDS_MAX)
    results = await asyncio.gather(*(coalescer.submit(b"c%d" % i, True) for i in range(burst)))
    assert results == [b"applied"] * burst
    assert node.frames[1:] == frames
    await client.close()


async def until_frames(node: FakeNode, count: int) -> None:
    for _ in range(500):
        if len(node.frames) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} frames expected, {node.frames} came")


async def gated_coalescer(
    fake: Any, hold_max_s: float
) -> tuple[FakeNode, asyncio.Event, RaftClient, _Coalescer]:
    """A coalescer on a connected client whose node answers proposals only once the gate is set."""
    node = await fake(1, always(Status.OK))
    client = patient_client(node.address)
    await client.propose_many([b"warm"])
    node.gate = gate = asyncio.Event()
    return node, gate, client, _Coalescer(client, COALESCE_COMMANDS_MAX, hold_max_s=hold_max_s)


async def test_while_a_frame_is_at_the_store_the_next_commands_wait_for_its_answer_and_go_together(
    fake: Any,
) -> None:
    """The Nagle rule: nothing at the store, a command goes at once; a frame there, the commands
    submitted meanwhile (in separate iterations) go as one frame when its answer comes."""
    node, gate, client, coalescer = await gated_coalescer(fake, hold_max_s=30.0)
    first = asyncio.ensure_future(coalescer.submit(b"a", True))
    await until_frames(node, 2)  # sent at once: nothing of this client's was at the store
    held = []
    for data in (b"b", b"c", b"d"):
        held.append(asyncio.ensure_future(coalescer.submit(data, True)))
        await asyncio.sleep(0.02)
    assert node.frames == [1, 1], "held while the first frame waits for its answer"
    gate.set()
    assert await first == b"applied"
    assert await asyncio.gather(*held) == [b"applied"] * 3
    assert node.frames == [1, 1, 3]
    await client.close()


async def test_commands_are_held_behind_an_unanswered_frame_only_for_the_hold_s_bound(fake: Any) -> None:
    """A frame that waits on a retry or a stalled disk does not hold the next commands longer
    than `hold_max_s`: they go without its answer."""
    node, gate, client, coalescer = await gated_coalescer(fake, hold_max_s=0.05)
    first = asyncio.ensure_future(coalescer.submit(b"a", True))
    await until_frames(node, 2)
    second = asyncio.ensure_future(coalescer.submit(b"b", True))
    await until_frames(node, 3)  # the first is still unanswered: the hold ended
    assert not first.done()
    gate.set()
    assert [await first, await second] == [b"applied", b"applied"]
    await client.close()


async def test_calls_that_connect_at_once_share_one_connection_which_close_closes(fake: Any) -> None:
    """Several first calls at once (a worker's lanes start together) open one connection to a node,
    not one each with all but the last left open after `close` (a moved set's old client must close)."""
    node = await fake(1, always(Status.OK))
    client = patient_client(node.address)
    await asyncio.gather(*(client.read(b"q", linearizable=False) for _ in range(5)))
    assert node.connections == 1
    await client.close()
    for _ in range(50):
        if not node._serving:
            break
        await asyncio.sleep(0.01)
    assert not node._serving  # every connection it opened is closed


async def test_close_during_a_connect_leaves_no_connection_behind() -> None:
    """A node that accepts but never finishes the handshake: `close` while a call is connecting
    cancels the connect and the socket is closed (the node reads end of file), not left open."""
    accepted: list[asyncio.Future[bytes]] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung_up = asyncio.get_running_loop().create_future()
        accepted.append(hung_up)
        while chunk := await reader.read(65536):  # the client's hello, then nothing until it hangs up
            pass
        hung_up.set_result(chunk)
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()[:2]
    client = patient_client(address)
    call = asyncio.ensure_future(client.status(address))
    try:
        for _ in range(200):
            if accepted:
                break
            await asyncio.sleep(0.01)
        assert accepted and not call.done()  # connected, the handshake pending
        await client.close()
        assert await asyncio.wait_for(accepted[0], 5.0) == b""  # the client's socket is closed
        with pytest.raises((asyncio.CancelledError, ClientError)):
            await asyncio.wait_for(call, 5.0)
        assert not client._connecting and not client._conns
    finally:
        call.cancel()
        server.close()
        await server.wait_closed()
