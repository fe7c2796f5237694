"""The operator's command: bad input gives one line and a non-zero exit, and changes nothing."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path

from raft_store.cli import add_node_arguments, build_parser, node_config
from raft_store.client import RaftClient
from raft_store.testing.credentials import cluster_auth
from raft_store.testing.processes import free_ports


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raft_store", *args], capture_output=True, text=True, timeout=60)


def test_bad_arguments_give_one_line_and_exit_2(tmp_path: Path) -> None:
    secret = ["--secret-file", str(cluster_auth(tmp_path).secrets.path)]
    open_secret = tmp_path / "open.secret"
    open_secret.write_text("x" * 40 + "\n")
    open_secret.chmod(0o644)
    for args in (
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1"],  # no cluster secret
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1", "--secret-file", str(open_secret)],
        ["status", "--addresses", "127.0.0.1:1"],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("raft-store:")
        assert "secret" in result.stderr and "x" * 40 not in result.stderr
    for args in (
        ["run", "--peer", "x=1"],
        ["run", "--id", "1", "--peer", "1=localhost"],
        ["run", "--id", "1", "--listen", "127.0.0.1:1", "--machine", "nope", "--data", str(tmp_path / "d")],
        ["run", "--config", str(tmp_path / "missing.json")],
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1", "--client-address", "one=app:1"],
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1", "--client-address", "1=app"],
    ):
        result = run(*args, *secret)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("raft-store:")


def test_status_of_an_unreachable_cluster_fails(tmp_path: Path) -> None:
    result = run("status", "--addresses", "127.0.0.1:1", "--secret-file", str(cluster_auth(tmp_path).secrets.path))
    assert result.returncode == 1
    assert '"error"' in result.stdout


def test_client_addresses_come_from_flags_or_the_config_file(tmp_path: Path) -> None:
    peers = ["--peer", "1=10.0.0.1:7101", "--peer", "2=10.0.0.2:7101",
             "--secret-file", str(cluster_auth(tmp_path).secrets.path)]
    flags = ["--client-address", "1=app1:7101", "--client-address", "2=app2:7101"]
    config = node_config(build_parser().parse_args(["run", "--id", "1", *peers, *flags]))
    assert config.client_addresses == {1: ("app1", 7101), 2: ("app2", 7101)}
    assert config.peers == {1: ("10.0.0.1", 7101), 2: ("10.0.0.2", 7101)}

    path = tmp_path / "node.json"
    path.write_text(json.dumps({"id": 2, "peers": {"1": "10.0.0.1:7101", "2": "10.0.0.2:7101"},
                                "client_addresses": {"1": "app1:7101", "2": "app2:7101"},
                                "secret_file": str(tmp_path / "cluster.secret")}))
    from_file = node_config(build_parser().parse_args(["run", "--config", str(path)]))
    assert from_file.client_addresses == config.client_addresses
    assert (from_file.node_id, from_file.listen) == (2, ("10.0.0.2", 7101))

    bare = node_config(build_parser().parse_args(["run", "--id", "1", *peers]))
    assert bare.client_addresses == {}


OTHER_COMMAND_LINE = """
import argparse, asyncio, sys
from raft_store.cli import UsageError, add_node_arguments, node_config, prepare_node_process, run_node
from raft_store.machines import CounterMachine

parser = argparse.ArgumentParser(prog="other")
add_node_arguments(parser)
try:
    config = node_config(parser.parse_args(sys.argv[1:]))
except UsageError as exc:
    print(f"other: {exc}", file=sys.stderr)
    raise SystemExit(2)
prepare_node_process()
raise SystemExit(asyncio.run(run_node(config, CounterMachine())))
"""


def test_the_node_options_leave_the_machine_to_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    options = {option for action in parser._actions for option in action.option_strings}
    assert "--machine" not in options and {"--peer", "--client-address", "--config", "--data"} <= options


async def test_another_command_line_runs_a_node_with_its_own_machine(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    auth = cluster_auth(tmp_path)
    args = ["--id", "1", "--peer", f"1=127.0.0.1:{port}", "--data", str(tmp_path / "node1"), "--tick-ms", "10",
            "--secret-file", str(auth.secrets.path)]
    proc = subprocess.Popen([sys.executable, "-c", OTHER_COMMAND_LINE, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    client = RaftClient([("127.0.0.1", port)], auth=auth, deadline_s=20)
    try:
        assert await client.propose(b"one") == b""  # the counter machine answers every command with b""
        answer, applied = await client.read(b"")
        assert json.loads(answer) == {"count": 1, "applied": applied}
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout.splitlines()[0]) == {"event": "started", "node": 1, "listen": f"127.0.0.1:{port}"}

    bad = subprocess.run([sys.executable, "-c", OTHER_COMMAND_LINE, "--id", "1", "--secret-file",
                          str(auth.secrets.path)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("other: --listen is required")
