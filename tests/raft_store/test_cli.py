"""The operator's command: bad input gives one line and a non-zero exit, and changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from raft_store.cli import build_parser, node_config


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raft_store", *args], capture_output=True, text=True, timeout=60)


def test_bad_arguments_give_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (
        ["run", "--peer", "x=1"],
        ["run", "--id", "1", "--peer", "1=localhost"],
        ["run", "--id", "1", "--listen", "127.0.0.1:1", "--machine", "nope", "--data", str(tmp_path / "d")],
        ["run", "--config", str(tmp_path / "missing.json")],
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1", "--client-address", "one=app:1"],
        ["run", "--id", "1", "--peer", "1=127.0.0.1:1", "--client-address", "1=app"],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("raft-store:")


def test_status_of_an_unreachable_cluster_fails() -> None:
    result = run("status", "--addresses", "127.0.0.1:1")
    assert result.returncode == 1
    assert '"error"' in result.stdout


def test_client_addresses_come_from_flags_or_the_config_file(tmp_path: Path) -> None:
    peers = ["--peer", "1=10.0.0.1:7101", "--peer", "2=10.0.0.2:7101"]
    flags = ["--client-address", "1=app1:7101", "--client-address", "2=app2:7101"]
    config = node_config(build_parser().parse_args(["run", "--id", "1", *peers, *flags]))
    assert config.client_addresses == {1: ("app1", 7101), 2: ("app2", 7101)}
    assert config.peers == {1: ("10.0.0.1", 7101), 2: ("10.0.0.2", 7101)}

    path = tmp_path / "node.json"
    path.write_text(json.dumps({"id": 2, "peers": {"1": "10.0.0.1:7101", "2": "10.0.0.2:7101"},
                                "client_addresses": {"1": "app1:7101", "2": "app2:7101"}}))
    from_file = node_config(build_parser().parse_args(["run", "--config", str(path)]))
    assert from_file.client_addresses == config.client_addresses
    assert (from_file.node_id, from_file.listen) == (2, ("10.0.0.2", 7101))

    bare = node_config(build_parser().parse_args(["run", "--id", "1", *peers]))
    assert bare.client_addresses == {}
