"""`compensator status` against a real store: the health, depth and breaker picture the on-call
engineer reads, its exit code, and one line when nothing answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from compensator import cli
from ledger import migrate, pg
from queues import QueueClient, RaftClient
from queues.model import Enqueue
from queues.replicated import machine_factory
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.inprocess import StoreThread, running_store
from raft_store.testing.processes import free_ports
from services.projector import ledger_writer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreThread]:
    with running_store(tmp_path / "store", machine_factory) as thread:
        yield thread


async def _traffic(store: StoreThread) -> None:
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key=f"t{i}", ref_key=f"r{i}", payload=b"p")
                                  for i in range(3)])  # fmt: skip
        await queue.enqueue_many(
            [Enqueue(kind="callback", idempotency_key="c", ref_key="c", payload=b"p", delay_ms=60_000)]
        )
        (grant,) = (await queue.lease("w", count_max=1, lease_ms=30_000, kinds=("transfer",))).grants
        await queue.ack(grant.message_id, grant.token)
        await queue.pause("transfer", "breaker:payment", "payment answered 503 to 60% of 50 calls")
        await queue.pause("callback", "ops:alice", "target rotating its keys")
    finally:
        await queue.raft.close()


def status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], addresses: str, *args: str, secret: Path
) -> tuple[int, str, str]:
    monkeypatch.setenv("COMPENSATOR_STORE__ADDRESSES", addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__SECRET_FILE", str(secret))
    monkeypatch.setenv("COMPENSATOR_STORE__DEADLINE_S", "1.0")
    monkeypatch.delenv("COMPENSATOR_CONFIG", raising=False)
    code = cli.main(["status", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_healthy_set_shows_its_leader_depths_and_breakers(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store.run(_traffic(store))
    code, out, err = status(monkeypatch, capsys, store.addresses, "--json", secret=store.secret_file)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["healthy"], report["leader"]) == (True, 1)
    assert [(row["node"], row["role"], row["lag"]) for row in report["nodes"]] == [(1, "leader", 0)]
    assert report["depth"]["transfer"] == {"delayed": 0, "ready": 2, "leased": 0, "done": 1, "dead": 0, "discarded": 0}
    assert report["depth"]["callback"]["delayed"] == 1
    assert report["paused"] == {"callback": ["ops:alice"], "transfer": ["breaker:payment"]}
    breakers = {b["downstream"]: b for b in report["breakers"]}
    assert breakers["payment"]["state"] == "open" and "503" in breakers["payment"]["reason"]
    assert breakers["callback"]["state"] == "closed"  # an operator's pause is not the breaker

    code, out, err = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("store: leader node 1, term ")
    transfer = next(line for line in lines if line.startswith("transfer "))
    assert transfer.split()[1:7] == ["0", "2", "0", "1", "0", "0"] and transfer.endswith("breaker:payment")
    assert any(line.startswith("breaker payment") and "OPEN for" in line for line in lines)


def test_a_node_down_is_shown_and_fails_the_check(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = free_ports(1)[0]
    code, out, err = status(monkeypatch, capsys, f"{store.addresses},127.0.0.1:{dead}", secret=store.secret_file)
    assert code == 1 and err == ""
    assert any(f"127.0.0.1:{dead}" in line and "DOWN" in line for line in out.splitlines()), out
    assert "(UNHEALTHY)" in out.splitlines()[0]


def test_nothing_answering_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = free_ports(2)
    secret = cluster_auth(tmp_path).secrets.path
    code, out, err = status(monkeypatch, capsys, ",".join(f"127.0.0.1:{p}" for p in ports), secret=secret)
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("compensator status: error: no store node answered"), err


def test_the_projector_and_the_publisher_are_shown_with_their_lag(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store.run(_traffic(store))

    async def publisher_at(cursor: int) -> None:
        queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
        try:
            body = json.dumps({"v": 1, "holder": "pub-a", "cursor": cursor, "lease_ms": 60_000}).encode()
            await queue.put_document("kafka_publisher", "compensator.events", body, actor="events-publish")
        finally:
            await queue.raft.close()

    store.run(publisher_at(3))
    with pg.temporary_server() as server:
        migrate.apply(server.dsn)

        async def sql(statement: str) -> None:
            connection = await asyncpg.connect(server.dsn)
            try:
                await connection.execute(statement)
            finally:
                await connection.close()

        asyncio.run(sql("INSERT INTO projector_cursors (set_id, last_seq, owner) VALUES (1, 2, 'proj-a')"))
        monkeypatch.setenv("COMPENSATOR_PG_DSN", server.dsn)
        _, unheld, _ = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
        with holding_projector_lock(server.dsn, 1):  # a projector's session holds set 1's lock
            code, out, err = status(monkeypatch, capsys, store.addresses, "--json", secret=store.secret_file)
            text_code, text, _ = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
            asyncio.run(sql("UPDATE projector_cursors SET owner = ''"))
            _, unwritten, _ = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
            asyncio.run(sql("UPDATE projector_cursors SET owner = 'proj-a'"))
        asyncio.run(sql("UPDATE projector_cursors SET stopped_at = now(),"
                        " stopped_reason = 'set 1: projection stopped at event 2: a gap'"))  # fmt: skip
        stopped_code, stopped_out, _ = status(monkeypatch, capsys, store.addresses, "--json", secret=store.secret_file)
        _, stopped_text, _ = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
    assert (code, err, text_code) == (0, "", 0)
    report = json.loads(out)
    last = report["last_event_seq"]
    assert last > 3
    publisher, projector = report["followers"]
    assert (publisher["cursor"], publisher["lag_events"], publisher["holder"]) == (3, last - 3, "pub-a")
    assert (projector["cursor"], projector["lag_events"], projector["holder"]) == (2, last - 2, "proj-a")
    assert f"ledger projector: cursor 2, {last - 2} behind (proj-a)" in text and projector["lock_held"] is True
    # The cursor row's owner is the last writer; whether a projector holds the lock now is read apart.
    assert f"ledger projector: cursor 2, {last - 2} behind (last written by proj-a; no projector holds its lock)" in unheld
    assert f"ledger projector: cursor 2, {last - 2} behind (a projector holds its lock; nothing written yet)" in unwritten
    assert projector["stopped"] is None and "STOPPED" not in text
    # A set whose projection stopped on a gap or a ledger that disagrees (docs/ledger.md) says so.
    assert json.loads(stopped_out)["followers"][1]["stopped"] == "set 1: projection stopped at event 2: a gap"
    assert "    STOPPED: set 1: projection stopped at event 2: a gap" in stopped_text.splitlines()
    assert stopped_code == 0, "the store's health, not the ledger's"


def test_a_projector_without_a_database_is_named_not_fatal(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("COMPENSATOR_PG_DSN", raising=False)
    monkeypatch.setenv("COMPENSATOR_LOCAL__DATA_DIR", str(tmp_path / "local"))
    code, out, _ = status(monkeypatch, capsys, store.addresses, "--json", secret=store.secret_file)
    assert code == 0
    (projector,) = json.loads(out)["followers"]
    assert projector["cursor"] is None and "COMPENSATOR_PG_DSN" in projector["error"]


def test_what_others_typed_is_printed_escaped_never_raw(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A holder and a reason with terminal escape codes and a bidi override (stored before holders
    were checked, or by anything that reaches the store): `status` shows them escaped, as text and
    as JSON that still parses to the stored value."""
    holder, reason = "\x1b]0;owned\x07\x1b[2Jops\u202eecila", "disk \x9b31m full\u200b"

    async def pause() -> None:
        queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
        try:
            await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="t", ref_key="r", payload=b"p")])
            await queue.pause("transfer", holder, reason)
            await queue.pause("callback", "breaker:callback", reason)
        finally:
            await queue.raft.close()

    store.run(pause())
    code, out, err = status(monkeypatch, capsys, store.addresses, secret=store.secret_file)
    assert code == 0 and err == ""
    raw = [c for c in out if c not in "\n\t" and (ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u200b")]
    assert raw == []
    assert "\\u001b]0;owned\\u0007\\u001b[2Jops\\u202eecila" in out and "disk \\u009b31m full\\u200b" in out
    code, out, err = status(monkeypatch, capsys, store.addresses, "--json", secret=store.secret_file)
    assert code == 0 and "\x1b" not in out and "\u202e" not in out and "\x9b" not in out
    report = json.loads(out)
    assert report["paused"]["transfer"] == [holder]
    assert next(b for b in report["breakers"] if b["downstream"] == "callback")["reason"] == reason


@contextlib.contextmanager
def holding_projector_lock(dsn: str, set_id: int) -> Iterator[None]:
    """A session of its own (on a thread with its own loop) holds the set's projector lock."""
    taken, release = threading.Event(), threading.Event()

    async def hold() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            if await ledger_writer.try_lock(connection, set_id):  # the projector's own lock, as it takes it
                taken.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
        finally:
            await connection.close()

    thread = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    thread.start()
    try:
        assert taken.wait(10), "could not take the projector lock"
        yield
    finally:
        release.set()
        thread.join(10)
