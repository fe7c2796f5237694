"""The operator endpoints: kinds with depth and oldest due age, pauses by named holders, the retry
policy answered before and after; each change an event with the caller as actor."""

from __future__ import annotations

from api_support import Api, running_api, transfer

from queues import EventType, Role
from raft_store.testing.inprocess import StoreThread

OP = Role.OPERATOR


async def test_depth_and_oldest_due_per_kind(api: Api) -> None:
    for index in range(3):
        body = transfer(str(index), delay_s=3600 if index == 2 else None)
        body = {k: v for k, v in body.items() if v is not None}
        assert (await api.client.post("/v1/requests", json=body,
                                      headers={**api.auth(), "Idempotency-Key": f"d{index}"})).status_code == 201
    kinds = {k["kind"]: k for k in (await api.client.get("/v1/kinds", headers=api.auth(OP))).json()}
    assert set(kinds) == {"callback", "list_update", "transfer"}
    assert kinds["transfer"]["counts"] == {"delayed": 1, "ready": 2}
    assert kinds["transfer"]["oldest_due_age_ms"] >= 0 and kinds["callback"]["oldest_due_age_ms"] is None
    detail = (await api.client.get("/v1/kinds/transfer", headers=api.auth(OP))).json()
    assert detail["policy"]["attempts_max"] >= 1 and detail["counts"] == kinds["transfer"]["counts"]
    missing = await api.client.get("/v1/kinds/refund", headers=api.auth(OP))
    assert missing.status_code == 404


async def test_pauses_are_held_by_named_holders(api: Api) -> None:
    paused = await api.client.post("/v1/kinds/transfer/pause", json={"reason": "payment incident 42"},
                                   headers=api.auth(OP))  # fmt: skip
    assert paused.status_code == 200 and paused.json()["paused"]
    assert paused.json()["pauses"][0]["holder"] == "operator"
    again = await api.client.post("/v1/kinds/transfer/pause", json={"reason": "again"}, headers=api.auth(OP))
    assert again.status_code == 409 and again.json()["type"] == "/problems/conflict"
    other = await api.client.post("/v1/kinds/transfer/pause", json={"holder": "breaker:payment", "reason": "5xx"},
                                  headers=api.auth(OP))  # fmt: skip
    assert [p["holder"] for p in other.json()["pauses"]] == ["breaker:payment", "operator"]
    resumed = await api.client.post("/v1/kinds/transfer/resume", json={}, headers=api.auth(OP))
    assert resumed.status_code == 200 and resumed.json()["paused"]  # the breaker still holds it
    not_held = await api.client.post("/v1/kinds/transfer/resume", json={}, headers=api.auth(OP))
    assert not_held.status_code == 409
    no_reason = await api.client.post("/v1/kinds/transfer/pause", json={}, headers=api.auth(OP))
    assert no_reason.status_code == 422 and no_reason.json()["errors"][0]["field"] == "reason"
    unknown = await api.client.post("/v1/kinds/refund/pause", json={"reason": "x"}, headers=api.auth(OP))
    assert unknown.status_code == 404
    for holder in ("\x1b[2J\x1b[31mbreaker:payment", "ops\u202eecila", "Ops", "a b", "ops:", ":ops", "x" * 33):
        bad = await api.client.post("/v1/kinds/transfer/pause", json={"holder": holder, "reason": "x"},
                                    headers=api.auth(OP))  # fmt: skip
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "holder", (holder, bad.text)
    events = [e for e in (await api.queue.events_after(0)).value if e.type in (EventType.PAUSED, EventType.RESUMED)]
    assert [(e.type, e.data["holder"], e.data["actor"]) for e in events] == [
        (EventType.PAUSED, "operator", "operator"), (EventType.PAUSED, "breaker:payment", "operator"),
        (EventType.RESUMED, "operator", "operator"),
    ]  # fmt: skip


async def test_policy_is_validated_and_answered_before_and_after(api: Api) -> None:
    before = (await api.client.get("/v1/kinds/transfer/policy", headers=api.auth(OP))).json()
    policy = {"tiers_ms": [500, 2000], "tier_jitter_ratio": 0.0, "attempts_max": 4,
              "overrides": [{"error_class": "insufficient_funds", "permanent": True}]}  # fmt: skip
    changed = await api.client.put("/v1/kinds/transfer/policy", json=policy, headers=api.auth(OP))
    assert changed.status_code == 200, changed.text
    assert changed.json()["before"] == before and changed.json()["after"]["tiers_ms"] == [500, 2000]
    assert (await api.client.get("/v1/kinds/transfer/policy", headers=api.auth(OP))).json() == changed.json()["after"]
    contradictory = {"tiers_ms": [], "backoff_min_ms": 5000, "backoff_max_ms": 10}
    refused = await api.client.put("/v1/kinds/transfer/policy", json=contradictory, headers=api.auth(OP))
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "policy"
    wrong_type = await api.client.put("/v1/kinds/transfer/policy", json={"attempts_max": "many"}, headers=api.auth(OP))
    assert wrong_type.status_code == 422 and wrong_type.json()["errors"][0]["field"] == "attempts_max"
    unknown = await api.client.put("/v1/kinds/refund/policy", json=policy, headers=api.auth(OP))
    assert unknown.status_code == 404
    (event,) = [e for e in (await api.queue.events_after(0)).value if e.type is EventType.POLICY_SET]
    assert event.data["actor"] == "operator" and event.data["policy_before"] is not None


async def test_a_policy_that_would_outlast_the_payment_systems_dedup_window_is_refused(store: StoreThread) -> None:
    """Declared in the configuration, checked where policies are set (and by each worker at start)."""
    payment = '{"base_url": "http://127.0.0.1:7201", "guarantee": "dedup", "dedup_window_s": 3600}'
    async with running_api(store, handlers__payment=payment) as api:
        long = {"tiers_ms": [60_000, 600_000], "attempts_max": 10, "retry_after_max_ms": 0}
        refused = await api.client.put("/v1/kinds/transfer/policy", json=long, headers=api.auth(OP))
        within = {**long, "age_max_ms": 3_000_000}
        taken = await api.client.put("/v1/kinds/transfer/policy", json=within, headers=api.auth(OP))
        other_kind = await api.client.put("/v1/kinds/callback/policy", json=long, headers=api.auth(OP))
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "policy" and "beyond handlers.payment.dedup_window_s (3600 s)" in error["message"]
    assert taken.status_code == 200, taken.text
    assert other_kind.status_code == 200, other_kind.text


async def test_retention_is_read_by_operators_and_changed_by_an_administrator_only(api: Api) -> None:
    """The idempotency window is every producer's guarantee: reading it is an operator's question,
    changing it an administrator's, with a reason, never under the store's floor, and recorded."""
    shown = await api.client.get("/v1/retention", headers=api.auth(OP))
    assert shown.status_code == 200, shown.text
    before = shown.json()
    assert before["retention_ms"] >= before["floor_ms"] > 0 and before["event_retention_ms"] >= before["floor_ms"]
    week, fortnight = 7 * 86_400_000, 14 * 86_400_000
    change = {"retention_ms": fortnight, "reason": "finance asks for two weeks"}
    assert (await api.client.put("/v1/retention", json=change, headers=api.auth(OP))).status_code == 403
    assert (await api.client.put("/v1/retention", json=change)).status_code == 401
    low = await api.client.put("/v1/retention", json={"retention_ms": before["floor_ms"] - 1, "reason": "x"},
                               headers=api.auth(Role.ADMIN))  # fmt: skip
    assert low.status_code == 422 and low.json()["errors"][0]["field"] == "retention_ms"
    nothing = await api.client.put("/v1/retention", json={"reason": "x"}, headers=api.auth(Role.ADMIN))
    assert nothing.status_code == 422
    no_reason = await api.client.put("/v1/retention", json={"retention_ms": fortnight}, headers=api.auth(Role.ADMIN))
    assert no_reason.status_code == 422 and no_reason.json()["errors"][0]["field"] == "reason"
    assert (await api.client.get("/v1/retention", headers=api.auth(OP))).json() == before  # nothing changed

    changed = await api.client.put("/v1/retention", json=change, headers=api.auth(Role.ADMIN))
    assert changed.status_code == 200, changed.text
    assert changed.json()["before"] == before
    assert changed.json()["after"] == {**before, "retention_ms": fortnight}
    assert (await api.client.get("/v1/retention", headers=api.auth(OP))).json()["retention_ms"] == fortnight
    events = [e for e in (await api.queue.events_after(0)).value if e.type is EventType.RETENTION_SET]
    assert [(e.data["actor"], e.data["reason"]) for e in events] == [("admin", "finance asks for two weeks")]
    assert before["retention_ms"] == week  # the default the docs promise
