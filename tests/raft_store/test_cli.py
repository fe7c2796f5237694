"""The operator's command: bad input gives one line and a non-zero exit, and changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raft_store", *args], capture_output=True, text=True, timeout=60)


def test_bad_arguments_give_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (
        ["run", "--peer", "x=1"],
        ["run", "--id", "1", "--peer", "1=localhost"],
        ["run", "--id", "1", "--listen", "127.0.0.1:1", "--machine", "nope", "--data", str(tmp_path / "d")],
        ["run", "--config", str(tmp_path / "missing.json")],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("raft-store:")


def test_status_of_an_unreachable_cluster_fails() -> None:
    result = run("status", "--addresses", "127.0.0.1:1")
    assert result.returncode == 1
    assert '"error"' in result.stdout
