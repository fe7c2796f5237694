"""``compensator standins``: one line for each usual mistake, never a secret or a password in it; and
the real command, as a process, serving the three stand-ins until SIGINT."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from handlers_support import SECRETS

from compensator import cli
from handlers.signing import sign
from ledger import pg
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]
SECRET_TEXT = "whsec-command-test-0123456789"


def ports() -> list[str]:
    payment, red_packet, callback = free_ports(3)  # distinct: drawn with all three sockets bound
    return ["--payment-port", str(payment), "--red-packet-port", str(red_packet), "--callback-port", str(callback)]


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str] | None = None) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("COMPENSATOR_PG_DSN", raising=False)
        patch.delenv("COMPENSATOR_CALLBACK_SECRETS", raising=False)
        for name, value in (environ or {}).items():
            patch.setenv(name, value)
        status = cli.main(["standins", *argv])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 1 and len(lines) == 1, captured.err
    return lines[0]


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prefix = "compensator standins: error: "
    assert error_of(capsys, ["--host", "10.1.2.3", *ports()]) == (
        f"{prefix}host 10.1.2.3 is not a loopback address (--exposed allows it on a demo network)"
    )
    assert error_of(capsys, ["--payment-port", "70000"]) == (  # a configuration problem: the flag and the setting named
        "compensator standins: --payment-port: standins.payment_port: must be in 1..65535")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    line = error_of(capsys, [*ports(), "--pg-data", str(not_a_folder / "pg")],
                    {"COMPENSATOR_CALLBACK_SECRETS": json.dumps({"merchant-a": SECRET_TEXT})})  # fmt: skip
    assert line == f"{prefix}cannot start an embedded PostgreSQL in {not_a_folder / 'pg'}: NotADirectoryError"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*ports()[:-2], "--callback-port", str(port)]
        assert error_of(capsys, argv) == f"{prefix}port {port} (callback) is taken on 127.0.0.1"
    missing = tmp_path / "missing.json"
    assert error_of(capsys, [*ports(), "--secrets-file", str(missing)]) == (
        f"{prefix}{missing}: cannot read: No such file or directory")
    short = tmp_path / "short.json"
    short.write_text('{"merchant-a": "too-short"}')
    line = error_of(capsys, [*ports(), "--secrets-file", str(short)])
    assert line == f"{prefix}{short}: target 'merchant-a': a secret must be 16..1024 bytes long"
    line = error_of(capsys, ports(), {"COMPENSATOR_CALLBACK_SECRETS": '{"merchant-a": ' + f'"{SECRET_TEXT}"'})
    assert line == f"{prefix}COMPENSATOR_CALLBACK_SECRETS: expected a JSON object of target name to secret string"
    port = pg.free_tcp_port()
    line = error_of(capsys, [*ports(), "--pg-dsn", f"postgresql://someone:hunter2-password@127.0.0.1:{port}/x"],
                    {"COMPENSATOR_CALLBACK_SECRETS": json.dumps({"merchant-a": SECRET_TEXT})})  # fmt: skip
    assert line.startswith(f"{prefix}cannot reach PostgreSQL at 127.0.0.1:{port}: ")
    assert "hunter2" not in line and SECRET_TEXT not in line


def test_the_command_serves_the_three_until_sigint(database: str, tmp_path: Path) -> None:
    secrets_file = tmp_path / "secrets.json"
    secrets_file.write_text(json.dumps({"merchant-a": SECRETS["merchant-a"].reveal().decode()}))
    argv = ports()
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environ = {**os.environ, "PYTHONPATH": python_path, "COMPENSATOR_PG_DSN": database}
    process = subprocess.Popen(
        [sys.executable, "-m", "compensator", "standins", *argv, "--secrets-file", str(secrets_file), "--seed", "3"],
        cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        callback_url = f"http://127.0.0.1:{argv[5]}"
        body = b'{"order":"o-1"}'
        headers = {"Webhook-Signature": sign(SECRETS["merchant-a"], timestamp_s=int(time.time()), body=body),
                   "Idempotency-Key": "k-1"}  # fmt: skip
        delivered = httpx.post(f"{callback_url}/callbacks/merchant-a", content=body, headers=headers)
        stats = httpx.get(f"http://127.0.0.1:{argv[1]}/_stats").json()
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert banner.startswith(f"standins: payment http://127.0.0.1:{argv[1]}, red_packet http://127.0.0.1:{argv[3]},")
    assert "callback targets: merchant-a; Ctrl-C stops" in banner
    assert (delivered.status_code, delivered.json()) == (200, {"received": True, "repeat": False})
    assert stats == {"service": "payment", "requests": 0, "applied": 0, "repeats": 0, "by_outcome": {}, "faults": {}}
    assert process.returncode == 0, err
    assert SECRETS["merchant-a"].reveal().decode() not in banner + out + err


@pytest.mark.parametrize("when", ["while the server starts", "once serving"])
def test_sigterm_leaves_no_embedded_server_running(tmp_path: Path, when: str) -> None:
    """A launcher stops the stand-ins with SIGTERM at any moment, even before their database is up."""
    data = tmp_path / "pg" / "data"
    server = pg.EmbeddedPostgres(data)
    server.start()  # initdb done: the next postmaster.pid is the server's own, not initdb's
    server.stop()
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environ = {k: v for k, v in os.environ.items() if k != "COMPENSATOR_PG_DSN"} | {"PYTHONPATH": python_path}
    process = subprocess.Popen(
        [sys.executable, "-m", "compensator", "standins", *ports(), "--pg-data", str(data)],
        cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        if when == "once serving":
            assert process.stdout is not None and process.stdout.readline().startswith("standins: ")
        else:  # the postmaster has written its pid file: pg_ctl is still waiting for it to accept
            while not (data / "postmaster.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        left = server.running_pid()
    finally:
        if process.poll() is None:
            process.kill()
        server.stop_any()
    assert left is None, f"a server (pid {left}) still runs in {data} after the stand-ins exited {process.returncode}"
