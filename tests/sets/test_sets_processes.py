"""Sets on real processes: a control set and three sets of three node processes, `compensator
sets init` and `sets add` from the command line, and `compensator api` routing over them.

One scenario, in order: intake spread over the three sets; a fourth set added online; new keys
reach it (the API's cached table is fenced and re-read), and every earlier key replayed reaches
the set that holds it (200, the same id); then set 2 loses its majority (two nodes killed): its
keys are answered 503 with Retry-After within the store deadline while every other key is 201.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from api.tokens import new_token, token_hash
from queues import QueueClient, RaftClient, Role
from queues.sets import routing
from queues.sets.table import Epoch
from raft_store.testing.credentials import SECRET_NAME, cluster_auth
from raft_store.testing.processes import ProcessCluster, free_ports
from submission.rules import store_key

ROOT: Final = Path(__file__).resolve().parents[2]
MACHINE: Final = "queues.replicated:machine_factory"
PRODUCER: Final = "spread-producer"
STORE_DEADLINE_S: Final = 3.0


@dataclass
class Deployment:
    root: Path
    control: ProcessCluster
    sets: dict[int, ProcessCluster]
    env: dict[str, str]
    url: str
    token: str

    def addresses(self, cluster: ProcessCluster) -> str:
        return ",".join(f"{host}:{port}" for host, port in cluster.addresses())

    def compensator(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "compensator", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip


def _env(overrides: dict[str, str]) -> dict[str, str]:
    import os

    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **overrides}


async def _token(cluster: ProcessCluster) -> str:
    raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
    try:
        await cluster.wait_leader(raft)
        token = new_token()
        await QueueClient(raft).put_token(PRODUCER, Role.PRODUCER, token_hash(token), actor="test")
        return token
    finally:
        await raft.close()


async def _leaders(clusters: list[ProcessCluster]) -> None:
    for cluster in clusters:
        raft = RaftClient(cluster.addresses(), auth=cluster.auth, attempt_timeout_s=1.0, deadline_s=20.0)
        try:
            await cluster.wait_leader(raft)
        finally:
            await raft.close()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    auth = cluster_auth(tmp_path)  # one cluster secret for every set, as a deployment has
    clusters: dict[str, ProcessCluster] = {}
    for name in ("control", "set1", "set2", "set3", "set4"):
        (tmp_path / name).mkdir()
        shutil.copy(tmp_path / SECRET_NAME, tmp_path / name / SECRET_NAME)
        clusters[name] = ProcessCluster(tmp_path / name, machine=MACHINE, extra_args=["--volatile"])
    api: subprocess.Popen[bytes] | None = None
    try:
        for name in ("control", "set1", "set2", "set3"):
            clusters[name].start_all()
        token = asyncio.run(_token(clusters["control"]))  # tokens live in the control set (store.access_client)
        asyncio.run(_leaders([clusters[name] for name in ("control", "set2", "set3")]))
        port = free_ports(1)[0]
        deployment = Deployment(tmp_path, clusters["control"], {k: clusters[f"set{k}"] for k in (1, 2, 3, 4)}, {},
                                f"http://127.0.0.1:{port}", token)  # fmt: skip
        deployment.env = _env({
            "COMPENSATOR_STORE__ADDRESSES": deployment.addresses(clusters["set1"]),
            "COMPENSATOR_STORE__SECRET_FILE": str(auth.secrets.path),
            "COMPENSATOR_STORE__CONTROL_ADDRESSES": deployment.addresses(clusters["control"]),
            "COMPENSATOR_STORE__DEADLINE_S": str(STORE_DEADLINE_S), "COMPENSATOR_STORE__ATTEMPT_TIMEOUT_S": "1",
            "COMPENSATOR_API__PORT": str(port), "COMPENSATOR_API__LOG_LEVEL": "warning",
        })  # fmt: skip
        sets = [f"{k}={deployment.addresses(deployment.sets[k])}" for k in (1, 2, 3)]
        init = deployment.compensator("sets", "init", *(arg for s in sets for arg in ("--set", s)), "--reason", "test")
        assert init.returncode == 0, init.stderr
        with (tmp_path / "api.log").open("ab") as out:
            api = subprocess.Popen([sys.executable, "-m", "compensator", "api"], cwd=ROOT, env=deployment.env,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            assert api.poll() is None and time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-2000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{deployment.url}/readyz", timeout=2.0).status_code == 200:
                    break
            time.sleep(0.1)
        yield deployment
    finally:
        if api is not None:
            api.terminate()
            try:
                api.wait(15)
            except subprocess.TimeoutExpired:
                api.kill()
                api.wait()
        for cluster in clusters.values():
            cluster.stop_all()


def _body(key: str) -> dict[str, Any]:
    return {"kind": "transfer", "ref_key": f"rp:{key}", "payload": {
        "transfer_id": f"tr-{key}", "payer": "escrow", "payee": "user", "amount_minor": 1, "currency": "CNY"}}


async def _post(http: httpx.AsyncClient, deployment: Deployment, keys: list[str]) -> dict[str, httpx.Response]:
    async def one(key: str) -> tuple[str, httpx.Response]:
        headers = {"Authorization": f"Bearer {deployment.token}", "Idempotency-Key": key}
        return key, await http.post(f"{deployment.url}/v1/requests", json=_body(key), headers=headers)

    answers: dict[str, httpx.Response] = {}
    for start in range(0, len(keys), 64):
        answers.update(await asyncio.gather(*(one(key) for key in keys[start : start + 64])))
    return answers


async def _batch(http: httpx.AsyncClient, deployment: Deployment, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each key's item answer ({"status", "request"}), 1000 items to a batch."""
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        body = {"items": [{"idempotency_key": key, "request": _body(key)} for key in chunk]}
        answer = await http.post(f"{deployment.url}/v1/requests:batch", json=body,
                                 headers={"Authorization": f"Bearer {deployment.token}"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        found.update(zip(chunk, answer.json()["items"], strict=True))
    return found


def _set_of(answer: httpx.Response) -> int:
    return int(answer.json()["id"].split("-")[0])


async def test_intake_spreads_an_added_set_keeps_every_replay_home_and_a_lost_set_fails_only_its_keys(
    deployment: Deployment,
) -> None:
    async with httpx.AsyncClient(timeout=30.0) as http:
        first = [f"a-{n}" for n in range(3000)]
        items = await _batch(http, deployment, first)
        assert {item["status"] for item in items.values()} == {201}, list(items.values())[:3]
        spread = Counter(int(item["request"]["id"].split("-")[0]) for item in items.values())
        assert set(spread) == {1, 2, 3} and all(abs(n - 1000) <= 100 for n in spread.values()), spread
        ids = {key: item["request"]["id"] for key, item in items.items()}
        status = deployment.compensator("status", "--json")  # every set, and the whole store's depth
        report = json.loads(status.stdout)
        assert [(row["set"], row["healthy"]) for row in report["sets"]] == [(n, True) for n in (0, 1, 2, 3)], report
        assert sum(sum(by_state.values()) for by_state in report["depth"].values()) == 3000, report["depth"]

        deployment.sets[4].start_all()
        await _leaders([deployment.sets[4]])
        added = deployment.compensator("sets", "add", "--addresses", deployment.addresses(deployment.sets[4]),
                                       "--reason", "more room")  # fmt: skip
        assert added.returncode == 0, added.stderr
        listed = json.loads(deployment.compensator("sets", "list", "--json").stdout)
        assert [(e["epoch"], e["sets"], e["state"]) for e in listed["epochs"]] == [
            (1, [1, 2, 3], "active"), (2, [1, 2, 3, 4], "active")]  # fmt: skip

        second = [f"b-{n}" for n in range(200)]  # the API still holds epoch 1: the fence makes it re-read
        answers = await _post(http, deployment, second)
        assert {a.status_code for a in answers.values()} == {201}
        assert Counter(_set_of(a) for a in answers.values())[4] > 20
        replays = await _batch(http, deployment, first)  # a quarter of them look up their epoch-1 set
        assert {item["status"] for item in replays.values()} == {200}
        assert {key: item["request"]["id"] for key, item in replays.items()} == ids
        one = await _post(http, deployment, first[:64])  # and one at a time
        assert {key: answer.json()["id"] for key, answer in one.items()} == {k: ids[k] for k in first[:64]}

        epochs = (Epoch(1, (1, 2, 3)), Epoch(2, (1, 2, 3, 4)))
        for node in (1, 2):  # set 2 loses its majority
            deployment.sets[2].kill(node)
        third = [f"c-{n}" for n in range(120)]
        started = time.monotonic()
        answers = await _post(http, deployment, third)
        assert time.monotonic() - started < 2 * (STORE_DEADLINE_S + 2)  # two rounds of 64, each one deadline
        for key, answer in answers.items():
            # Set 2's keys, and the keys set 4 took from it: whether set 2 holds one cannot be read.
            stored = store_key(PRODUCER, key)
            if routing.candidate(stored, epochs[1]) == 2 or 2 in routing.lookups(stored, epochs):
                assert answer.status_code == 503 and answer.headers["Retry-After"], (key, answer.text)
            else:
                assert answer.status_code == 201, (key, answer.text)
        assert sum(1 for a in answers.values() if a.status_code == 503) > 10
