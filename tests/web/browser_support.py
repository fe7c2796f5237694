"""What the browser tests of the review pages are built from: `compensator run` (the launcher behind
`make run`) on free ports with a temporary data folder, read the way a person reads its banner;
dead letters made for real through the API while the payment stand-in refuses every transfer; and
Debian's Chromium driven by Playwright (never `playwright install`: the system browser is used).

The tests import this module by its name (a module named conftest is not unique across the suite).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue as queues_
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

import httpx
import pytest

from ledger import pg
from raft_store.testing.processes import free_ports

ROOT: Final = Path(__file__).resolve().parents[2]
CHROMIUM_ENV: Final = "COMPENSATOR_CHROMIUM"
"""The browser to drive; Debian's /usr/bin/chromium unless it names another."""
SCREENSHOTS_ENV: Final = "COMPENSATOR_SCREENSHOTS"
"""Where the pages' screenshots go (CI keeps them as artifacts); a pytest temporary folder unless set."""
DEFAULT_CHROMIUM: Final = "/usr/bin/chromium"
START_TIMEOUT_S: Final = 90.0
HTTP_TIMEOUT_S: Final = 30.0
T = TypeVar("T")


def chromium_path() -> str:
    """The system browser, or a failure that says how to get it (CI installs it: never a skip)."""
    path = os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM
    if not os.access(path, os.X_OK):
        pytest.fail(f"no Chromium at {path}: apt-get install chromium (deploy/install-system-packages.sh"
                    f" installs it), or set ${CHROMIUM_ENV} to a browser", pytrace=False)  # fmt: skip
    return path


def poll_until(condition: Callable[[], T | None], *, timeout_s: float, what: str, every_s: float = 0.1) -> T:
    """The condition's first truthy value, checked until `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what} (last: {value!r})")
        time.sleep(every_s)


# ---- the launcher ------------------------------------------------------------------------------


def child_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """This environment without any COMPENSATOR_ setting, on this checkout's code, plus `overrides`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    path = os.pathsep.join([str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    return {**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **overrides}


@dataclass(frozen=True, slots=True)
class Login:
    name: str
    password: str


@dataclass(frozen=True, slots=True)
class Banner:
    """What `make run` prints that a person needs for the review."""

    lines: tuple[str, ...]
    api_url: str
    review_url: str
    producer_token: str
    operator_token: str
    reviewer: Login
    approver: Login
    payment_url: str

    @classmethod
    def parse(cls, lines: list[str]) -> Banner:
        text = "\n".join(lines)

        def found(pattern: str, what: str) -> re.Match[str]:
            match = re.search(pattern, text, re.MULTILINE)
            assert match is not None, f"the banner does not show {what}:\n{text}"
            return match

        return cls(
            lines=tuple(lines),
            api_url=found(r"^\s*API\s+(http://\S+)", "the API's URL")[1],
            review_url=found(r"(http://\S+/review)\b", "the review pages' URL")[1],
            producer_token=found(r"^\s*producer token\s+(\S+)", "the producer token")[1],
            operator_token=found(r"^\s*operator token\s+(\S+)", "the operator token")[1],
            reviewer=_login(found, "reviewer"),
            approver=_login(found, "approver"),
            payment_url=found(r"Stand-ins: payment (http://\S+?),", "the payment stand-in")[1],
        )


def _login(found: Callable[[str, str], re.Match[str]], role: str) -> Login:
    """A demo user's line: `reviewer   <name> / <password>` (its role first, then name and password)."""
    match = found(rf"^\s*(?:demo )?{role}\b\S*\s+(\S+)\s*/\s*(\S+)", f"a demo {role}'s login")
    return Login(match[1], match[2])


class LocalRun:
    """`compensator run` as a subprocess on free ports, its data in `data_dir`; stopped with Ctrl-C
    (SIGINT) as a person stops it. Its children run in sessions of their own, so they are
    remembered by pid for the case where it must be killed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        ports = free_ports(7)
        self.ports = {"api": ports[3], "payment": ports[4], "red_packet": ports[5], "callback": ports[6]}
        self.env = {
            "COMPENSATOR_STORE__ADDRESSES": ",".join(f"127.0.0.1:{port}" for port in ports[:3]),
            "COMPENSATOR_API__PORT": str(self.ports["api"]),
            "COMPENSATOR_HANDLERS__PAYMENT": json.dumps({"base_url": f"http://127.0.0.1:{self.ports['payment']}"}),
            "COMPENSATOR_HANDLERS__RED_PACKET": json.dumps({"base_url": f"http://127.0.0.1:{self.ports['red_packet']}"}),
            "COMPENSATOR_LOCAL__CALLBACK_PORT": str(self.ports["callback"]),
            "COMPENSATOR_LOCAL__WORKERS": "1",
            "COMPENSATOR_LOCAL__DATA_DIR": str(data_dir),
        }  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "compensator", "run"], cwd=ROOT, env=child_env(self.env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.printed: list[str] = []
        self._lines: queues_.Queue[str | None] = queues_.Queue()
        self._children: set[int] = set()
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            self.printed.append(line.rstrip("\n"))
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _remember_children(self) -> None:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.process.pid}/task").iterdir():
                self._children.update(int(pid) for pid in (task / "children").read_text().split())

    def banner(self) -> Banner:
        """The banner, once printed whole: from "compensator is running" to the first quiet second."""
        deadline = time.monotonic() + START_TIMEOUT_S
        lines: list[str] = []
        while time.monotonic() < deadline:
            self._remember_children()
            try:
                line = self._lines.get(timeout=1.0 if lines else 0.2)
            except queues_.Empty:
                if lines:
                    return Banner.parse(lines)
                continue
            assert line is not None, f"`compensator run` exited {self.process.wait()}:\n" + "\n".join(self.printed)
            if lines or line.startswith("compensator is running"):
                lines.append(line)
        raise AssertionError(f"no banner within {START_TIMEOUT_S} s:\n" + "\n".join(self.printed))

    def stop(self) -> None:
        """Ctrl-C, and its exit within 60 s; else it and everything it started are killed."""
        self._remember_children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self._children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each child leads its own session
        self._stop_postgres()
        self._reader.join(5)

    def _stop_postgres(self) -> None:
        """The launcher stops its PostgreSQL; if it could not (it was killed, or pg_ctl, which runs
        as another user, could not reach the folder), its postmaster is told to shut down fast."""
        server = pg.EmbeddedPostgres(self.data_dir / "pg" / "data")
        with contextlib.suppress(Exception):
            server.stop_any()
        with contextlib.suppress(Exception):
            postmaster = server.running_pid()
            if postmaster is not None:
                os.kill(postmaster, signal.SIGINT)
                poll_until(lambda: server.running_pid() is None, timeout_s=30.0, what="PostgreSQL stopped")


@contextlib.contextmanager
def local_run() -> Iterator[tuple[LocalRun, Banner]]:
    """A launcher with its data in a folder of its own under the system's temporary folder, not
    pytest's: its PostgreSQL runs as another user, which must traverse every folder above the data,
    and a pytest session starting meanwhile makes pytest's folder its owner's alone again."""
    parent = Path(tempfile.mkdtemp(prefix="compensator-browser-"))
    run = LocalRun(parent / "local")
    try:
        yield run, run.banner()
    finally:
        run.stop()
        shutil.rmtree(parent, ignore_errors=True)


# ---- the API, as the producer and the stand-in see it --------------------------------------------


class Api:
    """The JSON API with the banner's producer token: submissions, and reading requests back."""

    def __init__(self, banner: Banner) -> None:
        self.banner = banner
        self.client = httpx.Client(base_url=banner.api_url, timeout=HTTP_TIMEOUT_S)

    def close(self) -> None:
        self.client.close()

    def _headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.banner.producer_token}"}

    def submit_transfer(self, key: str, ref_key: str, payload: dict[str, Any]) -> str:
        answer = self.client.post("/v1/requests", headers={**self._headers(), "Idempotency-Key": key}, json={
            "kind": "transfer", "ref_key": ref_key, "payload": payload,
            "failure": {"error_class": "timeout", "text": "payment system did not answer in 2 s"},
        })  # fmt: skip
        assert answer.status_code == 201, answer.text
        request_id: str = answer.json()["id"]
        return request_id

    def request(self, request_id: str) -> dict[str, Any]:
        answer = self.client.get(f"/v1/requests/{request_id}", headers=self._headers(self.banner.operator_token))
        assert answer.status_code == 200, answer.text
        document: dict[str, Any] = answer.json()
        return document

    def wait_state(self, request_id: str, state: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return poll_until(lambda: (view := self.request(request_id))["state"] == state and view,
                          timeout_s=timeout_s, what=f"{request_id} {state}")  # fmt: skip

    def payment_faults(self, settings: dict[str, Any]) -> None:
        answer = httpx.put(f"{self.banner.payment_url}/_faults", json=settings, timeout=HTTP_TIMEOUT_S)
        assert answer.status_code == 200, answer.text
