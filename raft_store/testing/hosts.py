"""Several groups' nodes hosted together: host i is one `raft-store host` process running node i of
every group (raft_store/hosting.py), as a deployment of several sets on three machines has.

Each group stays a `ProcessCluster` (its ports, its cluster secret, its data folders
`<root>/node<i>`, the same as when its nodes run alone): once a host started, the group's
`procs[i]` is that host's process, so what a cluster does to its node i (`wait_leader`, `kill`,
`pause`) it does to the host, and through it to node i of every group, as losing a machine does.

Must never: count one host's CPU once per group it hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from raft_store.testing.processes import ProcessCluster, cpu_seconds, stop_processes


@dataclass
class ProcessHosts:
    """`size` hosts over `groups` (by the name the hosts' lines give them, e.g. `set 2`); every group
    has `size` nodes and one cluster secret shared by all (a deployment's sets share it)."""

    root: Path
    groups: dict[str, ProcessCluster]
    machine: str = "counter"
    extra_args: list[str] = field(default_factory=list)
    """Flags of every host (and so of every replica, e.g. `--tick-ms`)."""
    settings: dict[str, dict[str, object]] = field(default_factory=dict)
    """A group's own node settings in its replica files (e.g. {"tick_ms": 100}): a cluster's own
    `extra_args` cannot reach a host, so a group given any is refused rather than run without them."""
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        flagged = [group for group, cluster in self.groups.items() if cluster.extra_args]
        if flagged:
            raise ValueError(f"{', '.join(flagged)}: per-node flags do not reach a host; give them as `settings`")

    @property
    def size(self) -> int:
        return next(iter(self.groups.values())).size

    @property
    def ids(self) -> list[int]:
        return list(range(1, self.size + 1))

    def replica_files(self, host: int) -> list[Path]:
        """The `--replica` file of each group's node `host`: its id, its group's peers, its data."""
        folder = self.root / f"host{host}"
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for index, (group, cluster) in enumerate(self.groups.items()):
            peers = {str(node): f"{h}:{p}" for node, (h, p) in zip(cluster.ids, cluster.addresses(), strict=True)}
            path = folder / f"replica{index}.json"
            path.write_text(json.dumps({**self.settings.get(group, {}), "id": host, "peers": peers,
                                        "data_dir": str(cluster.root / f"node{host}"), "group": group}))  # fmt: skip
            files.append(path)
        return files

    def start(self, host: int, *extra: str) -> None:
        first = next(iter(self.groups.values()))
        args = [sys.executable, "-m", "raft_store", "host", "--machine", self.machine, *first.auth_args()]
        for path in self.replica_files(host):
            args += ["--replica", str(path)]
        log = open(self.root / f"host{host}.log", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen([*args, *self.extra_args, *extra], stdout=log, stderr=log,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))  # fmt: skip
        self.procs[host] = proc
        for cluster in self.groups.values():
            cluster.procs[host] = proc

    def start_all(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for host in self.ids:
            self.start(host)

    def kill(self, host: int, sig: int = signal.SIGKILL) -> None:
        next(iter(self.groups.values())).kill(host, sig)

    def stop_all(self) -> None:
        stop_processes(self.procs.values())

    def cpu_seconds(self) -> float:
        """User+system CPU of the running hosts (each once), from /proc (Linux)."""
        return cpu_seconds(self.procs.values())
