"""``compensator node`` from the one configuration: the set is `[store] addresses` (node N the N-th,
`store.peer_addresses` where the nodes talk on a network of their own), written once for the
nodes and their clients; its own settings are `[node]`; flags override both; the old `--peer`
flags still say who the peers are; a JSON `--config` (raft_store's node file) is one line naming
the new way; and three nodes started from one TOML file elect a leader a client of the same file
writes to, then stop on SIGTERM with status 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compensator import cli
from compensator.config import ConfigError, load
from compensator.shell import ProcessError
from compensator.store import queue_client
from compensator.wiring.node import node_config
from queues import Enqueue
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


def _environ(tmp_path: Path, **more: str) -> dict[str, str]:
    auth = cluster_auth(tmp_path)
    return {"COMPENSATOR_STORE__ADDRESSES": "store1:7000,store2:7000,store3:7000",
            "COMPENSATOR_STORE__SECRET_FILE": str(auth.secrets.path), **more}  # fmt: skip


def test_a_node_takes_its_set_from_the_store_section(tmp_path: Path) -> None:
    environ = _environ(tmp_path, COMPENSATOR_STORE__PEER_ADDRESSES="store1-peer:7000,store2-peer:7000,store3-peer:7000",
                       COMPENSATOR_NODE__ID="2", COMPENSATOR_NODE__LISTEN="0.0.0.0:7000")  # fmt: skip
    settings = node_config(load(None, environ))
    assert settings.node_id == 2 and settings.listen == ("0.0.0.0", 7000)
    assert settings.peers == {n: (f"store{n}-peer", 7000) for n in (1, 2, 3)}
    assert settings.client_addresses == {n: (f"store{n}", 7000) for n in (1, 2, 3)}
    assert settings.initial_voters == {1, 2, 3} and settings.data_dir == Path("var/node2")
    assert settings.auth.secrets.path == Path(environ["COMPENSATOR_STORE__SECRET_FILE"])

    alone = node_config(load(None, _environ(tmp_path, COMPENSATOR_NODE__ID="3")))  # one network: peers are clients'
    assert alone.listen == ("store3", 7000) and alone.peers == alone.client_addresses
    joining = node_config(load(None, _environ(tmp_path, COMPENSATOR_NODE__ID="3", COMPENSATOR_NODE__JOIN="true")))
    assert joining.initial_voters == frozenset()
    legacy = node_config(load(None, _environ(tmp_path, COMPENSATOR_NODE__ID="5")),
                         peers={5: ("10.0.0.5", 7100), 6: ("10.0.0.6", 7100)})  # fmt: skip
    assert (legacy.listen, legacy.initial_voters, legacy.client_addresses) == (("10.0.0.5", 7100), {5, 6}, {})

    with pytest.raises(ProcessError, match=r"^no node id: give --id \(or node.id\)"):
        node_config(load(None, _environ(tmp_path)))
    with pytest.raises(ProcessError, match=r"^node 4 is not in store.addresses \(3 nodes\)"):
        node_config(load(None, _environ(tmp_path, COMPENSATOR_NODE__ID="4")))
    with pytest.raises(ConfigError, match=r"COMPENSATOR_STORE__PEER_ADDRESSES: store.peer_addresses: one per node"):
        load(None, _environ(tmp_path, COMPENSATOR_STORE__PEER_ADDRESSES="a:1,b:2"))


def test_flags_override_the_configuration_and_a_json_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _environ(tmp_path).items():
        monkeypatch.setenv(name, value)
    old = tmp_path / "node1.json"
    old.write_text(json.dumps({"id": 1, "peers": {"1": "127.0.0.1:7101"}}))
    assert cli.main(["node", "--config", str(old)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"compensator node: error: {old} is a JSON node file: `compensator node --config` reads the"
                           " service's TOML configuration, the set in [store] addresses and this node in [node]")  # fmt: skip
    assert cli.main(["node", "--id", "2", "--tick-ms", "0"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "compensator node: --tick-ms: node.tick_ms: must be in 1..10000"
    assert cli.main(["node", "--id", "9"]) == 1
    assert capsys.readouterr().err.strip() == (
        "compensator node: error: node 9 is not in store.addresses (3 nodes): give its place there, or --listen (and --join)")


def test_a_data_directory_of_the_sql_store_is_refused_in_one_line(tmp_path: Path) -> None:
    """A node of this version never opens an empty store beside an older version's SQL store: it
    stops at once, saying how to convert it (docs/queue.md, upgrading from the SQL store). In a
    process of its own: the node's shell installs uvloop and its logging."""
    data = tmp_path / "node1"
    data.mkdir(mode=0o700)
    (data / "queue.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(84))
    environ = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    environ.update(_environ(tmp_path), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "compensator", "node", "--id", "1", "--data", str(data)],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"compensator node: error: {data / 'queue.sqlite'} is a queue store of the SQL layout")
    assert f"python -m queues.migrate {data}" in line
    assert sorted(path.name for path in data.iterdir()) == ["queue.sqlite"]


def test_three_nodes_from_one_file_serve_a_client_of_the_same_file(tmp_path: Path) -> None:
    ports = free_ports(3)
    auth = cluster_auth(tmp_path)
    settings = tmp_path / "service.toml"
    settings.write_text(f"[store]\naddresses = {json.dumps([f'127.0.0.1:{port}' for port in ports])}\n"
                        f"secret_file = {json.dumps(str(auth.secrets.path))}\n[node]\ntick_ms = 20\n")  # fmt: skip
    environ = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    nodes = [
        subprocess.Popen([sys.executable, "-m", "compensator", "node", "--config", str(settings), "--id", str(node),
                          "--data", str(tmp_path / f"node{node}")],
                         cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (1, 2, 3)
    ]  # fmt: skip
    try:
        config = load(settings, {})  # the client reads the same [store] addresses as the nodes

        async def write() -> int:
            queue = queue_client(config)
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        result = await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="k1",
                                                                   ref_key="r1", payload=b"{}")])  # fmt: skip
                        return len(result)
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
            finally:
                await queue.raft.close()

        assert asyncio.run(write()) == 1
    finally:
        for process in nodes:
            process.send_signal(signal.SIGTERM)
        outcomes = [(process.wait(30), process.stderr.read() if process.stderr else "") for process in nodes]
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
