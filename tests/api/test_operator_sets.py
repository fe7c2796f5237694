"""The operator routes with several sets (docs/sets.md, "What is cluster-wide, and where"): a pause
through the API holds in every set; with a set down, a pause or a breaker's mode answers 503
`partially-applied` naming the sets that applied it and those that did not (one line for the
command line), and the settings repair brings the set in line once it is back. The control set
and three sets are one-node stores in this process, sharing one cluster secret."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import running_api, transfer
from sets_support import set_stores

from api.services import ApiServices
from api.tokens import new_token, token_hash
from compensator.cli import main
from compensator.commands.operator import _problem_line
from delay.policy import RetryPolicy
from queues import QueueClient, RaftClient, Role, SetsClient, cluster_settings
from queues.sets import routing, table
from queues.sets.client import ControlSet
from queues.sets.settings import REPAIR_ACTOR, Document, Pause, Policy
from raft_store.testing.inprocess import StoreThread
from raft_store.testing.processes import free_ports
from submission.rules import store_key


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-3, one secret for all (as a deployment has)."""
    with set_stores(tmp_path) as started:
        yield started


def client(thread: StoreThread) -> QueueClient:
    return QueueClient(RaftClient([thread.address], auth=thread.auth, attempt_timeout_s=0.5, deadline_s=2))


async def holders(thread: StoreThread) -> list[str]:
    queue = client(thread)
    try:
        return [p.holder for v in (await queue.kinds()).value if v.kind == "transfer" for p in v.pauses]
    finally:
        await queue.raft.close()


async def test_a_pause_holds_in_every_set_and_a_set_down_is_named_then_repaired(
    stores: dict[int, StoreThread],
) -> None:
    control = ControlSet(client(stores[0]))
    await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                        actor="test", reason="init")  # fmt: skip
    await control.queue.raft.close()
    async with running_api(stores[1], store__control_addresses=stores[0].addresses, store__sets_refresh_s="1",
                           store__deadline_s="1", store__attempt_timeout_s="0.5") as api:
        operator = api.auth(Role.OPERATOR)
        answer = await api.client.post("/v1/kinds/transfer/pause", json={"reason": "outage", "holder": "ops:a"},
                                       headers=operator)  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["paused"] is True
        assert [await holders(stores[s]) for s in (1, 2, 3)] == [["ops:a"]] * 3
        again = await api.client.post("/v1/kinds/transfer/pause", json={"reason": "outage", "holder": "ops:a"},
                                      headers=operator)  # fmt: skip
        assert again.status_code == 409  # held in every set: as one set answers

        stores[2].stop_node()
        answer = await api.client.post("/v1/kinds/transfer/pause", json={"reason": "outage", "holder": "ops:b"},
                                       headers=operator)  # fmt: skip
        assert answer.status_code == 503 and answer.headers["retry-after"]
        problem = answer.json()
        assert problem["type"] == "/problems/partially-applied"
        assert (problem["applied_sets"], problem["unapplied_sets"]) == ([1, 3], [2])
        line = _problem_line(503, answer.headers["content-type"], answer.text)
        assert "applied in sets 1,3" in line and "not applied in sets 2" in line and "safe" in line
        mode = await api.client.put("/v1/breakers/payment", json={"mode": "open", "reason": "drill"}, headers=operator)
        assert mode.status_code == 503 and mode.json()["unapplied_sets"] == [2]
        fortnight = 14 * 86_400_000
        kept = await api.client.put("/v1/retention", json={"retention_ms": fortnight, "reason": "two weeks"},
                                    headers=api.auth(Role.ADMIN))  # fmt: skip
        assert kept.status_code == 503 and kept.json()["unapplied_sets"] == [2]
        services: ApiServices = api.app.state.services
        for _ in range(100):  # the on-call engineer sees which set the repair cannot compare
            if 'compensator_api_settings_unverified{set="2"} 1.0' in services.metrics.exposition().decode():
                break
            await asyncio.sleep(0.1)
        text = services.metrics.exposition().decode()
        assert 'compensator_api_settings_unverified{set="2"} 1.0' in text
        assert 'compensator_api_settings_unverified{set="1"} 0.0' in text

        stores[2].start_node()
        for _ in range(100):  # the API's settings repair runs every store.sets_refresh_s (1 s here)
            if await holders(stores[2]) == ["ops:a", "ops:b"]:
                break
            await asyncio.sleep(0.1)
        assert await holders(stores[2]) == ["ops:a", "ops:b"]
        for _ in range(100):  # the pass that repaired it has reported by the next one
            if 'compensator_api_settings_unverified{set="2"} 0.0' in services.metrics.exposition().decode():
                break
            await asyncio.sleep(0.1)
        text = services.metrics.exposition().decode()
        assert 'compensator_api_settings_unverified{set="2"} 0.0' in text
        # the pause, the breaker's mode and the retention
        assert 'compensator_api_settings_repaired_total{set="2"} 3.0' in text
        assert 'compensator_api_settings_repaired_total{set="1"}' not in text
        assert services.sets is not None and await services.sets.repair_settings() == {}  # in line now
        queue = client(stores[2])
        try:
            documents = (await queue.documents("breakers")).value.documents
        finally:
            await queue.raft.close()
        assert [d.name for d in documents] == ["payment"]
        for s in (1, 2, 3):
            queue = client(stores[s])
            try:
                assert (await queue.retention()).value.retention_ms == fortnight
            finally:
                await queue.raft.close()
        resumed = await api.client.post("/v1/kinds/transfer/resume", json={"holder": "ops:b"}, headers=operator)
        assert resumed.status_code == 200 and [await holders(stores[s]) for s in (1, 2, 3)] == [["ops:a"]] * 3


def test_sets_add_copies_the_intended_settings_to_the_new_set_before_activating_it(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """`compensator sets add`, in this process: set 3 joins sets 1 and 2 holding their pause and
    policy, written there by the settings repair's actor, before its epoch is active."""

    async def prepare() -> None:
        control = ControlSet(client(stores[0]))
        try:
            await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2)}), expected_version=0,
                                actor="test", reason="init")  # fmt: skip
            sets = await SetsClient.from_control(control, connect=lambda _s, a: client(
                next(t for t in stores.values() if t.addresses == a[0])))  # fmt: skip
            try:
                for setting in (Pause(kind="transfer", holder="ops:a", reason="outage"),
                                Policy(kind="transfer", policy=RetryPolicy(attempts_max=4))):  # fmt: skip
                    assert (await sets.broadcast(setting, actor="alice")).applied == [1, 2]
            finally:
                await sets.close()
        finally:
            await control.queue.raft.close()

    asyncio.run(prepare())
    monkeypatch.setenv("COMPENSATOR_STORE__ADDRESSES", stores[1].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__CONTROL_ADDRESSES", stores[0].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__SECRET_FILE", str(stores[1].secret_file))
    monkeypatch.setenv("COMPENSATOR_STORE__DEADLINE_S", "1")  # how long a command waits for a set that is down
    monkeypatch.setenv("COMPENSATOR_STORE__ATTEMPT_TIMEOUT_S", "0.5")
    assert main(["sets", "settings"]) == 0
    assert capsys.readouterr().out.splitlines() == ["pause/transfer/ops:a: in every set", "policy/transfer: in every set"]
    assert main(["sets", "add", "--addresses", stores[3].addresses, "--reason", "grow"]) == 0
    assert "set 3: 2 cluster-wide setting(s) copied" in capsys.readouterr().err

    async def check() -> None:
        queue = client(stores[3])
        try:
            kinds = {view.kind: view for view in (await queue.kinds()).value}
            assert [p.holder for p in kinds["transfer"].pauses] == ["ops:a"]
            assert kinds["transfer"].policy == RetryPolicy(attempts_max=4)
            audit = (await queue.audit_log(limit=5)).value.entries
            assert {entry.actor for entry in audit} == {REPAIR_ACTOR}
            assert any("alice" in entry.reason for entry in audit)
        finally:
            await queue.raft.close()

    asyncio.run(check())

    # A write that set 2 missed: `sets settings` names it (exit 1) and --repair applies it.
    stores[2].stop_node()
    mode = Document(namespace="breakers", name="payment", body=b'{"mode":"open","reason":"r"}', reason="drill")

    async def partial() -> list[int]:
        control = ControlSet(client(stores[0]))
        found, _ = await control.read()
        assert found is not None
        sets = SetsClient(found, connect=lambda _s, a: client(next(t for t in stores.values() if t.addresses == a[0])),
                          control=control)  # fmt: skip
        try:
            return (await sets.broadcast(mode, actor="alice")).unreachable
        finally:
            await sets.close()

    assert asyncio.run(partial()) == [2]
    assert main(["sets", "settings"]) == 1
    printed = capsys.readouterr()
    assert "set 2: does not answer" in printed.out and "sets 2 do not answer" in printed.err
    stores[2].start_node()
    assert main(["sets", "settings"]) == 1
    printed = capsys.readouterr()
    assert "document/breakers/payment: missing in sets 2" in printed.out.splitlines()
    assert "sets 2 miss intended settings" in printed.err
    assert main(["sets", "settings", "--repair"]) == 0
    assert capsys.readouterr().out.splitlines() == ["set 2: re-applied document/breakers/payment"]
    assert main(["sets", "settings"]) == 0


def test_settings_written_before_the_fan_out_are_adopted_from_one_set_and_repaired_into_the_others(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """An upgraded deployment: set 1 holds a pause, a policy and a breaker's mode written before
    intents existed (straight to the set), and a breaker's own pause. `sets settings --adopt 1`
    records them as intended (never the breaker's pause, never over an intent that exists), and
    `--repair` then gives them to set 2."""

    async def prepare() -> None:
        control = ControlSet(client(stores[0]))
        home = client(stores[1])
        try:
            await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2)}), expected_version=0,
                                actor="test", reason="init")  # fmt: skip
            await home.pause("transfer", "ops:old", "outage from before", actor="bob")
            await home.pause("transfer", "breaker:payment", "tripped", actor="worker-1")
            await home.set_policy("transfer", RetryPolicy(attempts_max=5), actor="bob", reason="slower")
            await home.put_document("breakers", "payment", b'{"mode":"closed","reason":"r"}', actor="bob", reason="r")
            # The policy of 'list_update' was given after the upgrade: its intent is newer, and stays.
            await cluster_settings.record(control.queue, Policy(kind="list_update", policy=RetryPolicy(attempts_max=9)),
                                          actor="alice")  # fmt: skip
        finally:
            await control.queue.raft.close()
            await home.raft.close()

    asyncio.run(prepare())
    monkeypatch.setenv("COMPENSATOR_STORE__ADDRESSES", stores[1].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__CONTROL_ADDRESSES", stores[0].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__SECRET_FILE", str(stores[1].secret_file))
    assert main(["sets", "settings", "--adopt", "7", "--reason", "upgrade"]) == 1  # no such set: nothing recorded
    assert "no set 7" in capsys.readouterr().err
    assert main(["sets", "settings", "--adopt", "1", "--reason", "upgrade"]) == 0
    adopted = capsys.readouterr().out.splitlines()
    assert "adopted pause/transfer/ops:old" in adopted and "adopted policy/transfer" in adopted
    assert "adopted document/breakers/payment" in adopted
    assert not any("breaker:payment" in line or "policy/list_update" in line for line in adopted), adopted
    assert main(["sets", "settings", "--repair"]) == 0
    assert main(["sets", "settings"]) == 0  # every set holds every intended setting now
    capsys.readouterr()

    async def check() -> None:
        queue = client(stores[2])
        try:
            kinds = {view.kind: view for view in (await queue.kinds()).value}
            assert [p.holder for p in kinds["transfer"].pauses] == ["ops:old"]  # not the breaker's
            assert kinds["transfer"].policy == RetryPolicy(attempts_max=5)
            assert kinds["list_update"].policy == RetryPolicy(attempts_max=9)  # the newer intent, not set 1's
            documents = (await queue.documents("breakers")).value.documents
            assert [(d.name, d.body) for d in documents] == [("payment", b'{"mode":"closed","reason":"r"}')]
        finally:
            await queue.raft.close()

    asyncio.run(check())


def test_tokens_and_users_live_in_the_control_set_so_the_home_set_down_stops_only_its_keys(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """With several sets the API reads tokens (and review users) from the control set: with set 1
    (the home set) down the API stays ready, takes the other sets' keys, refuses set 1's with 503,
    and a token created meanwhile (`compensator token create`, written to the control set) lets its
    holder in. A token an older version wrote to set 1 is copied over by `sets access --adopt 1`."""
    epoch = table.Epoch(1, (1, 2, 3))

    async def prepare() -> None:
        control = ControlSet(client(stores[0]))
        home = client(stores[1])
        try:
            await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                                actor="test", reason="init")  # fmt: skip
            await home.put_token("old-producer", Role.PRODUCER, token_hash(old_token), actor="bob", reason="v1")
        finally:
            await control.queue.raft.close()
            await home.raft.close()

    old_token = new_token()
    asyncio.run(prepare())
    monkeypatch.setenv("COMPENSATOR_STORE__ADDRESSES", stores[1].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__CONTROL_ADDRESSES", stores[0].addresses)
    monkeypatch.setenv("COMPENSATOR_STORE__SECRET_FILE", str(stores[1].secret_file))
    monkeypatch.setenv("COMPENSATOR_STORE__DEADLINE_S", "1")
    monkeypatch.setenv("COMPENSATOR_STORE__ATTEMPT_TIMEOUT_S", "0.5")

    async def scenario() -> None:
        async with running_api(stores[1], store__control_addresses=stores[0].addresses, store__sets_refresh_s="1",
                               store__deadline_s="1", store__attempt_timeout_s="0.5") as api:  # fmt: skip
            old = {"Authorization": f"Bearer {old_token}"}
            assert (await api.client.get("/v1/requests/1-1", headers=old)).status_code == 401  # not adopted yet
            stores[1].stop_node()
            await asyncio.sleep(1.1)  # past the readiness cache
            ready = await api.client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["sets_down"] == [1], ready.text
            keys = [f"k{n}" for n in range(12)]
            answers = {key: await api.client.post("/v1/requests", json=transfer(key), headers={
                **api.auth(Role.PRODUCER), "Idempotency-Key": key}) for key in keys}  # fmt: skip
            for key, answer in answers.items():
                home = routing.candidate(store_key("producer", key), epoch)
                assert answer.status_code == (503 if home == 1 else 201), (key, home, answer.text)
            assert {routing.candidate(store_key("producer", k), epoch) for k in keys} == {1, 2, 3}
            # What every set holds alike is read from another set while the home set is down; the
            # kinds' counts span the sets, so a count with a set missing is a 503, not a smaller number.
            operator = api.auth(Role.OPERATOR)
            for path in ("/v1/kinds/transfer/policy", "/v1/breakers", "/v1/retention",
                         "/v1/downstreams/payment/classification"):  # fmt: skip
                answer = await api.client.get(path, headers=operator)
                assert answer.status_code == 200, (path, answer.text)
            assert (await api.client.get("/v1/kinds/nothing/policy", headers=operator)).status_code == 404
            assert (await api.client.get("/v1/kinds", headers=operator)).status_code == 503

            assert await asyncio.to_thread(main, ["token", "create", "--name", "late", "--role", "producer"]) == 0
            late = {"Authorization": f"Bearer {capsys.readouterr().out.strip()}"}
            key = next(f"late-{n}" for n in range(100) if routing.candidate(store_key("late", f"late-{n}"), epoch) != 1)

            async def submitted() -> int:
                answer = await api.client.post("/v1/requests", json=transfer(key), headers={**late, "Idempotency-Key": key})
                return answer.status_code

            for _ in range(50):  # the API's token cache refreshes every 0.2 s here
                if await submitted() != 401:
                    break
                await asyncio.sleep(0.1)
            assert await submitted() in (200, 201)
            stores[1].start_node()
            kinds = {k["kind"]: k for k in (await api.client.get("/v1/kinds", headers=operator)).json()}
            placed = sum(1 for a in answers.values() if a.status_code == 201) + 1  # and the late producer's
            assert kinds["transfer"]["counts"] == {"ready": placed}  # every set's, summed
            assert kinds["transfer"]["oldest_due_age_ms"] is not None

            assert await asyncio.to_thread(main, ["sets", "access", "--adopt", "1", "--reason", "upgrade"]) == 0
            assert "copied token old-producer (producer)" in capsys.readouterr().out.splitlines()
            for _ in range(50):
                if (await api.client.get("/v1/requests/1-1", headers=old)).status_code != 401:
                    break
                await asyncio.sleep(0.1)
            assert (await api.client.get("/v1/requests/1-1", headers=old)).status_code in (200, 404)

    asyncio.run(scenario())


def test_sets_addresses_names_a_replaced_node_keeping_a_majority_and_the_set_answering_there(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """`compensator sets addresses` after a node of set 2 was replaced: written (audited in the
    control set's document events) when the new list keeps a majority and the set answers there;
    refused in one line, the table unchanged, when it keeps no majority or nothing answers."""
    dead = [f"127.0.0.1:{port}" for port in free_ports(4)]  # nothing listens there
    before = table.first_table({1: (stores[1].addresses,), 2: (stores[2].addresses, dead[0], dead[1])})

    async def control_table(write: bool) -> table.SetTable:
        control = ControlSet(client(stores[0]))
        try:
            if write:
                await control.write(before, expected_version=0, actor="test", reason="init")
            found, _ = await control.read()
            assert found is not None
            return found
        finally:
            await control.queue.raft.close()

    asyncio.run(control_table(write=True))
    for name, value in {"ADDRESSES": stores[1].addresses, "CONTROL_ADDRESSES": stores[0].addresses,
                        "SECRET_FILE": str(stores[1].secret_file), "DEADLINE_S": "1", "ATTEMPT_TIMEOUT_S": "0.5"}.items():  # fmt: skip
        monkeypatch.setenv(f"COMPENSATOR_STORE__{name}", value)
    for addresses, says in [((stores[3].addresses, dead[2], dead[3]), "keep 0 of its 3"),
                            ((dead[0], dead[1], dead[2]), "does not answer")]:  # fmt: skip
        assert main(["sets", "addresses", "--set", "2", "--addresses", ",".join(addresses), "--reason", "r"]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("compensator sets: ") and says in line, line
        assert asyncio.run(control_table(write=False)) == before
    now = (stores[2].addresses, dead[0], dead[2])  # node 3 replaced
    assert main(["sets", "addresses", "--set", "2", "--addresses", ",".join(now), "--reason", "node 3 replaced"]) == 0
    assert capsys.readouterr().err.strip() == f"set 2: {','.join(now)}"
    after = asyncio.run(control_table(write=False))
    assert after.addresses() == {1: (stores[1].addresses,), 2: now} and after.epochs == before.epochs
    assert main(["sets", "list"]) == 0
    assert f"set 2: {','.join(now)}" in capsys.readouterr().out.splitlines()
