"""``compensator node`` hosting replicas of several sets in one process (`node.replicas`,
docs/sets.md): three hosts, host i running node i of sets 1, 2 and 3, serve each set; set 2's
replicas, first run one process each, keep their data when moved into the hosts; kill -9 of one
host loses nothing acknowledged in any set and the other two keep every set writable; one metrics
page serves a host's replicas, each sample labelled with its set; a bad replica gives one line and
a non-zero exit before any data directory exists; `run --sets` gives set 1's nodes the rest."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from compensator import cli
from compensator.commands import node as node_command
from compensator.commands.run_sets import LocalSets
from compensator.config import load
from compensator.wiring.node import hosted_configs, node_config
from queues import Code, Enqueue, QueueClient, RaftClient
from raft_store.auth import StoreAuth
from raft_store.cli import parse_address
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


def _environ(auth: StoreAuth, addresses: list[str], set_id: int) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    environ.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   COMPENSATOR_STORE__SECRET_FILE=str(auth.secrets.path), COMPENSATOR_STORE__ADDRESSES=",".join(addresses),
                   COMPENSATOR_STORE__SET_ID=str(set_id), COMPENSATOR_NODE__TICK_MS="20")  # fmt: skip
    return environ


def _node(environ: dict[str, str], node: int, data: Path, log: Path, *more: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "compensator", "node", "--id", str(node), "--data", str(data), *more],
                            cwd=ROOT, env=environ, stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip


def _client(auth: StoreAuth, addresses: list[str]) -> QueueClient:
    return QueueClient(RaftClient([parse_address(a) for a in addresses], auth=auth, attempt_timeout_s=1.0, deadline_s=5.0))


async def _write(auth: StoreAuth, addresses: list[str], keys: list[str]) -> None:
    """Each key acknowledged (retried through elections for up to 30 s)."""
    queue = _client(auth, addresses)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                results = await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key=key, ref_key=key, payload=b"{}")
                                                    for key in keys])  # fmt: skip
                assert all(result.code in (Code.OK, Code.EXISTS) for result in results), results
                return
            except Exception:  # an election under way, a leader not known yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await queue.raft.close()


async def _keys(auth: StoreAuth, addresses: list[str], keys: list[str]) -> set[str]:
    """The keys the set holds, read through its leader."""
    queue = _client(auth, addresses)
    try:
        return {view.idempotency_key for view in (await queue.by_idempotency_keys(keys)).value}
    finally:
        await queue.raft.close()


def test_three_hosts_serve_three_sets_keep_a_moved_replicas_data_and_survive_one_host_killed(tmp_path: Path) -> None:
    auth = cluster_auth(tmp_path)
    ports = free_ports(10)
    sets = {k: [f"127.0.0.1:{port}" for port in ports[3 * (k - 1) : 3 * k]] for k in (1, 2, 3)}
    metrics = ["--metrics-address", f"127.0.0.1:{ports[9]}"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        # Set 2 first as it ran before: one process per replica.
        alone = [_node(_environ(auth, sets[2], 2), i, tmp_path / f"set2/node{i}", tmp_path / f"alone{i}.log")
                 for i in (1, 2, 3)]  # fmt: skip
        processes += alone
        asyncio.run(_write(auth, sets[2], ["before-the-move"]))
        for process in alone:
            process.send_signal(signal.SIGTERM)
        assert [process.wait(30) for process in alone] == [0, 0, 0]

        def replicas(node: int) -> list[str]:
            return [arg for k in (2, 3) for arg in ("--replica", json.dumps(
                {"set_id": k, "id": node, "addresses": sets[k], "data_dir": str(tmp_path / f"set{k}/node{node}")}))]

        hosts = [_node(_environ(auth, sets[1], 1), i, tmp_path / f"set1/node{i}", tmp_path / f"host{i}.log", *replicas(i),
                       *(metrics if i == 2 else [])) for i in (1, 2, 3)]  # fmt: skip
        processes += hosts

        async def serve_each_set(round_name: str) -> None:
            for k, addresses in sets.items():
                await _write(auth, addresses, [f"{round_name}-{k}"])

        asyncio.run(serve_each_set("first"))
        assert asyncio.run(_keys(auth, sets[2], ["before-the-move"])) == {"before-the-move"}

        hosts[0].kill()  # kill -9: node 1 of every set at once, as losing the machine
        hosts[0].wait(10)
        asyncio.run(serve_each_set("after-the-kill"))
        for k, addresses in sets.items():
            wanted = [f"first-{k}", f"after-the-kill-{k}"] + (["before-the-move"] if k == 2 else [])
            assert asyncio.run(_keys(auth, addresses, wanted)) == set(wanted), k
        # One page for the host's three replicas: each family once, each sample with its set.
        families = list(text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{ports[9]}/metrics").text))
        names = [family.name for family in families if family.name.startswith("compensator_raft")]
        assert len(names) == len(set(names)) and "compensator_raft_term" in names
        terms = next(family for family in families if family.name == "compensator_raft_term").samples
        assert sorted(sample.labels["set"] for sample in terms) == ["1", "2", "3"]
        for host in hosts[1:]:
            host.send_signal(signal.SIGTERM)
        codes = [host.wait(30) for host in hosts[1:]]
        assert codes == [0, 0], [(tmp_path / f"host{i}.log").read_text()[-2000:] for i in (2, 3)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.mark.parametrize(
    ("replica", "said"),
    [
        ({"set_id": 2, "id": 1, "addresses": ["127.0.0.1:7111", "127.0.0.1:7112", "127.0.0.1:7113"]},
         "COMPENSATOR_NODE__REPLICAS: node.replicas: replica 1 (set 2): data_dir must be given"),
        ({"set_id": 2, "id": 4, "addresses": ["127.0.0.1:7111"], "data_dir": "x"},
         "COMPENSATOR_NODE__REPLICAS: node.replicas: replica 1 (set 2): id must be its place in addresses, 1..1"),
        ([{"set_id": 2, "id": 1, "addresses": ["127.0.0.1:7111"], "data_dir": "x"},
          {"set_id": 3, "id": 1, "addresses": ["127.0.0.1:7111"], "data_dir": "y"}],
         "COMPENSATOR_NODE__REPLICAS: node.replicas: replica 2 (set 3): addresses are another replica's"),
        ({"set_id": 2, "id": 1, "addresses": ["127.0.0.1:7111"], "data_dir": "OWN"},
         "node.replicas: set 2 and set 1 share the data directory OWN"),
        ({"set_id": 2, "id": 1, "addresses": ["127.0.0.1:7111"], "data_dir": "x", "join": True, "voters": [1]},
         "COMPENSATOR_NODE__REPLICAS: node.replicas: replica 1 (set 2): join and voters exclude each other"),
        ({"set_id": 2, "id": 1, "addresses": ["127.0.0.1:7111"], "data_dir": "x", "voters": [1, 2]},
         "COMPENSATOR_NODE__REPLICAS: node.replicas: replica 1 (set 2): voters must be places in addresses, 1..1"),
    ],
)  # fmt: skip
def test_a_bad_replica_is_one_line_before_any_data_directory_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    replica: dict[str, object] | list[dict[str, object]], said: str,
) -> None:  # fmt: skip
    auth = cluster_auth(tmp_path)
    own = tmp_path / "own"
    said = said.replace("OWN", str(own))
    replicas = replica if isinstance(replica, list) else [replica]
    replicas = [{**r, "data_dir": str(own)} if r.get("data_dir") == "OWN" else r for r in replicas]
    for name in [name for name in os.environ if name.startswith("COMPENSATOR_")]:
        monkeypatch.delenv(name)
    for name, value in _environ(auth, ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"], 1).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COMPENSATOR_NODE__REPLICAS", json.dumps(replicas))
    assert cli.main(["node", "--id", "1", "--data", str(own)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("compensator node: ") and said in line, line
    assert sorted(path.name for path in tmp_path.iterdir()) == [auth.secrets.path.name]


def test_run_sets_hosts_node_i_of_every_set_in_set_1s_node_i(tmp_path: Path) -> None:
    """`compensator run --sets 3`: set 1's node i is given node i of the control set and of sets 2
    and 3, each in the data directory it had as a process of its own, and the flags pass the checks."""
    auth = cluster_auth(tmp_path)
    environ = {"COMPENSATOR_STORE__SECRET_FILE": str(auth.secrets.path)}
    planned = LocalSets.plan(load(None, environ), 3, tmp_path / "data")
    parser = cli.build_parser()
    args = parser.parse_args(["node", "--id", "2", "--data", str(tmp_path / "data/node2"), *planned.replica_args(2)])
    config = load(None, environ, flags=node_command.flags(args))
    hosted = hosted_configs(config, node_config(config))
    assert [(replica.set_id, settings.node_id, settings.data_dir) for replica, settings in hosted] == [
        (0, 2, tmp_path / "data/control/node2"), (2, 2, tmp_path / "data/set2/node2"), (3, 2, tmp_path / "data/set3/node2")]
    assert [settings.listen for _, settings in hosted] == [parse_address(planned.control[1]), *(
        parse_address(planned.sets[k][1]) for k in (2, 3))]  # fmt: skip
    assert [settings.tick_ms for _, settings in hosted] == [config.local.control_tick_ms, config.node.tick_ms,
                                                           config.node.tick_ms]  # the control set's own clock  # fmt: skip
    paced = json.loads(planned.replica_args(2)[1]) | {"tick_ms": 100}  # a replica of its own pace: the control set's
    config = load(None, {**environ, "COMPENSATOR_NODE__REPLICAS": json.dumps([paced])}, flags={("node", "id"): (2, "--id")})
    assert [settings.tick_ms for _, settings in hosted_configs(config, node_config(config))] == [100]
    assert not (tmp_path / "data").exists()


def test_a_replacement_machines_hosted_replicas_join_their_sets(tmp_path: Path) -> None:
    """`join = true` on a hosted replica: it starts with no voters and waits to be added, as
    `node.join` does for the process's own (docs/runbook.md, a machine that hosted several sets);
    `voters` names a set's first voters; by default every node of its addresses."""
    auth = cluster_auth(tmp_path)
    addresses = ["127.0.0.1:7111", "127.0.0.1:7112", "127.0.0.1:7113", "127.0.0.1:7114"]
    replicas = [{"set_id": 2, "id": 4, "addresses": addresses, "data_dir": str(tmp_path / "s2"), "join": True},
                {"set_id": 3, "id": 1, "addresses": ["127.0.0.1:7121", "127.0.0.1:7122", "127.0.0.1:7123"],
                 "data_dir": str(tmp_path / "s3"), "voters": [1, 2]},
                {"set_id": 0, "id": 1, "addresses": ["127.0.0.1:7150"], "data_dir": str(tmp_path / "c")}]  # fmt: skip
    environ = {**_environ(auth, ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"], 1),
               "COMPENSATOR_NODE__REPLICAS": json.dumps(replicas)}  # fmt: skip
    config = load(None, environ, flags={("node", "id"): (1, "--id"), ("node", "data_dir"): (str(tmp_path / "own"), "--data")})
    hosted = hosted_configs(config, node_config(config))
    assert [(replica.set_id, settings.initial_voters) for replica, settings in hosted] == [
        (2, frozenset()), (3, frozenset({1, 2})), (0, frozenset({1}))]  # fmt: skip
    assert hosted[0][1].listen == parse_address(addresses[3]) and not (tmp_path / "s2").exists()
