"""Operators force breakers and replace classification tables; both are stored, versioned and
audited, and what does not validate is refused with its reason."""

from __future__ import annotations

import msgspec
from api_support import Api

from handlers.classification import decode_table, encode_table
from handlers.tables import PAYMENT_TABLE
from queues import EventType, Role

OP = Role.OPERATOR


async def test_breakers_show_state_and_an_operator_forces_one(api: Api) -> None:
    listed = (await api.client.get("/v1/breakers", headers=api.auth(OP))).json()
    assert [(b["downstream"], b["state"], b["mode"]) for b in listed] == [
        ("callback", "closed", "auto"), ("payment", "closed", "auto"), ("red_packet", "closed", "auto")]
    await api.queue.pause("transfer", "breaker:payment", "12 of 20 attempts failed in 10 s")
    forced = await api.client.put("/v1/breakers/payment", json={"mode": "open", "reason": "bank maintenance"},
                                  headers=api.auth(OP))  # fmt: skip
    assert forced.status_code == 200, forced.text
    payment = next(b for b in forced.json() if b["downstream"] == "payment")
    assert (payment["state"], payment["mode"], payment["kinds"], payment["mode_set_by"]) == (
        "open", "open", ["transfer"], "operator")
    assert payment["reason"] == "12 of 20 attempts failed in 10 s"
    (docs,) = [e for e in (await api.queue.events_after(0)).value if e.type is EventType.DOCUMENT_PUT]
    assert docs.data["actor"] == "operator" and docs.data["reason"] == "bank maintenance"
    refused = await api.client.put("/v1/breakers/payment", json={"mode": "half", "reason": "x"}, headers=api.auth(OP))
    assert refused.status_code == 422
    unknown = await api.client.put("/v1/breakers/bank", json={"mode": "open", "reason": "x"}, headers=api.auth(OP))
    assert unknown.status_code == 422
    assert (await api.client.put("/v1/breakers/payment", json={"mode": "open", "reason": "x"},
                                 headers=api.auth(Role.REVIEWER))).status_code == 403  # fmt: skip


async def test_a_classification_table_is_validated_stored_and_reset(api: Api) -> None:
    shown = (await api.client.get("/v1/downstreams/payment/classification", headers=api.auth(OP))).json()
    assert shown["source"] == "default" and decode_table(msgspec.json.encode(shown["table"])) == PAYMENT_TABLE
    edited = msgspec.json.decode(encode_table(PAYMENT_TABLE))
    edited["rules"][0]["error_class"] = "funds_short"
    put = await api.client.put("/v1/downstreams/payment/classification", content=msgspec.json.encode(edited),
                               headers={**api.auth(OP), "Content-Type": "application/json", "X-Reason": "rename"})  # fmt: skip
    assert put.status_code == 200, put.text
    assert put.json()["before"] == shown["table"] and put.json()["after"]["rules"][0]["error_class"] == "funds_short"
    stored = (await api.queue.documents("classification")).value.documents
    assert [d.name for d in stored] == ["payment"] and decode_table(stored[0].body).rules[0].error_class == "funds_short"
    broken = dict(edited, rules=edited["rules"][:1])  # no catch-all last rule
    refused = await api.client.put("/v1/downstreams/payment/classification", content=msgspec.json.encode(broken),
                                   headers={**api.auth(OP), "Content-Type": "application/json", "X-Reason": "x"})  # fmt: skip
    assert refused.status_code == 422 and "last rule" in refused.text
    other = await api.client.put("/v1/downstreams/callback/classification", content=msgspec.json.encode(edited),
                                 headers={**api.auth(OP), "Content-Type": "application/json", "X-Reason": "x"})  # fmt: skip
    assert other.status_code == 422
    no_reason = await api.client.put("/v1/downstreams/payment/classification", content=msgspec.json.encode(edited),
                                     headers={**api.auth(OP), "Content-Type": "application/json"})  # fmt: skip
    assert no_reason.status_code == 422
    reset = await api.client.delete("/v1/downstreams/payment/classification", headers=api.auth(OP))
    assert reset.json()["source"] == "default"
