"""The API as it runs: a real `compensator api` process (uvicorn) over loopback HTTP, in front of
a real 3-process store, and the `compensator run` launcher that `make run` calls.

The store nodes run the queue machine in the storage mode that keeps writes in process memory
until fsync (`--volatile`), so a kill -9 loses exactly what was not fsynced. Every child process
runs this checkout's code: it starts in the repository root with the root on PYTHONPATH.

What is checked: concurrent submissions of one key create one request; a store leader killed
under a stream of submissions loses and duplicates nothing, answers 503 (never 500) while it
cannot say, and a retry with the same key settles every 503; the launcher serves the `curl` it
prints, stops every child on Ctrl-C, keeps its data and rotates its tokens, refuses a taken port
and names a child in a crash loop; the token command revokes and creates tokens that a running
API honours within its refresh interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue as queues_
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import asyncpg
import httpx
import pytest

from api.tokens import new_token, token_hash, well_formed
from ledger import pg
from ledger.request_ids import RequestId
from queues import EventType, QueueClient, RaftClient, Role
from queues.query_codec import IDS_PER_QUERY_MAX
from raft_store.testing.processes import ProcessCluster, free_ports

pytestmark = pytest.mark.slow

ROOT: Final = Path(__file__).resolve().parents[2]
MACHINE: Final = "queues.replicated:machine_factory"
STORE_DEADLINE_S: Final = 3.0
"""The API's store deadline: a request the store cannot settle is answered 503 after this long."""
SET_ID: Final = 1
PRODUCERS: Final = ("burst-producer", "chaos-producer", "revoked-producer")
HTTP_TIMEOUT_S: Final = 30.0
START_TIMEOUT_S: Final = 60.0


# ---- processes ---------------------------------------------------------------------------------


def python_path() -> str:
    """This checkout first, then whatever PYTHONPATH already named."""
    return os.pathsep.join([str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


def child_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any COMPENSATOR_ setting, on this checkout's code."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    return {**env, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1", **(overrides or {})}


def compensator(*args: str, env: Mapping[str, str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compensator", *args], cwd=ROOT, env=child_env(env), capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip


def process_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in ticks) from /proc, or None when there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """Every process below `pid` (children, their children, ...): pid -> start time."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := process_stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append((int(entry.name), stat[2]))
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        for child, started in parents.get(frontier.pop(), []):
            if child not in found:
                found[child] = started
                frontier.append(child)
    return found


def running(pid: int, started: int) -> bool:
    """Whether that very process (not a later one with its pid) still runs; a zombie has exited."""
    stat = process_stat(pid)
    return stat is not None and stat[2] == started and stat[1] != "Z"


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---- the shared stack: three store nodes and one `compensator api` ----------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    cluster: ProcessCluster
    url: str
    tokens: dict[str, str]
    """Producer name -> its token."""
    store_env: dict[str, str]
    """COMPENSATOR_STORE__ADDRESSES and __SECRET_FILE for the command line."""
    api_log: Path

    def api_log_tail(self) -> str:
        return self.api_log.read_text(errors="replace")[-3000:]

    def headers(self, producer: str, key: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.tokens[producer]}"}
        return headers if key is None else {**headers, "Idempotency-Key": key}


@contextlib.asynccontextmanager
async def store_client(stack: Stack, node: int | None = None) -> AsyncIterator[QueueClient]:
    """A queue client of the stack's store; with `node`, its stale reads go to that replica."""
    raft = RaftClient(stack.cluster.addresses(), auth=stack.cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    reader = None if node is None else RaftClient([stack.cluster.address(node)], auth=stack.cluster.auth, attempt_timeout_s=1.0, deadline_s=10.0)
    try:
        yield QueueClient(raft, reader=reader)
    finally:
        await raft.close()
        if reader is not None:
            await reader.close()


async def create_tokens(cluster: ProcessCluster) -> dict[str, str]:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        await cluster.wait_leader(raft)
        queue = QueueClient(raft)
        tokens: dict[str, str] = {}
        for name in PRODUCERS:
            tokens[name] = new_token()
            await queue.put_token(name, Role.PRODUCER, token_hash(tokens[name]), actor="test")
        return tokens
    finally:
        await raft.close()


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"`compensator api` exited {process.returncode}: {log.read_text()[-2000:]}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"`compensator api` was not ready in {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("api-stack")
    with pytest.MonkeyPatch.context() as patch:  # the store nodes ProcessCluster starts run this checkout
        patch.setenv("PYTHONPATH", python_path())
        patch.chdir(ROOT)
        cluster = ProcessCluster(root / "store", machine=MACHINE, extra_args=["--volatile"])
        cluster.start_all()
        api: subprocess.Popen[bytes] | None = None
        try:
            tokens = asyncio.run(create_tokens(cluster))
            port = free_ports(1)[0]
            store_env = cluster.service_settings()
            env = child_env({
                **store_env, "COMPENSATOR_STORE__DEADLINE_S": str(STORE_DEADLINE_S),
                "COMPENSATOR_STORE__ATTEMPT_TIMEOUT_S": "1", "COMPENSATOR_API__PORT": str(port),
                "COMPENSATOR_API__LOG_LEVEL": "warning",
            })  # fmt: skip
            log = root / "api.log"
            with log.open("ab") as out:
                api = subprocess.Popen([sys.executable, "-m", "compensator", "api"], cwd=ROOT, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, api, log)
            yield Stack(cluster=cluster, url=url, tokens=tokens, store_env=store_env, api_log=log)
        finally:
            if api is not None:
                stop_process(api)
            cluster.stop_all()


def transfer(ref_key: str, transfer_id: str, amount_minor: int = 100) -> dict[str, Any]:
    return {
        "kind": "transfer", "ref_key": ref_key,
        "payload": {"transfer_id": transfer_id, "payer": "red-packet-escrow", "payee": "user-42",
                    "amount_minor": amount_minor, "currency": "CNY"},
        "failure": {"error_class": "timeout", "text": "payment system did not answer in 2 s"},
    }  # fmt: skip


async def enqueued_per_key(queue: QueueClient, *, stale_ok: bool = False) -> Counter[str]:
    """How many `enqueued` events each stored idempotency key has in the replicated event log."""
    counts: Counter[str] = Counter()
    seq = 0
    while events := (await queue.events_after(seq, limit=10_000, stale_ok=stale_ok)).value:
        seq = events[-1].seq
        counts.update(str(event.data["idempotency_key"]) for event in events if event.type is EventType.ENQUEUED)
    return counts


async def converged(stack: Stack, timeout_s: float = 20.0) -> int:
    """The applied index every replica reached once they agree."""
    raft = RaftClient(stack.cluster.addresses(), auth=stack.cluster.auth, attempt_timeout_s=1.0, deadline_s=5.0)
    deadline = time.monotonic() + timeout_s
    applied: dict[int, int] = {}
    try:
        while time.monotonic() < deadline:
            statuses = await stack.cluster.statuses(raft)
            applied = {node: int(str(status["applied"])) for node, status in statuses.items()}
            if len(applied) == stack.cluster.size and len(set(applied.values())) == 1:
                return next(iter(applied.values()))
            await asyncio.sleep(0.1)
    finally:
        await raft.close()
    raise AssertionError(f"the replicas did not converge: {applied}")


# ---- 1. one key, 64 concurrent submissions -----------------------------------------------------


async def test_64_concurrent_posts_of_one_key_create_exactly_one_request(stack: Stack) -> None:
    key = f"burst-{uuid.uuid4().hex}"
    ref_key = f"rp-{key}"
    body = transfer(ref_key, f"tr-{key}")
    headers = stack.headers("burst-producer", key)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=stack.url, timeout=HTTP_TIMEOUT_S, limits=limits) as http:
        answers = await asyncio.gather(*(http.post("/v1/requests", json=body, headers=headers) for _ in range(64)))

    assert Counter(answer.status_code for answer in answers) == {201: 1, 200: 63}
    documents = [answer.json() for answer in answers]
    (request_id,) = {document["id"] for document in documents}
    assert all(document["replayed"] is (answer.status_code == 200) for answer, document in zip(answers, documents, strict=True))
    assert all(answer.headers["Location"] == f"/v1/requests/{request_id}" for answer in answers)

    async with store_client(stack) as queue:
        stored = (await queue.by_ref_key(ref_key)).value
        enqueued = await enqueued_per_key(queue)
    assert [(str(RequestId(SET_ID, m.message_id)), m.idempotency_key) for m in stored] == [
        (request_id, f"burst-producer:{key}")
    ]
    assert enqueued[f"burst-producer:{key}"] == 1


# ---- 2. kill -9 of the store leader under a stream of submissions ------------------------------


@dataclass(slots=True)
class Outcomes:
    """What the producers were answered, per key and in total."""

    stored: dict[str, str] = field(default_factory=dict)
    """key -> the request id its final 201 or 200 named."""
    first_stored_s: dict[str, float] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)
    unavailable: Counter[str] = field(default_factory=Counter)
    """503s by problem type."""
    unavailable_s: list[float] = field(default_factory=list)
    """When each 503 was answered."""
    problems: dict[str, list[str]] = field(default_factory=dict)
    """key -> the problem types of its 503s, for each key answered 503 at least once."""
    final: dict[str, int] = field(default_factory=dict)
    """key -> the status that settled it (201, or 200: an earlier attempt had stored it)."""
    unexpected: list[str] = field(default_factory=list)
    retry_s_max: float = 0.0

    def resolved_by(self) -> Counter[int]:
        return Counter(self.final[key] for key in self.problems if key in self.final)


async def submit_until_stored(http: httpx.AsyncClient, stack: Stack, key: str, outcomes: Outcomes) -> None:
    """POST one key until it is answered 201 or 200, retrying every 503 with the same key and body."""
    body = transfer(f"chaos-{key}", f"tr-{key}")
    headers = stack.headers("chaos-producer", key)
    started = time.monotonic()
    while time.monotonic() - started < 60:
        try:
            answer = await http.post("/v1/requests", json=body, headers=headers)
        except httpx.HTTPError as error:
            outcomes.unexpected.append(f"{key}: {error!r}")
            return
        outcomes.statuses[answer.status_code] += 1
        if answer.status_code in (200, 201):
            outcomes.stored[key] = answer.json()["id"]
            outcomes.final[key] = answer.status_code
            outcomes.first_stored_s.setdefault(key, time.monotonic())
            if key in outcomes.problems:
                outcomes.retry_s_max = max(outcomes.retry_s_max, time.monotonic() - started)
            return
        problem = answer.json()
        if answer.status_code != 503 or answer.headers.get("content-type") != "application/problem+json":
            outcomes.unexpected.append(f"{key}: {answer.status_code} {problem}")
            return
        outcomes.unavailable[problem["type"]] += 1
        outcomes.unavailable_s.append(time.monotonic())
        outcomes.problems.setdefault(key, []).append(problem["type"])
        await asyncio.sleep(float(answer.headers["Retry-After"]))
    outcomes.unexpected.append(f"{key}: still not stored after 60 s of retries")


async def produce(http: httpx.AsyncClient, stack: Stack, worker: int, stop: asyncio.Event, outcomes: Outcomes) -> None:
    run = uuid.uuid4().hex[:8]
    number = 0
    while not stop.is_set():
        number += 1
        await submit_until_stored(http, stack, f"{run}-w{worker}-{number}", outcomes)


async def stored_on_replica(stack: Stack, node: int, keys: list[str]) -> tuple[dict[str, int], Counter[str]]:
    """On one replica: stored key -> message id for `keys`, and the chaos producer's `enqueued`
    events per stored key."""
    found: dict[str, int] = {}
    async with store_client(stack, node) as queue:
        for start in range(0, len(keys), IDS_PER_QUERY_MAX):
            for view in (await queue.by_idempotency_keys(keys[start : start + IDS_PER_QUERY_MAX], stale_ok=True)).value:
                found[view.idempotency_key] = view.message_id
        events = await enqueued_per_key(queue, stale_ok=True)
    return found, Counter({key: count for key, count in events.items() if key.startswith("chaos-producer:")})


@dataclass(slots=True)
class Faults:
    """When the faults happened (monotonic seconds) and which nodes they hit."""

    leader: int = 0
    second: int = 0
    leader_killed_s: float = 0.0
    second_killed_s: float = 0.0
    restarted_s: float = 0.0


async def inject_faults(stack: Stack, faults: Faults) -> None:
    """2 s in, kill -9 the leader: the other two elect a leader within the API's deadline. 2 s
    later, kill -9 that one too: with one node of three no request can commit, for longer than
    the API's deadline, so the API must answer 503. Then start both again."""
    cluster = stack.cluster
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        await asyncio.sleep(2.0)
        faults.leader = await cluster.wait_leader(raft)
        cluster.kill(faults.leader, signal.SIGKILL)
        faults.leader_killed_s = time.monotonic()
        await asyncio.sleep(2.0)
        faults.second = await cluster.wait_leader(raft, exclude=faults.leader)
        cluster.kill(faults.second, signal.SIGKILL)
        faults.second_killed_s = time.monotonic()
        await asyncio.sleep(STORE_DEADLINE_S + 1.0)
        for node in (faults.leader, faults.second):
            cluster.start(node)
        faults.restarted_s = time.monotonic()
        await asyncio.sleep(3.0)
    finally:
        await raft.close()
        for node in (faults.leader, faults.second):  # later tests share the store
            if node and cluster.procs[node].poll() is not None:
                cluster.start(node)


def stored_between(outcomes: Outcomes, start_s: float, end_s: float) -> int:
    return sum(start_s < when < end_s for when in outcomes.first_stored_s.values())


async def test_killed_store_nodes_lose_and_duplicate_nothing_and_every_503_settles_on_retry(stack: Stack) -> None:
    outcomes, faults, stop = Outcomes(), Faults(), asyncio.Event()
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=stack.url, timeout=HTTP_TIMEOUT_S, limits=httpx.Limits(max_connections=8)) as http:
        tasks = [asyncio.create_task(produce(http, stack, worker, stop, outcomes)) for worker in range(8)]
        try:
            await inject_faults(stack, faults)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 90)
    stream_s = time.monotonic() - started

    assert not outcomes.unexpected, (outcomes.unexpected[:10], stack.api_log_tail())
    assert 500 not in outcomes.statuses and set(outcomes.statuses) <= {200, 201, 503}, stack.api_log_tail()
    assert set(outcomes.unavailable) <= {"/problems/store-unavailable", "/problems/outcome-unknown"}
    assert sum(outcomes.unavailable.values()) > 0, "the store lost its majority and the API never said so"
    assert set(outcomes.problems) <= set(outcomes.stored)  # every key answered 503 was retried until stored
    for key, problems in outcomes.problems.items():  # "nothing was stored" held: its retry created it
        if set(problems) == {"/problems/store-unavailable"}:
            assert outcomes.final[key] == 201, (key, problems, outcomes.final[key])
    assert stored_between(outcomes, started, faults.leader_killed_s) > 0
    assert stored_between(outcomes, faults.leader_killed_s, faults.second_killed_s) > 0, "no progress after the kill"
    assert stored_between(outcomes, faults.restarted_s, time.monotonic()) > 0, "no progress after the restart"

    await converged(stack)
    keys = sorted(f"chaos-producer:{key}" for key in outcomes.stored)
    answered = {f"chaos-producer:{key}": RequestId.parse(rid) for key, rid in outcomes.stored.items()}
    for node in stack.cluster.ids:
        found, enqueued = await stored_on_replica(stack, node, keys)
        assert {key: RequestId(SET_ID, message_id) for key, message_id in found.items()} == answered, node
        assert enqueued == dict.fromkeys(keys, 1), node  # nothing lost, duplicated or unexpected
        assert sum(enqueued.values()) == len(keys)
    leader_only = sum(faults.leader_killed_s < when < faults.second_killed_s for when in outcomes.unavailable_s)
    print(
        f"\nkilled node {faults.leader} (leader; {leader_only} 503s before the next kill), then node {faults.second}"
        " (its successor);"
        f" {len(keys)} keys stored in {stream_s:.1f} s; answers {dict(outcomes.statuses)};"
        f" 503s {dict(outcomes.unavailable)} on {len(outcomes.problems)} keys, settled by"
        f" {dict(outcomes.resolved_by())} within {outcomes.retry_s_max:.1f} s"
    )


# ---- 3-5. the launcher (`make run`) ---------------------------------------------------------------


class Launcher:
    """`compensator run` as a subprocess: its output read on threads, its descendants tracked by pid
    (its children start sessions of their own, so only their pids tie them to it)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "compensator", "run"], cwd=ROOT, env=child_env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queues_.Queue[str | None] = queues_.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.seen: dict[int, int] = {}
        assert self.process.stdout is not None and self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: TextIO, into: list[str], forward: bool) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))
            if forward:
                self.lines.put(line.rstrip("\n"))
        if forward:
            self.lines.put(None)

    def track(self) -> None:
        if self.process.poll() is None:
            self.seen.update(descendants(self.process.pid))

    def banner(self, timeout_s: float = START_TIMEOUT_S) -> list[str]:
        """The lines it printed up to and including the banner's last line."""
        deadline = time.monotonic() + timeout_s
        printed: list[str] = []
        while time.monotonic() < deadline:
            self.track()
            try:
                line = self.lines.get(timeout=0.2)
            except queues_.Empty:
                continue
            assert line is not None, f"the launcher exited {self.process.wait()}: {self.stderr}"
            printed.append(line)
            if line.startswith("Read it back:"):
                self.track()
                return printed
        raise AssertionError(f"no banner within {timeout_s} s: {printed} {self.stderr}")

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            self.track()
            time.sleep(0.05)
        code = self.process.poll()
        assert code is not None, f"the launcher still runs after {timeout_s} s"
        for reader in self._readers:
            reader.join(5)
        return code

    def left_running(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if running(pid, started)]

    def left_commands(self) -> dict[int, str]:
        """What each process left running is, for the failure message."""
        found: dict[int, str] = {}
        for pid in self.left_running():
            with contextlib.suppress(OSError):
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        return found

    def cleanup(self) -> None:
        """Whatever a test left: the launcher asked to stop as Ctrl-C asks it (it stops what it
        started, its PostgreSQL included: that server is no descendant by the time it runs, since
        pg_ctl daemonizes it, so a SIGKILL of the launcher alone left it running), killed if it
        does not within 30 s; then anything it started, by pid."""
        if self.process.poll() is None:
            self.track()
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.left_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class CurlAnswer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def run_curl(command: str) -> CurlAnswer:
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=30)  # bytes: HTTP's CRLFs kept
    assert done.returncode == 0, done.stderr
    head, _, body = done.stdout.decode().partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return CurlAnswer(int(status_line.split()[1]), headers, json.loads(body))


def printed_curl(banner: list[str]) -> str:
    """The submission command exactly as printed: from its `curl` line to the line with its body."""
    return printed_command(banner, " -X POST ")


def printed_grant(banner: list[str]) -> str:
    """The red-packet grant's command as printed (`curl -i` added, for the status)."""
    return printed_command(banner, "/red-packets/").replace("curl -sS ", "curl -sS -i ", 1)


def printed_command(banner: list[str], marker: str) -> str:
    """The first `curl` whose first line holds `marker`, with its continuation lines."""
    first = next(i for i, line in enumerate(banner) if line.lstrip().startswith("curl ") and marker in line)
    last = next(i for i in range(first, len(banner)) if not banner[i].endswith("\\"))
    return "\n".join(banner[first : last + 1])


def printed_token(banner: list[str], name: str) -> str:
    line = next(line for line in banner if line.lstrip().startswith(f"{name} token"))
    token = line.split()[2]
    assert well_formed(token), line
    return token


def launcher_env(tmp_path: Path) -> tuple[dict[str, str], list[int]]:
    """Environment for a launcher on free ports with its data under tmp_path, and those ports
    (the three store nodes', the API's, then the stand-ins': payment, red packet, callbacks)."""
    ports = free_ports(7)
    return {
        "COMPENSATOR_STORE__ADDRESSES": ",".join(f"127.0.0.1:{port}" for port in ports[:3]),
        "COMPENSATOR_API__PORT": str(ports[3]),
        "COMPENSATOR_HANDLERS__PAYMENT": json.dumps({"base_url": f"http://127.0.0.1:{ports[4]}"}),
        "COMPENSATOR_HANDLERS__RED_PACKET": json.dumps({"base_url": f"http://127.0.0.1:{ports[5]}"}),
        "COMPENSATOR_LOCAL__CALLBACK_PORT": str(ports[6]),
        "COMPENSATOR_LOCAL__WORKERS": "1",
        "COMPENSATOR_LOCAL__DATA_DIR": str(tmp_path / "local"),
    }, ports


def ledger_dsn(data_dir: Path) -> str:
    """The DSN of the projector's embedded PostgreSQL, once it listens (its port is line 4 of
    postmaster.pid); the server is the launcher's to stop."""
    pid_file = data_dir / "postmaster.pid"

    def port() -> int | None:
        with contextlib.suppress(OSError):
            lines = pid_file.read_text().splitlines()
            if len(lines) > 3 and lines[3].strip().isdigit():
                return int(lines[3])
        return None

    poll_until(lambda: port() is not None, timeout_s=30.0)
    address = pg.ServerAddress(host=pg.HOST, port=port() or 0, password=pg.EmbeddedPostgres(data_dir).password())
    pg.wait_until_accepting(address)
    return address.dsn


def ledger_row(dsn: str, request_id: str) -> tuple[Any, ...] | None:
    """The request's (state, amount, currency, attempts) in the compensation ledger, if there."""

    async def read() -> tuple[Any, ...] | None:
        connection = await asyncpg.connect(dsn)
        try:
            row = await connection.fetchrow(
                "SELECT state, amount_minor, currency, (SELECT count(*) FROM compensation_attempts a"
                " WHERE a.request_id = r.request_id AND a.outcome = 'SUCCEEDED') FROM compensation_requests r"
                " WHERE request_id = $1",
                request_id,
            )
            return None if row is None else tuple(row)
        except asyncpg.UndefinedTableError:  # the projector has not migrated it yet
            return None
        finally:
            await connection.close()

    return asyncio.run(read())


def interrupt_and_check(launcher: Launcher) -> float:
    """Ctrl-C: exit 0 within 20 s, and nothing it started still runs. Returns the seconds it took."""
    assert len(launcher.seen) >= 4, launcher.seen  # three nodes and the API at least
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGINT)
    assert launcher.wait(20) == 0, launcher.stderr
    stopped_s = time.monotonic() - started
    assert launcher.left_running() == [], launcher.left_commands()
    return stopped_s


def test_the_launcher_serves_its_curl_stops_everything_on_ctrl_c_and_keeps_its_data(tmp_path: Path) -> None:
    env, ports = launcher_env(tmp_path)
    first = Launcher(env)
    try:
        banner = first.banner()
        curl = printed_curl(banner)
        granted = run_curl(printed_grant(banner))  # the red packet the transfer pays, as the banner says
        assert (granted.status, granted.body) == (200, {"applied": True, "version": 1, "repeat": False}), granted
        created = run_curl(curl)
        assert created.status == 201, created
        request_id = created.body["id"]
        ref_key = created.body["ref_key"]
        assert RequestId.parse(request_id) is not None and created.headers["location"] == f"/v1/requests/{request_id}"
        token = printed_token(banner, "producer")
        url = f"http://127.0.0.1:{ports[3]}/v1/requests/{request_id}"

        def done_once() -> bool:  # the worker pays it through the payment stand-in
            view = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_TIMEOUT_S).json()
            return bool(view["state"] == "done" and view["attempts"] == 1)

        done_after_s = poll_until(done_once, timeout_s=2.0)
        dsn = ledger_dsn(tmp_path / "local" / "pg" / "data")
        poll_until(lambda: ledger_row(dsn, request_id) == ("SUCCEEDED", 888, "CNY", 1), timeout_s=10.0)
        again = run_curl(curl)
        assert (again.status, again.body["id"], again.body["replayed"]) == (200, request_id, True)
        assert again.body["state"] == "done"
        other_body = curl.replace('"amount_minor": 888', '"amount_minor": 889')
        assert other_body != curl
        reused = run_curl(other_body)
        assert (reused.status, reused.headers["content-type"]) == (422, "application/problem+json"), reused
        assert reused.body["type"] == "/problems/idempotency-key-reused"
        old_token = printed_token(banner, "producer")
        first_stop_s = interrupt_and_check(first)
    finally:
        first.cleanup()
    assert not any(listening(port) for port in ports)

    second = Launcher(env)
    try:
        new_token_ = printed_token(second.banner(), "producer")
        assert new_token_ != old_token
        url = f"http://127.0.0.1:{ports[3]}/v1/requests/{request_id}"
        shown = httpx.get(url, headers={"Authorization": f"Bearer {new_token_}"}, timeout=HTTP_TIMEOUT_S)
        assert shown.status_code == 200, shown.text
        assert (shown.json()["id"], shown.json()["ref_key"]) == (request_id, ref_key)
        refused = httpx.get(url, headers={"Authorization": f"Bearer {old_token}"}, timeout=HTTP_TIMEOUT_S)
        assert refused.status_code == 401 and refused.json()["type"] == "/problems/unauthenticated"
        second_stop_s = interrupt_and_check(second)
    finally:
        second.cleanup()
    print(f"\ndone {done_after_s:.2f} s after the curl; launcher stopped in {first_stop_s:.1f} s, then in {second_stop_s:.1f} s")


@pytest.mark.parametrize("taken", ["store node 2", "api"])
def test_the_launcher_refuses_a_taken_port_in_one_line_and_starts_nothing(tmp_path: Path, taken: str) -> None:
    env, ports = launcher_env(tmp_path)
    port = ports[1] if taken == "store node 2" else ports[3]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        started = time.monotonic()
        done = compensator("run", env=env, timeout_s=30)
        took_s = time.monotonic() - started
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], done.stderr
    assert took_s < 10, took_s
    assert not (tmp_path / "local").exists()  # no node was started: none made its data directory or log
    assert not any(listening(other) for other in ports if other != port)


def test_the_launcher_names_a_child_in_a_crash_loop_and_leaves_nothing_running(tmp_path: Path) -> None:
    env, _ = launcher_env(tmp_path)
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "node2").write_text("not a directory")
    launcher = Launcher(env)
    try:
        started = time.monotonic()
        code = launcher.wait(60)
        took_s = time.monotonic() - started
        left = launcher.left_running()  # before cleanup() kills what the launcher should have stopped
    finally:
        launcher.cleanup()
    assert code == 1, (launcher.stdout, launcher.stderr)
    assert len(launcher.stderr) == 1, launcher.stderr
    assert "node 2" in launcher.stderr[0] and "FileExistsError" in launcher.stderr[0], launcher.stderr
    assert launcher.seen and left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    banner = any(line.startswith("compensator is running") for line in launcher.stdout)
    print(f"\ncrash loop named after {took_s:.1f} s (banner printed first: {banner}): {launcher.stderr[0]}")


def test_ctrl_c_while_the_launcher_starts_stops_it_at_once(tmp_path: Path) -> None:
    env, _ = launcher_env(tmp_path)
    launcher = Launcher(env)
    try:
        deadline = time.monotonic() + 20
        while len(launcher.seen) < 3 and time.monotonic() < deadline:  # the nodes are starting
            launcher.track()
            time.sleep(0.01)
        started = time.monotonic()
        launcher.process.send_signal(signal.SIGINT)
        code = launcher.wait(15)
        took_s = time.monotonic() - started
        left = launcher.left_running()  # before cleanup() kills what the launcher should have stopped
    finally:
        launcher.cleanup()
    assert code == 130, (launcher.stdout, launcher.stderr)
    assert not any(line.startswith("compensator is running") for line in launcher.stdout), launcher.stdout
    assert launcher.seen and left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    assert took_s < 10, took_s


# ---- 6. tokens revoked and created by the command line, honoured by a running API --------------


def poll_until(condition: Any, timeout_s: float, interval_s: float = 0.05) -> float:
    """Seconds until `condition()` held; fails after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s"
        time.sleep(interval_s)
    return time.monotonic() - started


def test_a_token_revoked_or_created_by_the_command_line_is_honoured_within_seconds(stack: Stack) -> None:
    name = "revoked-producer"
    key = f"revoke-{uuid.uuid4().hex}"
    body = transfer(f"rp-{key}", f"tr-{key}")
    with httpx.Client(base_url=stack.url, timeout=HTTP_TIMEOUT_S) as http:
        created = http.post("/v1/requests", json=body, headers=stack.headers(name, key))
        assert created.status_code == 201, created.text
        path = f"/v1/requests/{created.json()['id']}"

        def answers_with(token: str) -> int:
            return http.get(path, headers={"Authorization": f"Bearer {token}"}).status_code

        revoked = compensator("token", "revoke", "--name", name, "--actor", "test", "--reason", "leaked", env=stack.store_env)
        assert revoked.returncode == 0 and revoked.stdout == "", revoked
        revoke_s = poll_until(lambda: answers_with(stack.tokens[name]) == 401, 3.0)
        for _ in range(10):  # and it stays refused
            assert http.post("/v1/requests", json=body, headers=stack.headers(name, key)).status_code == 401
            time.sleep(0.05)

        made = compensator("token", "create", "--name", name, "--role", "producer", "--actor", "test", env=stack.store_env)
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert made.stdout == f"{token}\n" and well_formed(token) and token not in made.stderr
        create_s = poll_until(lambda: answers_with(token) == 200, 1.0)
        assert answers_with(stack.tokens[name]) == 401

    listed = compensator("token", "list", env=stack.store_env)
    assert listed.returncode == 0, listed.stderr
    entries = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {entry["name"] for entry in entries} == set(PRODUCERS)
    secrets = [token, *stack.tokens.values()]
    secrets += [token_hash(t).hex() for t in secrets]
    for entry in entries:
        assert not {"hash", "secret_hash", "token", "secret"} & set(entry), entry
    assert not any(secret in listed.stdout or secret in listed.stderr for secret in secrets)
    assert next(e for e in entries if e["name"] == name)["revoked_at"] is None  # rotation undid the revocation
    print(f"\nrevocation honoured after {revoke_s:.2f} s; a new token after {create_s:.2f} s")



# ---- 7. the whole path in one trace: API, store, worker, handler, stand-in ------------------------


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    role: str
    start_ns: int
    attributes: dict[str, Any]


class OtlpReceiver:
    """A collector stand-in: OTLP/HTTP protobuf on loopback, as the processes' exporters send it."""

    def __init__(self) -> None:
        import gzip
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[ReceivedSpan] = []
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                export = ExportTraceServiceRequest.FromString(body)
                for resource_spans in export.resource_spans:
                    resource = {a.key: a.value for a in resource_spans.resource.attributes}
                    role = resource["service.instance.role"].string_value if "service.instance.role" in resource else ""
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                            received.append(ReceivedSpan(span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                                         span.name, span.kind, role, span.start_time_unix_nano,
                                                         attributes))  # fmt: skip
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_one_request_is_one_trace_from_the_api_to_the_stand_in(tmp_path: Path) -> None:
    """The on-call question "what happened to this request?" answered by one trace: the API's span,
    its store write, the worker's attempt (ref key and attempt number), the handler's call and the
    payment system's side of it, each the child of the one before, exported by five processes."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    receiver = OtlpReceiver()
    env, ports = launcher_env(tmp_path)
    env |= {"COMPENSATOR_TELEMETRY__EXPORTER": "otlp", "COMPENSATOR_TELEMETRY__OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip
    launcher = Launcher(env)
    try:
        banner = launcher.banner()
        created = run_curl(printed_curl(banner))
        assert created.status == 201, created
        token = printed_token(banner, "producer")
        url = f"http://127.0.0.1:{ports[3]}/v1/requests/{created.body['id']}"
        poll_until(lambda: httpx.get(url, headers={"Authorization": f"Bearer {token}"}).json()["state"] == "done", 10.0)
        ref_key = created.body["ref_key"]

        def whole() -> list[ReceivedSpan] | None:
            posts = [s for s in list(receiver.spans) if s.name == "POST /v1/requests" and s.role == "api"]
            if not posts:
                return None
            trace_spans = [s for s in list(receiver.spans) if s.trace_id == posts[0].trace_id]
            # Whole once the stand-in's span is in and every parent named is too: each process
            # exports on its own schedule, and a CLIENT span ends (and leaves) after its SERVER.
            ids = {s.span_id for s in trace_spans}
            closed = all(not s.parent_id or s.parent_id == "0" * 16 or s.parent_id in ids for s in trace_spans)
            return trace_spans if closed and any(s.role == "standins" for s in trace_spans) else None

        poll_until(lambda: whole() is not None, 15.0)
        spans = whole()
        assert spans is not None
    finally:
        launcher.cleanup()
        receiver.close()
    by_id = {span.span_id: span for span in spans}

    def chain_to_root(span: ReceivedSpan) -> list[ReceivedSpan]:
        chain = [span]
        while chain[-1].parent_id and chain[-1].parent_id != "0" * 16:
            chain.append(by_id[chain[-1].parent_id])  # a parent outside the trace fails here
        return chain[::-1]

    leaf = next(span for span in spans if span.role == "standins")
    chain = chain_to_root(leaf)
    assert [(span.role, span.kind, span.name) for span in chain] == [
        ("api", Span.SPAN_KIND_SERVER, "POST /v1/requests"),
        ("api", Span.SPAN_KIND_CLIENT, "store.enqueue"),
        ("worker", Span.SPAN_KIND_CONSUMER, "attempt transfer"),
        ("worker", Span.SPAN_KIND_CLIENT, "POST payment"),
        ("standins", Span.SPAN_KIND_SERVER, "payment POST"),
    ], chain
    assert [span.start_ns for span in chain] == sorted(span.start_ns for span in chain)
    attempt = chain[2].attributes
    assert (attempt["compensator.ref_key"], attempt["compensator.attempt"]) == (ref_key, 1), attempt
    assert attempt["compensator.outcome"] == "succeeded"
    assert chain[3].attributes["http.response.status_code"] == chain[4].attributes["http.response.status_code"] == 201
