"""Several nodes in one process (raft_store/hosting.py): each group served on the one loop; a storage
failure of one hosted replica stops every replica of the process with exit 1 and a last line that
names the failed replica's group, the healthy ones stopping cleanly; `raft-store host` refuses two
replicas that share a data directory in one line, before any directory is made."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from raft_store.client import RaftClient
from raft_store.hosting import Replica, run_nodes
from raft_store.log_context import GroupTag
from raft_store.machines import CounterMachine
from raft_store.node_config import NodeConfig
from raft_store.state_machine import Command
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports


class FailingDisk(CounterMachine):
    """Counts commands; the command `boom` meets a disk that reports an I/O error."""

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True) -> list[bytes]:
        if any(command.data == b"boom" for command in commands):
            raise OSError(errno.EIO, "Input/output error")
        return super().apply_batch(index, now_ms, commands, respond=respond)


async def test_one_replicas_storage_failure_stops_the_host_and_its_line_names_the_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = cluster_auth(tmp_path)
    ports = free_ports(2)
    configs = [NodeConfig(node_id=1, data_dir=tmp_path / f"group{i}", listen=("127.0.0.1", port),
                          peers={1: ("127.0.0.1", port)}, auth=auth, initial_voters=frozenset({1}), tick_ms=10)
               for i, port in enumerate(ports)]  # fmt: skip
    healthy, failing = CounterMachine(), FailingDisk()
    host = asyncio.create_task(run_nodes([Replica(configs[0], healthy, "set 1"), Replica(configs[1], failing, "set 2")],
                                         stop=asyncio.Event()))  # fmt: skip
    clients = [RaftClient([("127.0.0.1", port)], auth=auth, deadline_s=20) for port in ports]
    try:
        for client in clients:  # each group is served, each by its own node
            assert await client.propose(b"one") == b""
            answer, applied = await client.read(b"")
            assert json.loads(answer) == {"count": 1, "applied": applied}
        clients.append(RaftClient([("127.0.0.1", ports[1])], auth=auth, attempt_timeout_s=0.5, deadline_s=1))
        with pytest.raises(Exception):  # noqa: B017 - the node stops before it answers
            await clients[2].propose(b"boom")
        assert await asyncio.wait_for(host, 20) == 1
    finally:
        for client in clients:
            await client.close()
        host.cancel()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("node 1 of set 2 stopped: the disk reported an I/O error ("), last
    with pytest.raises(OSError):  # the healthy replica stopped with its host: nothing listens any more
        await asyncio.open_connection("127.0.0.1", ports[0])


def test_raft_store_host_refuses_a_shared_data_directory_in_one_line(tmp_path: Path) -> None:
    auth = cluster_auth(tmp_path)
    ports = free_ports(2)
    files = []
    for i, port in enumerate(ports):
        path = tmp_path / f"replica{i}.json"
        path.write_text(json.dumps({"id": 1, "peers": {"1": f"127.0.0.1:{port}"}, "data_dir": str(tmp_path / "same"),
                                    "group": f"set {i + 1}"}))  # fmt: skip
        files += ["--replica", str(path)]
    bad = subprocess.run([sys.executable, "-m", "raft_store", "host", "--secret-file", str(auth.secrets.path), *files],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"raft-store: set 2 and set 1 share the data directory {tmp_path / 'same'}"
    assert not (tmp_path / "same").exists()


async def test_a_hosted_replicas_lines_and_threads_name_its_set(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two groups in one process, each with a peer 2 that answers the handshake with junk: the
    warning each replica's link logs starts with its set, and its threads carry the set in their
    names (an on-call engineer reading one host's log must know which replica said what)."""

    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4)
        await writer.drain()
        writer.close()

    caplog.handler.addFilter(GroupTag())
    caplog.set_level(logging.WARNING, logger="raft_store.transport")
    impostors = [await asyncio.start_server(junk, "127.0.0.1", 0) for _ in range(2)]
    auth = cluster_auth(tmp_path)
    ports = free_ports(2)
    configs = [NodeConfig(node_id=1, data_dir=tmp_path / f"group{i}", listen=("127.0.0.1", port), auth=auth,
                          peers={1: ("127.0.0.1", port), 2: impostors[i].sockets[0].getsockname()[:2]},
                          initial_voters=frozenset({1, 2}), tick_ms=10)
               for i, port in enumerate(ports)]  # fmt: skip
    stop = asyncio.Event()
    host = asyncio.create_task(run_nodes([Replica(configs[0], CounterMachine(), "set 1"),
                                          Replica(configs[1], CounterMachine(), "set 2")], stop=stop))  # fmt: skip
    try:
        for _ in range(500):  # each link logs the refusal once
            if {line[:8] for line in _messages(caplog) if " peer 2 at " in line} >= {"[set 1] ", "[set 2] "}:
                break
            await asyncio.sleep(0.01)
        lines = [line for line in _messages(caplog) if " peer 2 at " in line]
        for i, impostor in enumerate(impostors):
            port = impostor.sockets[0].getsockname()[1]
            assert any(line.startswith(f"[set {i + 1}] peer 2 at 127.0.0.1:{port}: ") for line in lines), lines
        names = {thread.name for thread in threading.enumerate()}
        assert {"wal-1 (set 1)", "wal-1 (set 2)"} <= names, names
    finally:
        stop.set()
        assert await asyncio.wait_for(host, 20) == 0
        for impostor in impostors:
            impostor.close()


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]
