"""Who may talk to a node, on real node processes: only a holder of the cluster secret, on the
client and the peer side of the port alike; a refusal is logged (never the secret) and counted; a
recorded handshake proves nothing when replayed; TLS carries it all end to end; and the secret is
rotated node by node while the cluster keeps committing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raft_store.auth import StoreAuth, TlsFiles, new_secret, replace_secret_file, write_secret_file
from raft_store.client import AuthenticationFailed, ClientError, RaftClient, Unavailable
from raft_store.codec import HELLO_MAGIC, FrameType, frame
from raft_store.handshake import DialerHandshake, HandshakeFailed
from raft_store.testing.credentials import accept_dialer, certificates, cluster_auth
from raft_store.testing.processes import ProcessCluster
from raft_store.transport import dial, read_frame

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """Three counter nodes, their peer links authenticated as everything else is."""
    nodes = ProcessCluster(tmp_path_factory.mktemp("auth"), machine="counter")
    nodes.start_all()
    try:
        yield nodes
    finally:
        nodes.stop_all()


async def _committing(client: RaftClient, cluster: ProcessCluster) -> None:
    await cluster.wait_leader(client)
    before = json.loads((await client.read(b""))[0])["count"]
    await client.propose(b"x")
    assert json.loads((await client.read(b""))[0])["count"] == before + 1


async def _refused(cluster: ProcessCluster, node: int) -> dict[str, int]:
    client = RaftClient([cluster.address(node)], auth=cluster.auth, deadline_s=5)
    try:
        refused: dict[str, int] = (await client.status(cluster.address(node)))["metrics"]["refused"]
        return refused
    finally:
        await client.close()


async def _exchange(address: tuple[str, int], hello: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                                        FrameType, bytes]:  # fmt: skip
    reader, writer = await asyncio.open_connection(*address)
    writer.write(hello)
    kind, body = await asyncio.wait_for(read_frame(reader), 5)
    return reader, writer, kind, body


async def test_without_the_secret_no_client_and_no_peer_gets_in_and_each_refusal_is_counted(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    client = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=20)
    try:
        await _committing(client, cluster)  # the peers' links, authenticated, carry the log
    finally:
        await client.close()
    before = await _refused(cluster, 1)

    # A client with another secret: refused at once, not retried until its deadline.
    stranger = cluster_auth(tmp_path, name="other.secret")
    outsider = RaftClient([cluster.address(1)], auth=stranger, deadline_s=20)
    started = time.monotonic()
    try:
        with pytest.raises(AuthenticationFailed, match="refused this connection"):
            await outsider.propose(b"mint an admin token")
    finally:
        await outsider.close()
    assert time.monotonic() - started < 5

    # A "peer" (node id 2) with another secret, and one naming our secret's id with a forged proof.
    key = stranger.secrets.presented()
    reader, writer, kind, _ = await _exchange(cluster.address(1), DialerHandshake(key, 2, 1).hello())
    assert kind is FrameType.REFUSED and await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    ours = cluster.auth.secrets.presented()
    reader, writer, kind, _ = await _exchange(cluster.address(1), DialerHandshake(ours, 2, 1).hello())
    assert kind is FrameType.CHALLENGE
    writer.write(frame(FrameType.AUTH, b"\x00" * 32))
    assert (await asyncio.wait_for(read_frame(reader), 5))[0] is FrameType.REFUSED
    writer.close()
    # An old client that sends no handshake at all, straight to a command.
    reader, writer, kind, _ = await _exchange(cluster.address(1), frame(FrameType.HELLO, b"RSTR\x01" + b"\x00" * 16))
    assert kind is FrameType.REFUSED
    writer.close()
    # A node of version 2 (the handshake without the clock trailer), otherwise well formed.
    hello = DialerHandshake(ours, 2, 1).hello()
    version_2 = hello.replace(HELLO_MAGIC, b"RSTR\x02", 1)
    assert version_2 != hello
    reader, writer, kind, _ = await _exchange(cluster.address(1), version_2)
    assert kind is FrameType.REFUSED
    writer.close()

    after = await _refused(cluster, 1)
    grown = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    assert grown["unknown_secret"] >= 2 and grown["bad_proof"] == 1 and grown["version"] == 2, grown
    log = (cluster.root / "node1.log").read_text()
    assert "refused the connection from ('127.0.0.1'," in log and "presented a cluster secret" in log
    secret_text = (cluster.root / "cluster.secret").read_text().strip()
    assert secret_text not in log and (tmp_path / "other.secret").read_text().strip() not in log


async def test_a_recorded_handshake_replayed_on_a_new_connection_is_refused(cluster: ProcessCluster) -> None:
    address = cluster.address(2)
    key = cluster.auth.secrets.presented()
    recorded = DialerHandshake(key, 0, 1)
    hello = recorded.hello()
    reader, writer, kind, body = await _exchange(address, hello)
    auth = recorded.on_challenge(kind, body)
    writer.write(auth)
    assert (await asyncio.wait_for(read_frame(reader), 5))[0] is FrameType.WELCOME  # the original got in
    writer.close()
    challenge = frame(kind, body)
    before = await _refused(cluster, 2)

    # The eavesdropper replays the dialer's side: the node's fresh nonce makes the old proof wrong.
    reader, writer, kind, _ = await _exchange(address, hello)
    assert kind is FrameType.CHALLENGE
    writer.write(auth)
    assert (await asyncio.wait_for(read_frame(reader), 5))[0] is FrameType.REFUSED
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert (await _refused(cluster, 2)).get("bad_proof", 0) == before.get("bad_proof", 0) + 1

    # And the node's side, replayed to a new dialer (a node impostor): the dialer's fresh nonce.
    with pytest.raises(HandshakeFailed, match="could not prove"):
        DialerHandshake(key, 0, 1).on_challenge(FrameType.CHALLENGE, challenge[5:])


async def test_a_client_leaves_a_node_that_cannot_prove_it_holds_the_secret(tmp_path: Path) -> None:
    auth = cluster_auth(tmp_path)

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        writer.write(frame(FrameType.CHALLENGE, os.urandom(64)))  # a nonce and a proof it cannot make
        await reader.read()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()[:2]
    client = RaftClient([address], auth=auth, deadline_s=5)
    try:
        with pytest.raises(AuthenticationFailed, match="could not prove it holds the cluster secret"):
            await client.propose(b"secret payload")
    finally:
        await client.close()
        server.close()


async def test_tls_carries_clients_and_peers_and_refuses_who_has_no_certificate_of_the_ca(tmp_path: Path) -> None:
    tls = certificates(tmp_path / "tls")
    rogue = certificates(tmp_path / "rogue", name="rogue")
    cluster = ProcessCluster(tmp_path / "nodes", machine="counter", tls=tls)
    cluster.start_all()
    client = RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=20)
    try:
        await _committing(client, cluster)  # client and peer traffic, all over TLS
        plain = RaftClient([cluster.address(1)], auth=StoreAuth(cluster.auth.secrets), deadline_s=1.5)
        with pytest.raises(Unavailable):  # the secret without TLS: the node's TLS refuses the bytes
            await plain.propose(b"x")
        await plain.close()
        other_ca = StoreAuth(cluster.auth.secrets, TlsFiles(ca=rogue.ca, cert=rogue.cert, key=rogue.key))
        outsider = RaftClient([cluster.address(1)], auth=other_ca, deadline_s=5)
        with pytest.raises(AuthenticationFailed, match="TLS certificate is not one we trust"):
            await outsider.propose(b"x")
        await outsider.close()
        # A client trusting our CA but holding the rogue CA's certificate: the node refuses it.
        mixed = StoreAuth(cluster.auth.secrets, TlsFiles(ca=tls.ca, cert=rogue.cert, key=rogue.key))
        stranger = RaftClient([cluster.address(1)], auth=mixed, deadline_s=1.5)
        with pytest.raises(ClientError):
            await stranger.propose(b"x")
        await stranger.close()
        refused = (await client.status(cluster.address(1)))["metrics"]["refused"]
        assert refused.get("tls", 0) >= 2, refused
        await _committing(client, cluster)
    finally:
        await client.close()
        cluster.stop_all()


async def test_the_secret_is_rotated_node_by_node_while_the_cluster_keeps_committing(tmp_path: Path) -> None:
    old, new = new_secret(), new_secret()
    cluster = ProcessCluster(tmp_path / "nodes", machine="counter")
    files = {node: tmp_path / f"node{node}.secret" for node in cluster.ids}
    for path in files.values():
        write_secret_file(path, old)
    for node in cluster.ids:
        cluster.start(node, "--secret-file", str(files[node]))
    write_secret_file(tmp_path / "old-client.secret", old)
    write_secret_file(tmp_path / "new-client.secret", new, old)
    old_client = RaftClient(cluster.addresses(), auth=StoreAuth.from_files(tmp_path / "old-client.secret"), deadline_s=20)
    new_client = RaftClient(cluster.addresses(), auth=StoreAuth.from_files(tmp_path / "new-client.secret"), deadline_s=20)
    committed: list[int] = []
    stop = asyncio.Event()

    async def keep_writing(client: RaftClient) -> None:
        while not stop.is_set():
            await client.propose(b"x")  # a failure fails the test: the cluster must keep committing
            committed.append(1)
            await asyncio.sleep(0.01)

    try:
        await cluster.wait_leader(old_client, timeout_s=20)
        writer = asyncio.create_task(keep_writing(old_client))
        early = RaftClient([cluster.address(1)], auth=new_client.auth, deadline_s=5)
        with pytest.raises(AuthenticationFailed):  # the next secret is not accepted yet
            await early.propose(b"x")
        await early.close()

        # 1. Each node accepts the next secret beside the current one: a rolling restart.
        for node in cluster.ids:
            replace_secret_file(files[node], old, new)
            cluster.kill(node, signal.SIGTERM)
            cluster.start(node, "--secret-file", str(files[node]))
            await cluster.wait_leader(old_client, timeout_s=20)
            await _caught_up(committed)
        assert await new_client.propose(b"x") == b""  # now a client presenting the next one gets in

        # 2. Each node presents the next secret to its peers; no restart: the file is read again.
        for node in cluster.ids:
            replace_secret_file(files[node], new, old)
            await _caught_up(committed)

        # 3. The old secret is dropped, node by node: new connections with it are refused.
        stop.set()
        await writer
        writer = asyncio.create_task(keep_writing(new_client))
        stop.clear()
        for node in cluster.ids:
            replace_secret_file(files[node], new)
            await _caught_up(committed)
        for node in cluster.ids:  # a peer restarted now needs the new secret to rejoin
            cluster.kill(node, signal.SIGTERM)
            cluster.start(node, "--secret-file", str(files[node]))
            await cluster.wait_leader(new_client, timeout_s=20)
            await _caught_up(committed)
        late = RaftClient(cluster.addresses(), auth=StoreAuth.from_files(tmp_path / "old-client.secret"), deadline_s=5)
        with pytest.raises(AuthenticationFailed):
            await late.propose(b"x")
        await late.close()
        stop.set()
        await writer
        assert len(committed) > 20
    finally:
        stop.set()
        await old_client.close()
        await new_client.close()
        cluster.stop_all()


async def _caught_up(committed: list[int], more: int = 5, timeout_s: float = 20.0) -> None:
    """The writer commits `more` commands after this point (the cluster is not stuck)."""
    target = len(committed) + more
    deadline = time.monotonic() + timeout_s
    while len(committed) < target:
        assert time.monotonic() < deadline, "the cluster stopped committing"
        await asyncio.sleep(0.02)


async def test_accept_dialer_is_the_node_side_of_the_same_handshake(tmp_path: Path) -> None:
    """The test doubles' node side (raft_store/testing) speaks exactly what the transport's dialer expects."""
    auth = cluster_auth(tmp_path)
    senders: list[int] = []

    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        senders.append(await accept_dialer(reader, writer, auth))
        writer.close()

    server = await asyncio.start_server(node, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    await dial(reader, writer, DialerHandshake(auth.secrets.presented(), 7, 1))
    writer.close()
    server.close()
    assert senders == [7]
