"""Start, kill, pause and restart real node processes on loopback.

Used by the process-level fault tests and the benchmarks, so both exercise exactly the
`raft-store run` command an operator would start. A cluster makes its own cluster secret (and
uses TLS files when given): its `auth` is what a client of it presents, `secret_file` what a
command line of the service is given (COMPENSATOR_STORE__SECRET_FILE).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from raft_store.auth import StoreAuth, TlsFiles
from raft_store.client import RaftClient
from raft_store.testing.credentials import SECRET_NAME, cluster_auth, service_settings

FAKETIME_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/lib/faketime")


def skewed_clock_env(offset_s: int) -> dict[str, str] | None:
    """The environment that runs a process with its wall clock `offset_s` off (libfaketime, Debian's
    `faketime` package), its monotonic clock untouched as NTP leaves it; None without libfaketime.

    The library is preloaded into the process itself, not run through the `faketime` command: that
    command forks, and a SIGTERM to it left its child running."""
    for directory in FAKETIME_LIBRARIES:
        library = Path(directory) / "libfaketimeMT.so.1"
        if library.exists():
            return {"LD_PRELOAD": str(library), "FAKETIME": f"{offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    return None


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def stop_processes(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (a paused one resumed first), then SIGKILL whatever is left after 10 s."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(procs: Iterable[subprocess.Popen[bytes]]) -> float:
    """User+system CPU of the running processes among `procs` (each once), from /proc (Linux)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in {proc.pid for proc in procs}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


@dataclass
class ProcessCluster:
    root: Path
    size: int = 3
    machine: str = "counter"
    extra_args: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    tls: TlsFiles | None = None
    secret_file: Path = field(init=False)
    auth: StoreAuth = field(init=False)

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = free_ports(self.size)
        self.auth = cluster_auth(self.root, tls=self.tls)
        self.secret_file = self.root / SECRET_NAME

    def service_settings(self) -> dict[str, str]:
        """This cluster as the service's configuration names it (COMPENSATOR_STORE__ variables)."""
        return service_settings(self.addresses(), self.auth)

    def auth_args(self) -> list[str]:
        """The options that give a node or a command line this cluster's secret (and TLS files)."""
        args = ["--secret-file", str(self.secret_file)]
        if self.tls is not None:
            args += ["--tls-ca", str(self.tls.ca), "--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
        return args

    @property
    def ids(self) -> list[int]:
        return list(range(1, self.size + 1))

    def address(self, node: int) -> tuple[str, int]:
        return ("127.0.0.1", self.ports[node - 1])

    def addresses(self) -> list[tuple[str, int]]:
        return [self.address(n) for n in self.ids]

    def client_address_args(self, host: str = "127.0.0.1") -> list[str]:
        """`--client-address` for every node, as a deployment advertises them: a client given
        some nodes then follows leader hints to the others. `host` names the same loopback
        listeners by another route, so a test can tell which addresses a client used."""
        return [arg for node in self.ids for arg in ("--client-address", f"{node}={host}:{self.address(node)[1]}")]

    def start(self, node: int, *extra: str, env: Mapping[str, str] | None = None) -> None:
        """`env`: added to the node's environment (`skewed_clock_env`, for one)."""
        args = [
            sys.executable,
            "-m",
            "raft_store",
            "run",
            "--id",
            str(node),
            "--data",
            str(self.root / f"node{node}"),
            "--machine",
            self.machine,
            *self.auth_args(),
        ]
        for peer in self.ids:
            host, port = self.address(peer)
            args += ["--peer", f"{peer}={host}:{port}"]
        log = open(self.root / f"node{node}.log", "ab")  # noqa: SIM115 - owned by the process
        environment = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.procs[node] = subprocess.Popen([*args, *self.extra_args, *extra], stdout=log, stderr=log, env=environment)

    def start_all(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for node in self.ids:
            self.start(node)

    def kill(self, node: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(node)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(10)

    def pause(self, node: int) -> None:
        self.kill(node, signal.SIGSTOP)

    def resume(self, node: int) -> None:
        self.kill(node, signal.SIGCONT)

    def stop_all(self) -> None:
        stop_processes(self.procs.values())

    async def wait_leader(self, client: RaftClient, timeout_s: float = 15.0, exclude: int = 0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.ids:
                if node == exclude or self.procs.get(node) is None or self.procs[node].poll() is not None:
                    continue
                try:
                    status = await client.status(self.address(node))
                except Exception:
                    continue
                if status["role"] == "leader":
                    return node
            await asyncio.sleep(0.05)
        raise TimeoutError("no leader elected")

    def cpu_seconds(self) -> float:
        """User+system CPU of all running node processes, from /proc (Linux)."""
        return cpu_seconds(self.procs.values())

    async def statuses(self, client: RaftClient) -> dict[int, dict[str, object]]:
        out = {}
        for node in self.ids:
            try:
                out[node] = await client.status(self.address(node))
            except Exception:
                continue
        return out
