"""The operator's command line against a real API server (uvicorn on loopback) and a real store:
each command does what the API does, with the API's roles and validation, and a refusal or an
unreachable API is one line with exit 1."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from api_support import put_tokens, settings

from compensator import cli
from compensator.wiring.api import api_app
from ledger.kinds import TransferPayload, encode_payload
from queues import QueueClient, RaftClient, RedriveJob, Role
from queues.model import Enqueue
from raft_store.testing.inprocess import StoreThread
from raft_store.testing.processes import free_ports


class Served:
    def __init__(self, store: StoreThread) -> None:
        self.tokens = asyncio.run(put_tokens(store))
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        app = api_app(settings(store))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the API did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(store: StoreThread) -> Iterator[Served]:
    api = Served(store)
    try:
        yield api
    finally:
        api.stop()


def operator(
    served: Served,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *argv: str,
    role: Role = Role.OPERATOR,
) -> tuple[int, str, str]:
    monkeypatch.setenv("COMPENSATOR_API__PUBLIC_URL", served.url)
    monkeypatch.setenv("COMPENSATOR_API_TOKEN", served.tokens[role])
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert served.tokens[role] not in captured.out + captured.err
    return code, captured.out, captured.err


def test_pause_resume_and_policy_go_through_the_api(
    served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = operator(
        served, monkeypatch, capsys, "kind", "pause", "transfer", "--reason", "payment maintenance"
    )
    assert (code, err) == (0, "")
    assert [p["holder"] for p in json.loads(out)["pauses"]] == ["operator"]
    code, out, err = operator(served, monkeypatch, capsys, "kind", "pause", "transfer", "--reason", "again")
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "409" in err and "already holds" in err, err
    code, out, _ = operator(served, monkeypatch, capsys, "kind", "resume", "transfer")
    assert code == 0 and json.loads(out)["pauses"] == []

    code, out, _ = operator(served, monkeypatch, capsys, "kind", "policy", "transfer")
    policy = json.loads(out)
    policy["attempts_max"] = 5
    source = tmp_path / "policy.json"
    source.write_text(json.dumps(policy))
    code, out, err = operator(served, monkeypatch, capsys, "kind", "policy", "transfer", "--set", str(source))
    assert (code, err) == (0, "") and json.loads(out)["after"]["attempts_max"] == 5
    source.write_text(json.dumps({**policy, "attempts_max": 0}))
    code, out, err = operator(served, monkeypatch, capsys, "kind", "policy", "transfer", "--set", str(source))
    assert code == 1 and len(err.splitlines()) == 1 and "attempts_max" in err, err


def test_breakers_and_tables_and_the_roles(
    served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = operator(
        served, monkeypatch, capsys, "breaker", "force", "payment", "open", "--reason", "their outage"
    )
    assert code == 0 and next(b for b in json.loads(out) if b["downstream"] == "payment")["mode"] == "open"
    code, out, _ = operator(served, monkeypatch, capsys, "classification", "show", "payment")
    table = json.loads(out)["table"]
    source = tmp_path / "table.json"
    source.write_text(json.dumps(table))
    code, out, err = operator(
        served, monkeypatch, capsys, "classification", "set", "payment", str(source), "--reason", "same"
    )
    assert (code, err) == (0, "") and json.loads(out)["after"] == table
    code, out, err = operator(served, monkeypatch, capsys, "breaker", "list", role=Role.PRODUCER)
    assert code == 1 and len(err.splitlines()) == 1 and "403" in err, err
    code, _, err = operator(
        served, monkeypatch, capsys, "kind", "pause", "transfer", "--reason", "x", role=Role.PRODUCER
    )
    assert code == 1 and "403" in err


def test_retention_is_shown_and_set_by_an_administrator(
    served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = operator(served, monkeypatch, capsys, "retention", "show")
    assert code == 0 and json.loads(out)["retention_ms"] == 7 * 86_400_000
    code, out, err = operator(served, monkeypatch, capsys, "retention", "set", "--tombstones", "14d", "--reason", "x")
    assert code == 1 and len(err.splitlines()) == 1 and "403" in err, err  # an operator may not
    code, out, err = operator(served, monkeypatch, capsys, "retention", "set", "--tombstones", "14d",
                              "--reason", "two weeks", role=Role.ADMIN)  # fmt: skip
    assert (code, err) == (0, "") and json.loads(out)["after"]["retention_ms"] == 14 * 86_400_000
    code, out, err = operator(served, monkeypatch, capsys, "retention", "set", "--events", "1h", "--reason", "x",
                              role=Role.ADMIN)  # fmt: skip
    assert code == 1 and "422" in err and "floor" in err, err  # under the store's floor of a day
    code, out, err = operator(served, monkeypatch, capsys, "retention", "set", "--reason", "x", role=Role.ADMIN)
    assert code == 1 and "--tombstones, --events or both" in err
    with pytest.raises(SystemExit):  # argparse's one line for a duration it cannot read
        operator(served, monkeypatch, capsys, "retention", "set", "--events", "a week", "--reason", "x")
    assert "not a duration like 14d" in capsys.readouterr().err


def test_no_token_or_no_api_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("COMPENSATOR_API_TOKEN", raising=False)
    assert cli.main(["kind", "list"]) == 1
    assert (
        capsys.readouterr().err
        == "compensator kind: error: no API token: give --token-file, or set $COMPENSATOR_API_TOKEN\n"
    )
    (port,) = free_ports(1)
    monkeypatch.setenv("COMPENSATOR_API__PUBLIC_URL", f"http://127.0.0.1:{port}")
    token = tmp_path / "token"
    token.write_text("cmp_notarealtoken\n")
    assert cli.main(["kind", "list", "--token-file", str(token)]) == 1
    err = capsys.readouterr().err
    assert (
        len(err.splitlines()) == 1 and err.startswith("compensator kind: error: the API at") and "ConnectError" in err
    )


async def _dead_transfer(store: StoreThread, key: str) -> str:
    """A transfer submitted through the queue and failed permanently: a dead letter, as a worker leaves one."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        payload = encode_payload(TransferPayload(transfer_id=f"t-{key}", payer="alice", payee="bob", amount_minor=1234,
                                                 currency="CNY"))  # fmt: skip
        (created,) = await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key=f"producer:{key}",
                                                       ref_key=f"rp-{key}", payload=payload)])  # fmt: skip
        (grant,) = (await queue.lease("w", count_max=1, lease_ms=30_000)).grants
        await queue.fail(grant.message_id, grant.token, "account_closed", "closed [HTTP 422]", permanent=True)
        return f"1-{created.message_id}"
    finally:
        await queue.raft.close()


def test_dead_letters_are_listed_edited_and_redriven_with_four_eyes(
    store: StoreThread, served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    request_id = store.run(_dead_transfer(store, "dead-1"))
    code, out, err = operator(served, monkeypatch, capsys, "dead", "list", "--kind", "transfer", role=Role.REVIEWER)
    assert (code, err) == (0, "")
    (item,) = json.loads(out)["items"]
    assert (item["id"], item["error_class"], item["amount"]) == (request_id, "account_closed",
                                                                 {"amount_minor": 1234, "currency": "CNY", "amount": "12.34"})  # fmt: skip

    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({"transfer_id": "t-dead-1", "payer": "alice", "payee": "bob", "amount_minor": "x",
                                  "currency": "CNY"}))  # fmt: skip
    code, out, err = operator(served, monkeypatch, capsys, "dead", "edit", request_id, str(edited), "--reason", "typo",
                              role=Role.REVIEWER)  # fmt: skip
    assert code == 1 and len(err.splitlines()) == 1 and "payload.amount_minor" in err, err
    edited.write_text(json.dumps({"transfer_id": "t-dead-1", "payer": "alice", "payee": "carol", "amount_minor": 9_999_900,
                                  "currency": "EUR"}))  # fmt: skip
    code, out, err = operator(served, monkeypatch, capsys, "dead", "edit", request_id, str(edited), "--reason",
                              "payee's account moved", role=Role.REVIEWER)  # fmt: skip
    assert (code, err) == (0, "")
    proposed = json.loads(out)
    assert proposed["outcome"] == "proposed"  # a transfer moves money: four eyes
    number = str(proposed["proposal"]["id"])
    code, out, err = operator(served, monkeypatch, capsys, "proposal", "list", "--pending", role=Role.APPROVER)
    assert (code, err) == (0, "")
    (listed,) = json.loads(out)  # what approving it pays, in money, beside what it paid before
    assert listed["pays"]["totals"] == [{"currency": "EUR", "count": 1, "amount_minor": 9_999_900, "amount": "99999.00"}]
    assert listed["pays"]["before_totals"] == [{"currency": "CNY", "count": 1, "amount_minor": 1234, "amount": "12.34"}]
    assert listed["pays"]["items"] == [{"id": request_id, "amount": {"amount_minor": 9_999_900, "currency": "EUR",
                                                                     "amount": "99999.00"},
                                        "before": {"amount_minor": 1234, "currency": "CNY", "amount": "12.34"}}]  # fmt: skip
    code, _, err = operator(served, monkeypatch, capsys, "proposal", "approve", number, role=Role.REVIEWER)
    assert code == 1 and "403" in err  # a reviewer cannot approve
    code, out, err = operator(served, monkeypatch, capsys, "proposal", "approve", number, role=Role.APPROVER)
    assert (code, err) == (0, "")
    assert json.loads(out)["proposal"]["state"] == "approved" and len(json.loads(out)["new_ids"]) == 1
    code, out, _ = operator(served, monkeypatch, capsys, "dead", "list", role=Role.OPERATOR)
    assert json.loads(out)["items"] == []
    code, _, err = operator(served, monkeypatch, capsys, "dead", "redrive", "--reason", "x", role=Role.REVIEWER)
    assert code == 1 and "give --id" in err
    code, _, err = operator(served, monkeypatch, capsys, "dead", "redrive", "--id", "1-1", "--reason", "x", "--group", "g1",
                            role=Role.REVIEWER)  # fmt: skip
    assert code == 1 and len(err.splitlines()) == 1 and "not a group id" in err


async def _proposed_group(store: StoreThread, request_id: str, group: str) -> None:
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        action = RedriveJob(actor="reviewer", reason="bank is back", ids=(int(request_id.split("-")[1]),), rate_per_s=1,
                            group=group)  # fmt: skip
        assert (await queue.propose(action, ttl_ms=3_600_000)).proposal_id
    finally:
        await queue.raft.close()


def test_a_job_group_is_shown_approved_and_cancelled_as_one(
    store: StoreThread, served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`compensator job-group` (docs/review.md, "Job groups"): the API's group routes, one line on a refusal.
    One set holds each part here; several sets: tests/api/test_job_groups_sets.py."""
    request_id = store.run(_dead_transfer(store, "group-1"))
    group = "ab" * 16
    store.run(_proposed_group(store, request_id, group))
    code, out, err = operator(served, monkeypatch, capsys, "job-group", "show", group)
    assert (code, err) == (0, "") and json.loads(out)["state"] == "proposed"
    code, out, err = operator(served, monkeypatch, capsys, "job-group", "repropose", group, "--reason", "set was down",
                              role=Role.REVIEWER)  # fmt: skip
    assert (code, err) == (0, "") and json.loads(out)["state"] == "proposed"  # nothing expired: as it was
    code, _, err = operator(served, monkeypatch, capsys, "job-group", "approve", group, role=Role.REVIEWER)
    assert code == 1 and len(err.splitlines()) == 1 and "403" in err
    code, out, err = operator(served, monkeypatch, capsys, "job-group", "approve", group, role=Role.APPROVER)
    assert (code, err) == (0, "") and json.loads(out)["state"] == "running" and json.loads(out)["total"] == 1
    code, out, err = operator(served, monkeypatch, capsys, "job-group", "cancel", group, "--reason", "wrong batch",
                              role=Role.REVIEWER)  # fmt: skip
    assert (code, err) == (0, "") and json.loads(out)["state"] == "cancelled"
    code, _, err = operator(served, monkeypatch, capsys, "job-group", "show", "not-a-group")
    assert code == 1 and len(err.splitlines()) == 1 and "not a group id" in err
