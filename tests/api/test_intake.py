"""POST /v1/requests and its batch, GET /v1/requests/{id}, the timeline: the intake's contract,
against a real store in this process."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import httpx
import pytest
from api_support import CALLBACK_TARGET, Api, running_api, transfer

from queues import Role
from queues.core.port import Table
from raft_store.testing.inprocess import StoreThread


async def _post(api: Api, body: Any, key: str | None = "k-1", *, role: Role = Role.PRODUCER,
                headers: dict[str, str] | None = None) -> httpx.Response:  # fmt: skip
    sent = {**api.auth(role), "Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Idempotency-Key"] = key
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await api.client.post("/v1/requests", content=content, headers=sent)


def _problem(response: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    document: dict[str, Any] = response.json()
    assert document["type"] == f"/problems/{name}" and document["status"] == status
    return document


async def test_created_then_replayed_then_reused(api: Api) -> None:
    first = await _post(api, transfer())
    assert first.status_code == 201, first.text
    created = first.json()
    assert created["state"] == "ready" and created["ledger_state"] == "PENDING" and not created["replayed"]
    assert first.headers["location"] == f"/v1/requests/{created['id']}"
    reordered = {"payload": dict(reversed(list(transfer()["payload"].items()))), "ref_key": "rp-1", "kind": "transfer"}
    again = await _post(api, reordered)  # the same body with its members in another order
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == {**created, "replayed": True}
    other = await _post(api, transfer(amount_minor=889))
    assert "reused" in _problem(other, 422, "idempotency-key-reused")["type"]
    delayed = await _post(api, transfer(delay_s=5))  # same payload, another body: also a reuse
    _problem(delayed, 422, "idempotency-key-reused")
    stored = (await api.queue.by_ref_key("rp-1")).value
    assert [view.message_id for view in stored] == [int(created["id"].split("-")[1])]


async def test_enqueues_travel_without_a_session_lane(store: StoreThread, api: Api) -> None:
    """An enqueue is exactly-once by its key (and by its request id for the client's own retry):
    a session row for a single POST would cost every replica a read and three writes for nothing."""
    view = store.node.machine.view
    before = view.count(Table.SESSIONS)
    for n in range(3):
        single = await _post(api, transfer(str(n)), key=f"lane-{n}")
        assert single.status_code == 201, single.text
    batch = await api.client.post("/v1/requests:batch", headers=api.auth(), json={"items": [
        {"idempotency_key": f"lane-batch-{n}", "request": transfer(f"b{n}")} for n in range(2)]})  # fmt: skip
    assert [item["status"] for item in batch.json()["items"]] == [201, 201], batch.text
    replayed = await _post(api, transfer("0"), key="lane-0")
    assert replayed.status_code == 200 and replayed.json()["replayed"], replayed.text
    assert view.count(Table.SESSIONS) == before


async def test_the_request_reads_back_as_submitted(api: Api) -> None:
    body = transfer("7", failure={"error_class": "timeout", "text": "no answer in 2 s", "http_status": 504})
    created = (await _post(api, body, key="read-back")).json()
    answer = await api.client.get(f"/v1/requests/{created['id']}", headers=api.auth())
    assert answer.status_code == 200
    view = answer.json()
    assert view["payload"] == body["payload"] and view["kind"] == "transfer" and view["ref_key"] == "rp-7"
    assert view["idempotency_key"] == "read-back" and view["producer"] == "producer"
    assert view["original_failure"] == body["failure"]
    assert view["attempts"] == 0 and view["history"] == [] and view["operator_actions"] == []
    assert view["trace"]["traceparent"].startswith("00-")


async def test_the_key_is_required_and_checked(api: Api) -> None:
    _problem(await _post(api, transfer(), key=None), 400, "idempotency-key-missing")
    for bad in ("x" * 96, " leading", "tab\there", "del\x7f", ""):
        _problem(await _post(api, transfer(), key=bad), 400, "idempotency-key-invalid")
    quoted = await _post(api, transfer(), key='"sf-string key"')  # RFC 8941 sf-string, as the draft writes it
    bare = await _post(api, transfer(), key="sf-string key")
    assert (quoted.status_code, bare.status_code) == (201, 200)
    assert quoted.json()["id"] == bare.json()["id"]


async def test_every_bad_field_is_named_and_nothing_is_stored(api: Api) -> None:
    body = {"kind": "transfer", "ref_key": "rp-9", "delay_s": -1,
            "payload": {"transfer_id": "tr 9", "payer": "a", "amount_minor": "500", "currency": "XYZ", "extra": 1}}
    document = _problem(await _post(api, body), 422, "invalid-request")
    fields = sorted(error["field"] for error in document["errors"])
    assert fields == ["delay_s", "payload.amount_minor", "payload.currency", "payload.extra", "payload.payee",
                      "payload.transfer_id"]  # fmt: skip
    assert all(error["message"] for error in document["errors"])
    assert "500" not in json.dumps(document["errors"])  # messages, never the rejected values
    assert (await api.queue.by_ref_key("rp-9")).value == ()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "payout", "ref_key": "r", "payload": {}}, "kind"),
        ({"ref_key": "r", "payload": {}}, "kind"),
        ({**transfer(), "delay_s": 1, "not_before": "2030-01-01T00:00:00Z"}, "(body)"),
        ({**transfer(), "not_before": "2030-01-01T00:00:00"}, "not_before"),  # no offset: ambiguous
        ({**transfer(), "ref_key": ""}, "ref_key"),
        ({**transfer(), "payload": {**transfer()["payload"], "payee": "red-packet-escrow"}}, "payload"),
        ({**transfer(), "payload": {**transfer()["payload"], "amount_minor": 10**16}}, "payload.amount_minor"),
        ({**transfer(), "payload": {**transfer()["payload"], "amount_minor": 1.5}}, "payload.amount_minor"),
        ({**transfer(), "payload": {**transfer()["payload"], "amount_minor": True}}, "payload.amount_minor"),
        ({"kind": "list_update", "ref_key": "r", "payload": {"red_packet_id": "rp", "receiver": "u", "version": 0,
                                                           "amount_minor": 1, "currency": "CNY"}}, "payload.version"),
        ({"kind": "callback", "ref_key": "r", "payload": {"target": "https://evil.example/", "body": {}}},
         "payload.target"),
        ([1, 2], "(body)"),
        ({**transfer(), "ref_key": "rp-\u202eevil"}, "ref_key"),  # shown as "rp-live"
        ({**transfer(), "ref_key": "rp 1"}, "ref_key"),  # the payment system's business id takes no space
        ({**transfer(), "ref_key": "rp<1>"}, "ref_key"),
        ({"kind": "callback", "ref_key": "rp-\u200b1", "payload": {"target": CALLBACK_TARGET, "body": {}}}, "ref_key"),
        ({"kind": "callback", "ref_key": "rp-\x851", "payload": {"target": CALLBACK_TARGET, "body": {}}}, "ref_key"),
        ({"kind": "list_update", "ref_key": "rp\u20281", "payload": {"red_packet_id": "rp", "receiver": "u", "version": 1,
                                                                   "amount_minor": 1, "currency": "CNY"}}, "ref_key"),
        ({"kind": "callback", "ref_key": "r", "payload": {"target": "not-registered", "body": {}}}, "payload.target"),
    ],
)  # fmt: skip
async def test_invalid_submissions_name_the_field(api: Api, body: Any, field: str) -> None:
    document = _problem(await _post(api, body), 422, "invalid-request")
    assert field in [error["field"] for error in document["errors"]], document


async def test_a_ref_key_says_what_it_must_be_and_text_ref_keys_take_any_visible_character(api: Api) -> None:
    refused = _problem(await _post(api, {**transfer(), "ref_key": "rp-\u202eevil"}), 422, "invalid-request")
    assert refused["errors"] == [{"field": "ref_key", "message": "1-128 letters, digits and _.:@/- starting with a "
                                  "letter or a digit (an identifier the downstream takes)"}]  # fmt: skip
    callback = {"kind": "callback", "ref_key": "订单 <42> é", "payload": {"target": CALLBACK_TARGET, "body": {}}}
    assert (await _post(api, callback, key="visible")).status_code == 201
    hidden = _problem(await _post(api, {**callback, "ref_key": "a\u2066b"}, key="hidden"), 422, "invalid-request")
    assert "control or format character" in hidden["errors"][0]["message"]


async def test_a_body_nested_too_deep_is_said_to_be_too_deep(api: Api) -> None:
    deep: Any = {}
    for _ in range(500):
        deep = {"a": deep}
    body = {"kind": "callback", "ref_key": "r", "payload": {"target": CALLBACK_TARGET, "body": deep}}
    document = _problem(await _post(api, body, key="deep"), 400, "body-too-deep")
    assert "200 levels" in document["detail"]
    shallow: Any = {}
    for _ in range(150):
        shallow = {"a": shallow}
    assert (await _post(api, {**body, "payload": {"target": CALLBACK_TARGET, "body": shallow}}, key="ok")).status_code == 201
    batch = await api.client.post("/v1/requests:batch", json={"items": [{"idempotency_key": "deep", "request": body}]},
                                  headers=api.auth())  # fmt: skip
    assert batch.status_code == 200 and batch.json()["items"][0]["problem"]["type"] == "/problems/body-too-deep"
    nested = "[" * 5000 + "]" * 5000  # deeper than the envelope's decoder goes
    envelope = await api.client.post("/v1/requests:batch", content=b'{"items": ' + nested.encode() + b"}",
                                     headers={**api.auth(), "Content-Type": "application/json"})  # fmt: skip
    _problem(envelope, 400, "body-too-deep")


async def test_not_before_more_than_two_years_ahead_is_refused_and_a_past_one_is_due_now(api: Api) -> None:
    far = (dt.datetime.now(dt.UTC) + dt.timedelta(days=800)).isoformat()
    document = _problem(await _post(api, transfer(not_before=far), key="far"), 422, "invalid-request")
    assert [error["field"] for error in document["errors"]] == ["not_before"]
    past = await _post(api, transfer(not_before="2020-01-01T08:00:00+08:00"), key="past")
    assert past.status_code == 201 and past.json()["state"] == "ready"
    later = await _post(api, transfer("2", delay_s=3600), key="later")
    due = dt.datetime.fromisoformat(later.json()["due_at"])
    assert later.json()["state"] == "delayed"
    assert abs((due - dt.datetime.now(dt.UTC)).total_seconds() - 3600) < 60


async def test_media_type_size_and_syntax(api: Api) -> None:
    _problem(await _post(api, transfer(), headers={"Content-Type": "text/plain"}), 415, "unsupported-media-type")
    _problem(await _post(api, b'{"kind": "transfer",'), 400, "malformed-body")
    big = transfer(failure={"error_class": "x", "text": "y"})
    big["payload"]["memo"] = "m" * 300_000
    _problem(await _post(api, big), 413, "body-too-large")

    async def chunks() -> Any:  # no Content-Length: the body is cut at the limit all the same
        for _ in range(40):
            yield b" " * 8192

    headers = {**api.auth(), "Content-Type": "application/json", "Idempotency-Key": "chunked"}
    _problem(await api.client.post("/v1/requests", content=chunks(), headers=headers), 413, "body-too-large")
    assert (await _post(api, {**transfer(), "kind": "transfer"}, headers={"Content-Type": "application/json; charset=utf-8"})).status_code == 201


async def test_keys_belong_to_their_producer(store: StoreThread) -> None:
    async with running_api(store) as api:
        from api_support import put_tokens

        other = (await put_tokens(store, (Role.PRODUCER,), prefix="other-"))[Role.PRODUCER]
        mine = await _post(api, transfer("5"), key="shared-key")
        theirs = await api.client.post(
            "/v1/requests", json=transfer("5"),
            headers={"Authorization": f"Bearer {other}", "Idempotency-Key": "shared-key"},
        )  # fmt: skip
        assert (mine.status_code, theirs.status_code) == (201, 201)
        assert mine.json()["id"] != theirs.json()["id"]
        foreign = await api.client.get(f"/v1/requests/{theirs.json()['id']}", headers=api.auth())
        _problem(foreign, 404, "not-found")
        timeline = (await api.client.get("/v1/refs/rp-5/timeline", headers=api.auth())).json()
        assert timeline["requests"] == [mine.json()["id"]]
        everyone = (await api.client.get("/v1/refs/rp-5/timeline", headers=api.auth(Role.OPERATOR))).json()
        assert sorted(everyone["requests"]) == sorted([mine.json()["id"], theirs.json()["id"]])


async def test_unknown_and_malformed_ids_are_not_found(api: Api) -> None:
    for request_id in ("1-999999", "2-1", "abc", "1-0", "1-" + "9" * 30):
        _problem(await api.client.get(f"/v1/requests/{request_id}", headers=api.auth()), 404, "not-found")
    _problem(await api.client.get("/v1/refs/nothing-here/timeline", headers=api.auth()), 404, "not-found")
    _problem(await api.client.get("/v1/nowhere", headers=api.auth()), 404, "not-found")
    _problem(await api.client.delete("/v1/requests/1-1", headers=api.auth()), 405, "method-not-allowed")


async def test_batch_answers_each_item_in_its_place_in_one_store_entry(api: Api) -> None:
    items = [
        {"idempotency_key": "b-1", "request": transfer("b1")},
        {"idempotency_key": "b-2", "request": {**transfer("b2"), "kind": "nope"}},
        {"idempotency_key": "", "request": transfer("b3")},
        {"idempotency_key": "b-4", "request": transfer("b4")},
        {"idempotency_key": "b-1", "request": transfer("b1")},
        {"idempotency_key": "b-4", "request": transfer("b4", amount_minor=1)},
        {"request": transfer("b5")},
    ]
    answer = await api.client.post("/v1/requests:batch", json={"items": items}, headers=api.auth())
    assert answer.status_code == 200, answer.text
    results = answer.json()["items"]
    assert [r["status"] for r in results] == [201, 422, 400, 201, 200, 422, 422]
    assert results[4]["request"]["id"] == results[0]["request"]["id"] and results[4]["request"]["replayed"]
    assert results[1]["problem"]["errors"][0]["field"] == "kind"
    assert results[2]["problem"]["type"] == "/problems/idempotency-key-invalid"
    assert results[6]["problem"]["errors"] == [
        {"field": "items[6]", "message": "Object missing required field `idempotency_key`"}]
    assert results[5]["problem"]["type"] == "/problems/idempotency-key-reused"
    ids = [int(results[i]["request"]["id"].split("-")[1]) for i in (0, 3)]
    entries = {e.log_index for e in (await api.queue.events_after(0)).value if e.message_id in ids}
    assert len(entries) == 1, "the batch's items were not one log entry"
    _problem(await api.client.post("/v1/requests:batch", json={"items": []}, headers=api.auth()), 422, "invalid-request")
    too_many = {"items": [{"idempotency_key": f"m-{i}", "request": transfer(str(i))} for i in range(1001)]}
    _problem(await api.client.post("/v1/requests:batch", json=too_many, headers=api.auth()), 422, "invalid-request")


async def test_sixty_four_concurrent_posts_of_one_key_make_one_request(api: Api) -> None:
    answers = await asyncio.gather(*(_post(api, transfer("c"), key="concurrent") for _ in range(64)))
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * 63 + [201]
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert len((await api.queue.by_ref_key("rp-c")).value) == 1


async def test_a_store_without_a_leader_is_a_503_never_a_500(store: StoreThread) -> None:
    async with running_api(store) as api:
        assert (await _post(api, transfer(), key="before")).status_code == 201
        store.stop()
        # The connection the client had may take the first request down with it (sent, then
        # lost: in doubt); once the client knows the node is gone, nothing is sent at all.
        in_doubt = await _post(api, transfer("2"), key="during")
        assert in_doubt.status_code == 503 and in_doubt.json()["type"] in (
            "/problems/outcome-unknown", "/problems/store-unavailable")
        answer = await _post(api, transfer("2"), key="during")
        document = _problem(answer, 503, "store-unavailable")
        assert answer.headers["retry-after"] == "1" and "nothing was stored" in document["detail"]
        read = await api.client.get("/v1/requests/1-1", headers=api.auth())
        _problem(read, 503, "not-ready")
        ready = await api.client.get("/readyz")
        _problem(ready, 503, "not-ready")
        assert (await api.client.get("/healthz")).status_code == 200
