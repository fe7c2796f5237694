"""`compensator user` as a process against a running store: its lines, exit codes, and what it
never prints (a password or a hash)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from queues import QueueClient, RaftClient
from queues.replicated import machine_factory
from raft_store.testing.credentials import cluster_auth, service_settings
from raft_store.testing.inprocess import StoreThread, running_store

PASSWORD = "correct horse battery"


def _user(store: StoreThread, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compensator", "user", *args], input=stdin, capture_output=True, text=True, timeout=60,
        env={**store.service_settings(), "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip


def _documents(store: StoreThread, namespace: str) -> str:
    async def read() -> str:
        queue = QueueClient(RaftClient([store.address], auth=store.auth))
        try:
            answer = (await queue.documents(namespace)).value
            return f"version {answer.version}: {answer.documents}"
        finally:
            await queue.raft.close()

    return store.run(read())


def test_add_list_role_passwd_disable_enable(tmp_path: Path) -> None:
    with running_store(tmp_path / "store", machine_factory) as store:
        added = _user(store, "add", "--name", "alice", "--role", "reviewer", stdin=PASSWORD + "\n")
        assert (added.returncode, added.stdout, added.stderr) == (0, "", "user alice (reviewer) added\n")
        secret = tmp_path / "pw"
        secret.write_text("another long password\n")
        assert _user(store, "add", "--name", "bob", "--role", "viewer", "--password-file", str(secret)).returncode == 0

        listing = _user(store, "list")
        assert listing.returncode == 0
        rows = [json.loads(line) for line in listing.stdout.splitlines()]
        assert [(r["name"], r["role"], r["disabled"], r["last_login_at"]) for r in rows] == [
            ("alice", "reviewer", False, None), ("bob", "viewer", False, None)]  # fmt: skip
        assert rows[0]["created_at"].endswith("Z") and rows[0]["created_by"].startswith("cli")
        hashes = _documents(store, "passwords")
        assert "$argon2id$" in hashes
        for output in (listing.stdout + listing.stderr, added.stdout + added.stderr):
            assert "argon2" not in output and PASSWORD not in output

        role = _user(store, "role", "--name", "alice", "--role", "approver")
        assert (role.returncode, role.stderr) == (0, "alice is now approver; 0 sessions ended\n")
        passwd = _user(store, "passwd", "--name", "alice", stdin="a new long password\n")
        assert (passwd.returncode, passwd.stderr) == (0, "password of alice changed; 0 sessions ended\n")
        disabled = _user(store, "disable", "--name", "alice", "--reason", "left the team")
        assert (disabled.returncode, disabled.stderr) == (0, "alice disabled; 0 sessions ended\n")
        row = json.loads(_user(store, "list").stdout.splitlines()[0])
        assert (row["role"], row["disabled"], row["disabled_reason"]) == ("approver", True, "left the team")
        enabled = _user(store, "enable", "--name", "alice")
        assert (enabled.returncode, enabled.stderr) == (0, "alice enabled\n")
        assert json.loads(_user(store, "list").stdout.splitlines()[0])["disabled"] is False

        unlocked = _user(store, "unlock", "--name", "alice", "--reason", "ticket OPS-12")
        assert (unlocked.returncode, unlocked.stderr) == (0, "alice was not locked; its failed logins are forgotten\n")
        store.run(_lock(store, "alice"))
        assert json.loads(_user(store, "list").stdout.splitlines()[0])["locked_until"] is not None
        unlocked = _user(store, "unlock", "--name", "alice")
        assert (unlocked.returncode, unlocked.stderr) == (0, "alice unlocked\n")
        assert json.loads(_user(store, "list").stdout.splitlines()[0])["locked_until"] is None


async def _lock(store: StoreThread, name: str) -> None:
    """The account locked, as five failed logins from several addresses leave it."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth))
    try:
        body = json.dumps({"failures": 0, "locked_until_ms": 4_000_000_000_000, "last_failure_ms": 1}).encode()
        await queue.put_document("logins", name, body, actor="web", reason="failed login: locked now")
    finally:
        await queue.raft.close()


def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    with running_store(tmp_path / "store", machine_factory) as store:
        assert _user(store, "add", "--name", "alice", "--role", "reviewer", stdin=PASSWORD).returncode == 0
        before = _documents(store, "users")
        cases = [
            (("add", "--name", "alice", "--role", "reviewer"), PASSWORD, 1, "a user named 'alice' exists already"),
            (("add", "--name", "carol", "--role", "reviewer"), "short", 1, "the password is too short: at least 12"),
            (("add", "--name", "carol", "--role", "producer"), PASSWORD, 2, "invalid choice: 'producer'"),
            (("add", "--name", "Carol!", "--role", "viewer"), PASSWORD, 1, "is not a user name"),
            (("disable", "--name", "nobody", "--reason", "x"), "", 1, "no user named 'nobody'"),
            (("enable", "--name", "nobody"), "", 1, "no user named 'nobody'"),
            (("passwd", "--name", "nobody"), PASSWORD, 1, "no user named 'nobody'"),
            (("passwd", "--name", "alice"), "short", 1, "the password is too short"),
            (("role", "--name", "nobody", "--role", "viewer"), "", 1, "no user named 'nobody'"),
            (("unlock", "--name", "nobody"), "", 1, "no user named 'nobody'"),
            (("add", "--name", "carol", "--role", "viewer", "--password-file", str(tmp_path / "missing")), "", 1,
             "cannot read"),
        ]  # fmt: skip
        for args, stdin, code, words in cases:
            done = _user(store, *args, stdin=stdin + "\n")
            assert done.returncode == code, (args, done.stderr)
            assert len(done.stderr.splitlines()) == 1 and words in done.stderr, (args, done.stderr)
            assert PASSWORD not in done.stderr + done.stdout
        assert _documents(store, "users") == before


def test_without_the_cluster_secret_no_token_or_user_is_made(tmp_path: Path) -> None:
    """The store's administrators are the holders of its cluster secret: `token create` and `user
    add` without it (or with another) fail in one line and change nothing."""
    with running_store(tmp_path / "store", machine_factory) as store:
        before = _documents(store, "users")
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        environments = {
            "no secret": {"COMPENSATOR_STORE__ADDRESSES": store.addresses,
                          "COMPENSATOR_STORE__SECRET_FILE": str(tmp_path / "missing.secret")},
            "another secret": service_settings([store.address], cluster_auth(stranger)),
        }  # fmt: skip
        for case, environment in environments.items():
            for command in (["token", "create", "--name", "mallory", "--role", "admin"],
                            ["user", "add", "--name", "mallory", "--role", "approver"]):  # fmt: skip
                done = subprocess.run(
                    [sys.executable, "-m", "compensator", *command], input=PASSWORD + "\n", capture_output=True,
                    text=True, timeout=60, env={**environment, "PATH": "/usr/bin:/bin"}, check=False,
                )  # fmt: skip
                assert done.returncode == 1 and done.stdout == "", (case, done.stderr)
                (line,) = done.stderr.splitlines()
                assert line.startswith(f"compensator {command[0]}: error: "), line
                assert ("cannot read" in line) if case == "no secret" else ("refused" in line), line
        assert _documents(store, "users") == before
        tokens = subprocess.run([sys.executable, "-m", "compensator", "token", "list"], capture_output=True, text=True,
                                timeout=60, env={**store.service_settings(), "PATH": "/usr/bin:/bin"})  # fmt: skip
        assert tokens.returncode == 0 and "mallory" not in tokens.stdout
