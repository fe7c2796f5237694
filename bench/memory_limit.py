"""A memory limit per node process, through the kernel's memory cgroup (v1 or v2).

Why: a node's VmRSS counts the LMDB map's resident file pages, which are the kernel's page cache:
on a machine with memory to spare it grows toward the size of the data whatever the node needs.
The question a capacity plan asks is different: does a node keep its throughput and restart time
when the machine gives it only N bytes? A memory cgroup answers it, because the kernel charges the
node's page cache to the group and reclaims it at the limit, as it would on a node sized that way,
and kills the process if its own memory (heap) cannot fit.

Only for benchmarks on a Linux machine where the caller may create cgroups (root here).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    """No writable memory cgroup hierarchy here: the limited run cannot be made."""


def _hierarchy() -> tuple[Path, int]:
    if (V1_ROOT / "memory.limit_in_bytes").exists() and os.access(V1_ROOT, os.W_OK):
        return V1_ROOT, 1
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and os.access(V2_ROOT, os.W_OK) and "memory" in controllers.read_text().split():
        return V2_ROOT, 2
    raise CgroupUnavailable("no writable memory cgroup (v1 at /sys/fs/cgroup/memory or v2 with the memory controller)")


@dataclass
class MemoryLimit:
    """One cgroup per node, each limited to `limit_bytes`; processes move in with `add`."""

    name: str
    limit_bytes: int

    def __post_init__(self) -> None:
        self.root, self.version = _hierarchy()
        self.groups: dict[int, Path] = {}

    def group(self, node: int) -> Path:
        path = self.groups.get(node)
        if path is None:
            path = self.root / f"{self.name}-node{node}"
            path.mkdir(exist_ok=True)
            limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
            (path / limit_file).write_text(str(self.limit_bytes))
            if self.version == 1:
                # A node must not swap its way under the limit: the figure is about memory.
                swappiness = path / "memory.swappiness"
                if swappiness.exists():
                    swappiness.write_text("0")
            self.groups[node] = path
        return path

    def add(self, node: int, pid: int) -> None:
        (self.group(node) / "cgroup.procs").write_text(str(pid))

    def figures(self) -> dict[str, dict[str, int]]:
        """Per node: peak charged bytes (page cache included), times the limit was hit, OOM kills."""
        out: dict[str, dict[str, int]] = {}
        for node, path in sorted(self.groups.items()):
            if self.version == 1:
                peak = int((path / "memory.max_usage_in_bytes").read_text())
                hits = int((path / "memory.failcnt").read_text())
                oom = _field(path / "memory.oom_control", "oom_kill")
            else:
                peak_file = path / "memory.peak"
                peak = int(peak_file.read_text()) if peak_file.exists() else int((path / "memory.current").read_text())
                hits = _field(path / "memory.events", "max")
                oom = _field(path / "memory.events", "oom_kill")
            out[str(node)] = {"peak_charged_mib": peak >> 20, "limit_hits": hits, "oom_kills": oom}
        return out

    def remove(self) -> None:
        """Remove the groups once their processes have exited (a group with members cannot go)."""
        for path in self.groups.values():
            with contextlib.suppress(OSError):
                path.rmdir()
        self.groups.clear()


def _field(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except OSError:
        pass
    return 0
