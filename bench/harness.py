"""What the benchmarks that start the service share: its processes, their CPU, a profiler, the run's identity.

Owns:
- `Server`, one server process in a session of its own (its workers stop with it), started with
  this checkout's code (`child_environment`: no COMPENSATOR_* setting of the caller's leaks in);
- `api_server`, the real `compensator api` over a `ProcessCluster`, with a quota that never holds;
- `create_producer`, a producer token with that quota;
- CPU accounting from /proc: a process tree, the whole machine, this process's children;
- `Profiler`, py-spy on one process tree for a window of known or unknown length;
- `code_revision`, `terminated_as_interrupt` (SIGTERM and SIGHUP unwind like Ctrl-C) and
  `run_in_directory` (a run in a temporary directory, every error one line).

Must never: leave a process running after its `stop` returned, or pass the caller's compensator
settings to a child.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from api.tokens import token_hash
from bench.queue_figures import caught_up
from compensator import config as configuration
from queues import Code, QueueClient, RaftClient, Role
from raft_store.testing.processes import ProcessCluster

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
MACHINE: Final = "queues.replicated:machine_factory"
PRODUCER: Final = "bench"
QUOTA_RATE_PER_S: Final = 1_000_000
QUOTA_BURST: Final = 10_000_000
"""The store's maxima for a producer's quota (queues/model.py): the benchmark is never held."""
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 15.0
READY_STREAK: Final = 5


class BenchError(Exception):
    """The benchmark cannot give a trustworthy figure; one line for the person running it."""


# ---- processes -----------------------------------------------------------------------------------
@dataclass
class Server:
    """A server process in a session of its own: stopping it stops its workers too."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was not started"
        return self.process.pid

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_S)
        with suppress(ProcessLookupError):  # workers left behind by a leader that did not stop them
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self.process = None

    def last_lines(self, count: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-count:]) or "(empty log)"

    def wait_ready(self, url: str) -> None:
        """Until `url` answers 200 `READY_STREAK` times in a row (every worker is likely up)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        streak = 0
        while streak < READY_STREAK:
            if self.process is None or self.process.poll() is not None:
                raise BenchError(f"{self.name} exited before it was ready: {self.last_lines()} (log {self.log_path})")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} not ready within {START_TIMEOUT_S:.0f} s: {self.last_lines()}")
            streak = streak + 1 if _answers_200(url) else 0
            time.sleep(0.05 if streak else 0.2)

    def wait_line(self, text: str) -> None:
        """Until the log holds `text` (a command that says when it is running, as a worker does)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while text not in self.log_path.read_text(errors="replace"):
            if self.process is None or self.process.poll() is not None:
                raise BenchError(f"{self.name} exited before it was ready: {self.last_lines()} (log {self.log_path})")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} not ready within {START_TIMEOUT_S:.0f} s: {self.last_lines()}")
            time.sleep(0.1)


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


def child_environment(**extra: str) -> dict[str, str]:
    """The caller's environment without any compensator setting, with this checkout first."""
    dropped = (configuration.CONFIG_PATH_ENV, configuration.METRICS_DIR_ENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith(configuration.ENV_PREFIX) and k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def compensator_command() -> list[str]:
    """The installed `compensator` command beside this interpreter, else `python -m compensator`."""
    script = Path(sys.executable).parent / "compensator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "compensator"]


def callback_targets(standin_url: str, name: str) -> str:
    """handlers.callback with one target at the callback stand-in: for the workers, which deliver
    to it, and the API, which refuses a callback naming any other."""
    return json.dumps({"targets": [{"name": name, "url": f"{standin_url}/callbacks/{name}"}]})


def api_server(
    cluster: ProcessCluster, root: Path, *, port: int, workers: int, extra_env: dict[str, str] | None = None
) -> Server:
    """`compensator api` on this cluster; `extra_env`: more COMPENSATOR_* settings (the callback
    targets the workers deliver to, which the API checks callbacks against)."""
    env = child_environment(**(extra_env or {}), **{
        **cluster.service_settings(),
        f"{configuration.ENV_PREFIX}API__HOST": "127.0.0.1",
        f"{configuration.ENV_PREFIX}API__PORT": str(port),
        f"{configuration.ENV_PREFIX}API__WORKERS": str(workers),
        f"{configuration.ENV_PREFIX}QUOTA__RATE_PER_S": str(QUOTA_RATE_PER_S),
        f"{configuration.ENV_PREFIX}QUOTA__BURST": str(QUOTA_BURST),
    })  # fmt: skip
    if workers > 1:  # as `compensator api` would, but inside the run's directory, removed with it
        env[configuration.METRICS_DIR_ENV] = str(root / "metrics")
        (root / "metrics").mkdir()
    return Server("compensator api", [*compensator_command(), "api"], env, root / "api.log")


# ---- CPU accounting --------------------------------------------------------------------------------
TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_s(root_pid: int) -> float:
    """User+system CPU seconds of a process and all its live descendants (uvicorn's workers), and
    of the descendants they already reaped (a PostgreSQL backend that exited)."""
    return trees_cpu_s({"tree": [root_pid]})["tree"]


def trees_cpu_s(roots: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """`tree_cpu_s` of several groups of process trees, from one reading of /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = sum(int(value) for value in fields[11:15]) / TICKS_PER_S
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    totals: dict[str, float] = {}
    for name, pids in roots.items():
        tree, frontier = set(pids), list(pids)
        while frontier:
            found = [child for child in children.get(frontier.pop(), []) if child not in tree]
            tree.update(found)
            frontier += found
        totals[name] = sum(cpu.get(pid, 0.0) for pid in tree)
    return totals


def machine_busy_cpu_s() -> float:
    """CPU seconds every core spent outside idle and iowait since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICKS_PER_S


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Profiler:
    """py-spy on a process and its subprocesses through one measured window: `seconds` long, or,
    with `seconds` None, until `finish` interrupts it (py-spy writes its output on SIGINT)."""

    executable: str
    output: Path
    output_format: str
    pid: int
    seconds: int | None
    note: str
    rate_hz: int = 100
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        command = [
            self.executable, "record", "--pid", str(self.pid), "--subprocesses", "--nonblocking",
            "--rate", str(self.rate_hz), "--format", self.output_format, "--output", str(self.output),
            *(["--duration", str(self.seconds)] if self.seconds is not None else []),
        ]  # fmt: skip
        with self.output.with_suffix(".log").open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def finish(self) -> dict[str, Any]:
        if self.process is None:
            return {"error": "not started"}
        if self.seconds is None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait((self.seconds or 0) + 30)
        except subprocess.TimeoutExpired:
            self.stop()
            code = -1
        if code != 0 or not self.output.exists():
            log = self.output.with_suffix(".log").read_text(errors="replace").strip().splitlines()
            return {"error": f"py-spy exited {code}: {' | '.join(log[-3:])}"}
        return {"file": str(self.output), "format": self.output_format, "rate_hz": self.rate_hz, "note": self.note}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# ---- the store and the run -----------------------------------------------------------------------
async def create_producer(cluster: ProcessCluster, token: str, *, reason: str) -> None:
    """The producer `PRODUCER` with `token`, and a quota that never holds a request."""
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=60.0)
    try:
        await cluster.wait_leader(raft)
        queue = QueueClient(raft)
        created = await queue.put_token(PRODUCER, Role.PRODUCER, token_hash(token), actor="bench",
                                        reason=reason)  # fmt: skip
        quota = await queue.set_quota(PRODUCER, actor="bench", rate_per_s=QUOTA_RATE_PER_S, burst=QUOTA_BURST)
    finally:
        await raft.close()
    if created.code is not Code.OK or quota.code is not Code.OK:
        raise BenchError(f"could not create the producer token: {created.code.name}, quota {quota.code.name}")


def code_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+uncommitted" if git("status", "--porcelain") else "") if head else "unknown (not a git checkout)"


@contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so every child is stopped."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_in_directory(prog: str, *, keep: bool, body: Callable[[Path], list[str]]) -> list[str]:
    """`body` in a new temporary directory, removed after (`keep`: kept and named); what went wrong,
    one line each, also printed to stderr: a `BenchError`, Ctrl-C, SIGTERM or SIGHUP stop the run
    with every process stopped (the caller's cleanups), never with a traceback."""
    root = Path(tempfile.mkdtemp(prefix=f"{prog.replace('.', '-')}-"))
    errors: list[str] = []
    try:
        with terminated_as_interrupt():
            errors += body(root)
    except BenchError as error:
        errors.append(str(error))
    except KeyboardInterrupt as interrupt:
        errors.append(f"interrupted ({str(interrupt) or 'SIGINT'}); every process was stopped")
    finally:
        if keep:
            print(f"{prog}: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    for message in errors:
        print(f"{prog}: {message}", file=sys.stderr)
    return errors


async def leader_progress(queue: QueueClient) -> dict[str, float]:
    """The leader's commit index, applied commands, fsyncs and stale reads taken so far (none if no node says it leads)."""
    for status in await queue.node_statuses():
        if status.get("role") == "leader":
            metrics = status.get("metrics") or {}
            return {"entries": float(status["commit"]), "commands": float(metrics.get("applied_commands", 0)),
                    "fsyncs": float(metrics.get("fsyncs", 0)), "stale_reads": float(metrics.get("stale_reads", 0))}  # fmt: skip
    return {}


async def leader_progress_of(cluster: ProcessCluster) -> dict[str, float]:
    """`leader_progress` through a client of its own."""
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=30.0)
    try:
        return await leader_progress(QueueClient(raft))
    finally:
        await raft.close()


def caught_up_of(cluster: ProcessCluster) -> None:
    """`caught_up` through a client of its own."""

    async def wait() -> None:
        raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=10.0, deadline_s=30.0)
        try:
            await caught_up(cluster, raft)
        finally:
            await raft.close()

    asyncio.run(wait())
