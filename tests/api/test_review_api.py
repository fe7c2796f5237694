"""The review endpoints: every endpoint x every role, four eyes (a proposer approving their own is
refused), edits validated and shown as a diff, discards with a reason code, the audit view and its
filters, and the ref timeline's audit entries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import Api, running_api, transfer

from api.review_policy import FourEyes, diff
from compensator import config as configuration
from compensator.wiring.api import four_eyes
from queues import MessageView, QueueConfig, Role, State
from queues.replicated import DB_NAME, ReplicatedQueueMachine
from raft_store.testing.inprocess import StoreThread, running_store

P, OP, R, A, V, ADMIN = Role.PRODUCER, Role.OPERATOR, Role.REVIEWER, Role.APPROVER, Role.VIEWER, Role.ADMIN


def list_update(key: str, amount_minor: int = 100) -> dict[str, Any]:
    return {"kind": "list_update", "ref_key": f"rp-{key}",
            "payload": {"red_packet_id": f"rp-{key}", "receiver": "user-7", "version": 1,
                        "amount_minor": amount_minor, "currency": "CNY"}}  # fmt: skip


async def dead(api: Api, *bodies: dict[str, Any]) -> list[str]:
    """Requests submitted through the API, then dead-lettered by a worker's permanent failure."""
    ids = []
    for index, body in enumerate(bodies):
        answer = await api.client.post("/v1/requests", json=body,
                                       headers={**api.auth(P), "Idempotency-Key": f"{body['ref_key']}-{index}"})  # fmt: skip
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    ours = {int(request_id.split("-")[1]) for request_id in ids}
    for grant in (await api.queue.lease("w", count_max=1000, lease_ms=30_000)).grants:
        if grant.message_id in ours:
            await api.queue.fail(grant.message_id, grant.token, "insufficient_funds", permanent=True)
        else:  # a request an earlier step of the test redrove: not this helper's to fail
            await api.queue.release(grant.message_id, grant.token)
    return ids


async def post(api: Api, role: Role | None, path: str, body: dict[str, Any]) -> httpx.Response:
    return await api.client.post(path, json=body, headers=api.auth(role) if role else {})


async def test_every_review_endpoint_by_every_role(api: Api) -> None:
    transfer_id, edit_id, discard_id = await dead(api, transfer("m1"), list_update("m2"), list_update("m3"))
    proposed = await post(api, R, "/v1/review/redrive", {"ids": [transfer_id], "reason": "matrix"})
    assert proposed.status_code == 202, proposed.text
    to_approve = proposed.json()["proposal"]["id"]
    again = await post(api, R, "/v1/review/redrive", {"ids": [transfer_id], "reason": "matrix"})
    to_reject = again.json()["proposal"]["id"]
    edited = {**list_update("m2")["payload"], "version": 2}
    matrix: list[tuple[str, str, dict[str, Any] | None, frozenset[Role]]] = [
        ("POST", "/v1/review/redrive", {"ids": [transfer_id], "reason": "m"}, frozenset({R})),
        ("POST", f"/v1/review/requests/{edit_id}/edit", {"payload": edited, "reason": "m"}, frozenset({R})),
        ("POST", f"/v1/review/requests/{discard_id}/discard", {"reason_code": "duplicate", "comment": "m"},
         frozenset({R})),
        ("GET", "/v1/review/proposals", None, frozenset({OP, R, A, V})),
        ("POST", f"/v1/review/proposals/{to_approve}/approve", {}, frozenset({A})),
        ("POST", f"/v1/review/proposals/{to_reject}/reject", {"reason": "m"}, frozenset({R, A})),
        ("GET", "/v1/audit", None, frozenset({OP, R, A, V})),
    ]
    seen = 0
    for method, path, body, allowed in matrix:
        for name, token in [("none", None), ("forged", "cmp_" + "A" * 43), *((r.value, api.tokens[r]) for r in Role)]:
            headers = {} if token is None else {"Authorization": f"Bearer {token}"}
            status = (await api.client.request(method, path, json=body, headers=headers)).status_code
            seen += 1
            if token is None or name == "forged":
                assert status == 401, (method, path, name, status)
            elif Role(name) in allowed or Role(name) is ADMIN:
                assert status not in (401, 403) and status < 500, (method, path, name, status)
            else:
                assert status == 403, (method, path, name, status)
    assert seen == len(matrix) * (len(Role) + 2)


async def test_a_money_moving_redrive_is_a_proposal_a_second_person_approves(api: Api) -> None:
    (request_id,) = await dead(api, transfer("fe"))
    proposed = await post(api, R, "/v1/review/redrive", {"ids": [request_id], "reason": "bank is back"})
    assert proposed.status_code == 202 and proposed.json()["outcome"] == "proposed"
    proposal = proposed.json()["proposal"]
    assert (proposal["proposer"], proposal["state"], proposal["targets"]) == ("reviewer", "pending", [request_id])
    assert (await api.client.get(f"/v1/requests/{request_id}", headers=api.auth(OP))).json()["state"] == "dead"
    by_reviewer = await post(api, R, f"/v1/review/proposals/{proposal['id']}/approve", {})
    assert by_reviewer.status_code == 403  # a reviewer is not an approver
    approved = await post(api, A, f"/v1/review/proposals/{proposal['id']}/approve", {"reason": "checked"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["done"] == [request_id] and approved.json()["proposal"]["state"] == "approved"
    assert (await api.client.get(f"/v1/requests/{request_id}", headers=api.auth(OP))).json()["state"] == "ready"
    # admin may act and approve, but never their own proposal
    (other,) = await dead(api, transfer("fe2"))
    own = await post(api, ADMIN, "/v1/review/redrive", {"ids": [other], "reason": "mine"})
    refused = await post(api, ADMIN, f"/v1/review/proposals/{own.json()['proposal']['id']}/approve", {})
    assert refused.status_code == 403 and refused.json()["type"] == "/problems/own-proposal"
    entries = (await api.client.get("/v1/audit", headers=api.auth(A))).json()["entries"]
    assert [(e["actor"], e["action"]) for e in entries[:4]] == [
        ("admin", "propose"), ("reviewer", "redriven"), ("approver", "approve"), ("reviewer", "propose")]  # fmt: skip
    assert entries[1]["after"]["approved_by"] == "approver"


async def test_small_actions_are_done_at_once_and_bulk_ones_are_proposed(store: StoreThread) -> None:
    async with running_api(store, review__bulk_count_max="2") as api:
        ids = await dead(api, list_update("s1"), list_update("s2"), list_update("s3"))
        done = await post(api, R, "/v1/review/redrive", {"ids": ids[:2], "reason": "retry"})
        assert done.status_code == 200 and done.json() == {"outcome": "done", "redriven": ids[:2], "refused": []}
        again = await post(api, R, "/v1/review/redrive", {"ids": ids[:1], "reason": "retry"})
        assert again.json()["refused"] == [{"id": ids[0], "reason": "illegal_state"}]  # never reported as done
        await dead(api, list_update("s4"), list_update("s5"))
        bulk = await post(api, R, "/v1/review/redrive", {"filter": {"kind": "list_update"}, "reason": "all"})
        assert bulk.status_code == 202 and len(bulk.json()["proposal"]["targets"]) == 3


async def test_an_edit_is_validated_shown_as_a_diff_and_goes_out_as_a_new_version(api: Api) -> None:
    small, money = await dead(api, list_update("e1", amount_minor=100), transfer("e2"))
    good = {**list_update("e1")["payload"], "amount_minor": 120}
    bad = await post(api, R, f"/v1/review/requests/{small}/edit", {"payload": {**good, "amount_minor": -1},
                                                                   "reason": "r"})  # fmt: skip
    assert bad.status_code == 422 and [e["field"] for e in bad.json()["errors"]] == ["payload.amount_minor"]
    same = await post(api, R, f"/v1/review/requests/{small}/edit", {"payload": list_update("e1")["payload"],
                                                                    "reason": "r"})  # fmt: skip
    assert same.status_code == 422 and same.json()["errors"][0]["field"] == "payload"
    edited = await post(api, R, f"/v1/review/requests/{small}/edit", {"payload": good, "reason": "amount typo"})
    assert edited.status_code == 200, edited.text
    assert edited.json()["diff"] == {"amount_minor": {"before": 100, "after": 120}}
    new = (await api.client.get(f"/v1/requests/{edited.json()['new_id']}", headers=api.auth(OP))).json()
    original = (await api.client.get(f"/v1/requests/{small}", headers=api.auth(OP))).json()
    assert new["payload"]["amount_minor"] == 120 and new["state"] == "ready"
    assert original["payload"]["amount_minor"] == 100 and original["state"] == "discarded"
    assert (new["version"], new["previous_version"], original["superseded_by"]) == (2, small, edited.json()["new_id"])
    (entry,) = original["audit"]
    assert (entry["action"], entry["actor"], entry["reason"]) == ("edit_redrive", "reviewer", "amount typo")
    assert json.loads(entry["after"]["payload"])["amount_minor"] == 120 and new["audit"] == original["audit"]
    proposal = await post(api, R, f"/v1/review/requests/{money}/edit",
                          {"payload": {**transfer("e2")["payload"], "payee": "user-43"}, "reason": "wrong payee"})
    assert proposal.status_code == 202 and proposal.json()["diff"] == {"payee": {"before": "user-42", "after": "user-43"}}
    assert proposal.json()["proposal"]["payload"]["payee"] == "user-43"


async def test_a_discard_needs_a_listed_reason_code_and_a_comment(api: Api) -> None:
    (request_id,) = await dead(api, list_update("d1"))
    path = f"/v1/review/requests/{request_id}/discard"
    unknown = await post(api, R, path, {"reason_code": "because", "comment": "c"})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["field"] == "reason_code"
    silent = await post(api, R, path, {"reason_code": "duplicate"})
    assert silent.status_code == 422 and silent.json()["errors"][0]["field"] == "comment"
    done = await post(api, R, path, {"reason_code": "paid_manually", "comment": "paid by hand, ticket 12"})
    assert done.status_code == 200 and done.json()["state"] == "discarded"
    (entry,) = [e for e in (await api.client.get("/v1/audit", headers=api.auth(OP))).json()["entries"]
                if e["action"] == "discarded"]  # fmt: skip
    assert (entry["reason"], entry["after"]["reason_code"]) == ("paid by hand, ticket 12", "paid_manually")


def test_the_four_eyes_rules_come_from_configuration() -> None:
    def view(kind: str, payload: bytes) -> MessageView:
        return MessageView(
            message_id=1, kind=kind, idempotency_key="k", ref_key="r", payload=payload, edited_payload=None,
            headers={}, created_ms=0, state=State.DEAD, due_ms=0, attempts=1, last_error_class=None,
            last_error_text=None, token=1, lease_worker=None, lease_deadline_ms=None, dead_ms=0, dead_reason=None,
            terminal_ms=None,
        )  # fmt: skip

    config = configuration.load(None, {"COMPENSATOR_REVIEW__AMOUNT_THRESHOLD_MINOR": "1000",
                                       "COMPENSATOR_REVIEW__MONEY_MOVING_KINDS": "transfer,list_update",
                                       "COMPENSATOR_REVIEW__BULK_COUNT_MAX": "3"})  # fmt: skip
    rules = four_eyes(config)
    small, large = view("transfer", b'{"amount_minor": 999}'), view("list_update", b'{"amount_minor": 1000}')
    assert rules.needs_approval([small]) is None
    assert rules.needs_approval([large]) == "list_update moves money (at least 1000 minor units)"
    assert rules.needs_approval([small], [b'{"amount_minor": 5000}']) is not None  # an edit that raises it
    assert rules.needs_approval([view("transfer", b"not json")]) is not None  # no amount: above any threshold
    assert rules.needs_approval([view("callback", b"{}")] * 4) == "it acts on 4 requests, more than 3"
    assert FourEyes().needs_approval([small]) == "transfer moves money"  # by default, every amount
    assert diff({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": None}) == {
        "b.c": {"before": 2, "after": 3}, "d": {"before": None, "after": None}}  # fmt: skip
    with pytest.raises(configuration.ConfigError) as refused:
        configuration.load(None, {"COMPENSATOR_REVIEW__BULK_COUNT_MAX": "0"})
    assert refused.value.problems == ["COMPENSATOR_REVIEW__BULK_COUNT_MAX: review.bulk_count_max: must be in 1..1000"]


async def test_the_audit_view_is_filtered_in_the_store_and_refuses_bad_filters(api: Api) -> None:
    for namespace, name, reason in (("sessions", "f00d", "login"), ("logins", "ann", "login"), ("users", "ann", "user added")):
        await api.queue.put_document(namespace, name, b'{"role":"viewer"}', actor="ann", reason=reason)
    (request_id,) = await dead(api, list_update("af"))
    edited = await post(api, R, f"/v1/review/requests/{request_id}/edit",
                        {"payload": {**list_update("af")["payload"], "amount_minor": 150}, "reason": "typo"})  # fmt: skip
    assert edited.status_code == 200, edited.text

    async def audit(**params: Any) -> list[dict[str, Any]]:
        answer = await api.client.get("/v1/audit", params=params, headers=api.auth(OP))
        assert answer.status_code == 200, answer.text
        return list(answer.json()["entries"])

    everything = {e["target"] for e in await audit()}  # the JSON view keeps the whole chain unless asked
    assert {"document:sessions/f00d", "document:logins/ann", "document:users/ann"} <= everything
    assert {e["target"] for e in await audit(sign_ins="false")} == everything - {"document:sessions/f00d",
                                                                                 "document:logins/ann"}  # fmt: skip
    assert [(e["actor"], e["action"]) for e in await audit(actor="reviewer")] == [("reviewer", "edit_redrive")]
    assert {e["action"] for e in await audit(action=["edit_redrive", "document_put"])} == {"edit_redrive", "document_put"}
    (entry,) = await audit(target=request_id)
    assert entry["action"] == "edit_redrive" and json.loads(entry["after"]["payload"])["amount_minor"] == 150
    assert [e["target"] for e in await audit(target="document:users/")] == ["document:users/ann"]
    assert await audit(target="document:users/*") == await audit(target="document:users/ann")
    assert await audit(since="2999-01-01T00:00:00Z") == []
    assert await audit(since="0351-01-01T00:00:00Z", until="0500-01-01T00:00:00Z") == []  # before the store's times
    assert await audit(since="1960-01-01T00:00:00Z") == await audit()
    assert len(await audit(until="2999-01-01T00:00:00Z", limit=2, sign_ins="false")) == 2
    for params, field in (({"since": "2026-01-01T00:00:00"}, "since"), ({"since": "2026-01-02T00:00:00Z",
                          "until": "2026-01-01T00:00:00Z"}, "until"), ({"action": "Drop Table"}, "action[0]"),
                          ({"target": "999-1"}, "target"), ({"actor": "a\x01"}, "actor"), ({"sign_ins": "maybe"}, "sign_ins"),
                          ({"since": "yesterday"}, "since")):  # fmt: skip
        refused = await api.client.get("/v1/audit", params=params, headers=api.auth(OP))
        assert refused.status_code == 422, (params, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert [e["field"] for e in refused.json()["errors"]] == [field], (params, refused.json())


async def test_an_unknown_query_parameter_on_a_filter_endpoint_is_a_422_naming_it(api: Api) -> None:
    for path, params in (("/v1/review/dead-letters", {"currency": "USD"}), ("/v1/audit", {"acter": "ann"}),
                         ("/v1/review/proposals", {"pending": "true", "state": "approved"}),
                         ("/v1/review/jobs", {"activ": "true"}), ("/v1/review/jobs/1/items", {"results": "done"})):  # fmt: skip
        refused = await api.client.get(path, params=params, headers=api.auth(OP))
        assert refused.status_code == 422 and refused.headers["content-type"] == "application/problem+json", path
        assert [e["field"] for e in refused.json()["errors"]] == [name for name in params if name not in (
            "pending",)], (path, refused.json())  # fmt: skip
    assert (await api.client.get("/v1/review/dead-letters", params={"kind": "transfer"}, headers=api.auth(OP))).status_code == 200


@pytest.fixture
def short_events(tmp_path: Path) -> Iterator[StoreThread]:
    """A store whose event retention may be set as short as 100 ms (the floor is a day by default)."""

    def factory(data_dir: Path) -> ReplicatedQueueMachine:
        data_dir.mkdir(parents=True, exist_ok=True)
        return ReplicatedQueueMachine(str(data_dir / DB_NAME), QueueConfig(retention_floor_ms=100))

    with running_store(tmp_path / "store", factory) as thread:
        yield thread


async def test_the_ref_timeline_interleaves_audit_entries_keeps_them_past_the_events_and_masks_them(
    short_events: StoreThread,
) -> None:
    async with running_api(short_events) as api:
        body = transfer("tl")
        body["payload"]["payee"] = "acct-6222020087654321"
        (original,) = await dead(api, body)
        edit = {"payload": {**body["payload"], "payee": "acct-6222020099990000"}, "reason": "wrong payee"}
        proposed = await post(api, R, f"/v1/review/requests/{original}/edit", edit)
        assert proposed.status_code == 202, proposed.text
        approved = await post(api, A, f"/v1/review/proposals/{proposed.json()['proposal']['id']}/approve", {})
        (new,) = approved.json()["new_ids"]
        (grant,) = (await api.queue.lease("w", count_max=10, lease_ms=30_000)).grants
        await api.queue.fail(grant.message_id, grant.token, "insufficient_funds", permanent=True)

        async def timeline(role: Role) -> list[dict[str, Any]]:
            answer = await api.client.get("/v1/refs/rp-tl/timeline", headers=api.auth(role))
            assert answer.status_code == 200, answer.text
            return list(answer.json()["entries"])

        entries = await timeline(OP)
        steps = [(e["type"], e["audit"]["action"] if e["type"] == "audit" else e["request_id"]) for e in entries]
        assert steps == [
            ("intake", original), ("attempt_started", original), ("attempt_failed", original),
            ("dead_lettered", original), ("audit", "propose"), ("audit", "approve"), ("audit", "edit_redrive"),
            ("intake", new), ("attempt_started", new), ("attempt_failed", new), ("dead_lettered", new),
        ], steps  # fmt: skip
        assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)  # by time, whatever their source
        assert not [e for e in entries if e["type"] == "discarded"]  # the superseded original's event: its entry says it
        (edit_entry,) = [e for e in entries if e["type"] == "audit" and e["audit"]["action"] == "edit_redrive"]
        assert edit_entry["requests"] == [original, new] and edit_entry["audit"]["actor"] == "reviewer"
        assert edit_entry["audit"]["reason"] == "wrong payee"
        assert "acct-6222020099990000" in json.dumps(edit_entry)

        seen_by_viewer = json.dumps(await timeline(V))
        assert "acct-6222020087654321" not in seen_by_viewer and "acct-6222020099990000" not in seen_by_viewer
        assert "****0000" in seen_by_viewer and "****4321" in seen_by_viewer

        await api.queue.set_retention(actor="tests", reason="purge now", event_retention_ms=100)
        await asyncio.sleep(0.3)
        assert (await api.queue.purge()).events_purged > 0
        after = await timeline(OP)
        assert not [e for e in after if e["type"] == "dead_lettered"]  # events are gone...
        assert [e["audit"]["action"] for e in after if e["type"] == "audit"] == ["propose", "approve", "edit_redrive"]
