"""A redrive job over several sets' dead letters (docs/review.md, "Several sets"; api/review_groups.py):
one part per set, stored and audited in its set under one group id, shown as one (summed counters,
money per currency, each set's part), cancelled as one; created again safely with the same
Idempotency-Key or group after a set did not answer (503 partially-applied naming the sets); and
when the whole needs four eyes, every part proposed and one approval of the group approving every
part in its set, repeated safely after a set missed it. The control set and three sets are
one-node stores in this process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import Api, running_api
from sets_support import dead_in_sets, list_update, set_stores, stop_after, write_table

import api.review_groups as groups
from queues import Role
from raft_store.testing.inprocess import StoreThread

R, A, V = Role.REVIEWER, Role.APPROVER, Role.VIEWER


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    with set_stores(tmp_path) as started:
        yield started


async def audited(api: Api, action: str) -> list[dict[str, Any]]:
    answer = await api.client.get("/v1/audit", params={"action": action}, headers=api.auth(V))
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


async def test_a_job_over_every_set_is_one_group_created_once_per_set_and_cancelled_as_one(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = await write_table(stores)
    async with running_api(stores[1], **overrides, review__bulk_count_max="100") as api:
        amounts = [100 + n for n in range(9)]
        ids = await dead_in_sets(api, stores, *(list_update(f"g{n}", a) for n, a in enumerate(amounts)), prefix="g")
        per_set = {s: [i for i in ids if i.startswith(f"{s}-")] for s in (1, 2, 3)}
        assert all(per_set.values()), ids
        every = {"filter": {"kind": "list_update"}}
        dry = await api.client.post("/v1/review/jobs:dry-run", json=every, headers=api.auth(R))
        assert dry.status_code == 200, dry.text
        assert dry.json()["count"] == 9 and dry.json()["needs_approval"] is None
        assert dry.json()["totals"] == [{"currency": "CNY", "count": 9, "amount_minor": sum(amounts), "amount": "9.36"}]
        assert [(s["set"], s["count"]) for s in dry.json()["sets"]] == [(s, len(per_set[s])) for s in (1, 2, 3)]
        narrowed = await api.client.post("/v1/review/jobs:dry-run", json={"filter": {"kind": "list_update", "set": 3}},
                                         headers=api.auth(R))  # fmt: skip
        assert narrowed.json()["count"] == len(per_set[3]) and "sets" not in narrowed.json()
        unknown = await api.client.post("/v1/review/jobs:dry-run", json={"filter": {"set": 9}}, headers=api.auth(R))
        assert unknown.status_code == 404

        body = {**every, "reason": "bank is back", "rate_per_s": 1}
        key = {**api.auth(R), "Idempotency-Key": "redrive-all-1"}
        started = await api.client.post("/v1/review/jobs", json=body, headers=key)
        assert started.status_code == 201, started.text
        group = started.json()["group"]
        assert started.headers["location"] == f"/v1/review/job-groups/{group}"
        assert (started.json()["state"], started.json()["total"], started.json()["pending"]) == ("running", 9, 9)
        parts = {p["set"]: p["job"]["id"] for p in started.json()["sets"]}
        assert sorted(parts) == [1, 2, 3] and all(p["job"]["total"] == len(per_set[p["set"]]) for p in started.json()["sets"])
        again = await api.client.post("/v1/review/jobs", json=body, headers=key)  # the same key: the same parts
        assert again.status_code == 201 and again.json()["group"] == group
        assert {p["set"]: p["job"]["id"] for p in again.json()["sets"]} == parts
        listed = (await api.client.get("/v1/review/jobs", headers=api.auth(V))).json()
        assert sorted((j["set"], j["id"]) for j in listed) == sorted(parts.items())  # one job per set, not two
        entries = await audited(api, "redrive_job")
        assert sorted(e["set"] for e in entries) == [1, 2, 3] and all(e["after"]["group"] == group for e in entries)

        cancelled = await api.client.post(f"/v1/review/job-groups/{group}/cancel", json={"reason": "wrong batch"},
                                          headers=api.auth(R))  # fmt: skip
        assert cancelled.status_code == 200, cancelled.text
        assert (cancelled.json()["state"], cancelled.json()["not_redriven"]) == ("cancelled", 9)
        assert {p["job"]["state"] for p in cancelled.json()["sets"]} == {"cancelled"}
        repeat = await api.client.post(f"/v1/review/job-groups/{group}/cancel", json={"reason": "again"},
                                       headers=api.auth(R))  # fmt: skip
        assert repeat.status_code == 200 and repeat.json()["state"] == "cancelled"
        assert (await api.client.get(f"/v1/review/job-groups/{'0' * 32}", headers=api.auth(V))).status_code == 404

        stop_after(monkeypatch, groups, "targets", stores[3])
        key = {**api.auth(R), "Idempotency-Key": "redrive-all-2"}
        try:
            half = await api.client.post("/v1/review/jobs", json=body, headers=key)
            assert half.status_code == 503 and half.headers["retry-after"], half.text
            problem = half.json()
            assert problem["type"] == "/problems/partially-applied"
            assert (problem["applied_sets"], problem["unapplied_sets"]) == ([1, 2], [3])
            second = problem["group"]
            assert second != group and second in problem["detail"]
            seen = await api.client.get(f"/v1/review/job-groups/{second}", headers=api.auth(V))
            assert seen.status_code == 503 and seen.json()["unanswered_sets"] == [3]
            partial = await api.client.get(f"/v1/review/job-groups/{second}?partial=true", headers=api.auth(V))
            assert partial.json()["partial"] is True and [p["set"] for p in partial.json()["sets"]] == [1, 2]
        finally:
            monkeypatch.undo()
            stores[3].start_node()
        completed = await api.client.post("/v1/review/jobs", json={**body, "group": second}, headers=api.auth(R))
        assert completed.status_code == 201, completed.text
        assert completed.json()["group"] == second and [p["set"] for p in completed.json()["sets"]] == [1, 2, 3]
        assert completed.json()["total"] == 9
        listed = (await api.client.get("/v1/review/jobs", headers=api.auth(V))).json()
        assert len(listed) == 6  # two groups, one part per set each
        stores[2].stop_node()
        try:
            missed = await api.client.post(f"/v1/review/job-groups/{second}/cancel", json={"reason": "stop"},
                                           headers=api.auth(R))  # fmt: skip
            assert missed.status_code == 503, missed.text
            assert (missed.json()["applied_sets"], missed.json()["unapplied_sets"]) == ([1, 3], [2])
        finally:
            stores[2].start_node()
        whole = await api.client.post(f"/v1/review/job-groups/{second}/cancel", json={"reason": "stop"}, headers=api.auth(R))
        assert whole.status_code == 200 and {p["job"]["state"] for p in whole.json()["sets"]} == {"cancelled"}


async def test_a_group_needing_four_eyes_is_approved_once_for_every_set_even_after_a_set_missed_it(
    stores: dict[int, StoreThread],
) -> None:
    overrides = await write_table(stores)
    async with running_api(stores[1], **overrides, review__bulk_count_max="4") as api:
        amounts = [200 + n for n in range(9)]
        ids = await dead_in_sets(api, stores, *(list_update(f"p{n}", a) for n, a in enumerate(amounts)), prefix="p")
        proposed = await api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "funds back", "rate_per_s": 5},
                                         headers=api.auth(R))  # fmt: skip
        assert proposed.status_code == 202, proposed.text
        assert "more than 4" in proposed.json()["why"]  # decided on the whole: no set alone holds more than 4
        group = proposed.json()["group"]
        assert group["state"] == "proposed" and group["total"] == 0
        assert group["proposal"]["targets"] == 9 and group["proposal"]["states"] == ["pending"]
        assert group["proposal"]["pays"]["totals"][0]["amount_minor"] == sum(amounts)
        parts = {p["set"]: p["proposal"] for p in group["sets"]}
        assert sorted(parts) == [1, 2, 3] and all(p["group"] == group["group"] for p in parts.values())
        assert sum(len(p["targets"]) for p in parts.values()) == 9
        alone = await api.client.post(f"/v1/review/proposals/{parts[2]['id']}/approve?set=2", json={}, headers=api.auth(A))
        assert alone.status_code == 409 and group["group"] in alone.json()["detail"]
        viewer = await api.client.post(f"/v1/review/job-groups/{group['group']}/reject", json={"reason": "x"},
                                    headers=api.auth(V))  # fmt: skip
        assert viewer.status_code == 403

        stores[2].stop_node()
        try:
            half = await api.client.post(f"/v1/review/job-groups/{group['group']}/approve", json={"reason": "checked"},
                                         headers=api.auth(A))  # fmt: skip
            assert half.status_code == 503, half.text
            assert (half.json()["applied_sets"], half.json()["unapplied_sets"]) == ([1, 3], [2])
        finally:
            stores[2].start_node()
        halfway = (await api.client.get(f"/v1/review/job-groups/{group['group']}", headers=api.auth(V))).json()
        assert halfway["state"] == "proposed" and halfway["proposal"]["states"] == ["approved", "pending"]
        assert [p["job"] is not None for p in halfway["sets"]] == [True, False, True]  # sets 1 and 3 run already
        approved = await api.client.post(f"/v1/review/job-groups/{group['group']}/approve", json={"reason": "checked"},
                                         headers=api.auth(A))  # fmt: skip
        assert approved.status_code == 200, approved.text
        whole = approved.json()
        assert whole["state"] == "running" and whole["total"] == 9
        assert whole["proposal"]["states"] == ["approved"] and whole["proposal"]["decided_by"] == ["approver"]
        assert all(p["job"]["approved_by"] == "approver" and p["job"]["proposal"] == p["proposal"]["id"]
                   for p in whole["sets"])  # fmt: skip
        approvals = await audited(api, "approve")
        assert sorted(e["set"] for e in approvals) == [1, 2, 3]
        assert all(e["actor"] == "approver" and e["after"]["group"] == group["group"] for e in approvals)
        mine = await api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "mine", "rate_per_s": 5},
                                     headers={**api.auth(Role.ADMIN), "Idempotency-Key": "admin-1"})  # fmt: skip
        assert mine.status_code == 202, mine.text
        own = mine.json()["group"]["group"]
        refused = await api.client.post(f"/v1/review/job-groups/{own}/approve", json={}, headers=api.auth(Role.ADMIN))
        assert refused.status_code == 403 and refused.json()["type"] == "/problems/own-proposal"
        still = (await api.client.get(f"/v1/review/job-groups/{own}", headers=api.auth(V))).json()
        assert still["proposal"]["states"] == ["pending"] and still["total"] == 0  # no set was asked


async def test_a_part_that_expired_while_its_set_was_down_is_proposed_again_and_approved_with_the_group(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set 2 misses the group's approval and is down until its part's proposal expires: the others
    run, set 2's part is `expired` and a repeated approval is refused; `repropose` proposes that part
    again in set 2 (audited, `renews` naming the expired one; repeated safely) and the approver's
    approval of the group starts it."""
    overrides = await write_table(stores)
    async with running_api(stores[1], **overrides, review__bulk_count_max="4") as api:
        ids = await dead_in_sets(api, stores, *(list_update(f"x{n}", 300 + n) for n in range(9)), prefix="x")
        proposed = await api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "funds back", "rate_per_s": 5},
                                         headers=api.auth(R))  # fmt: skip
        assert proposed.status_code == 202, proposed.text
        group = proposed.json()["group"]["group"]
        before = {p["set"]: p["proposal"]["id"] for p in proposed.json()["group"]["sets"]}
        stores[2].stop_node()
        try:
            half = await api.client.post(f"/v1/review/job-groups/{group}/approve", json={"reason": "ok"}, headers=api.auth(A))
            assert half.status_code == 503 and half.json()["unapplied_sets"] == [2], half.text
            real = time.time_ns
            monkeypatch.setattr(time, "time_ns", lambda: real() + 2 * 86_400 * 10**9)  # two days on: past its expiry
        finally:
            stores[2].start_node()
        seen = (await api.client.get(f"/v1/review/job-groups/{group}", headers=api.auth(V))).json()
        assert {p["set"]: p["proposal"]["state"] for p in seen["sets"]} == {1: "approved", 2: "expired", 3: "approved"}
        late = await api.client.post(f"/v1/review/job-groups/{group}/approve", json={"reason": "ok"}, headers=api.auth(A))
        assert late.status_code == 409 and "set 2" in late.json()["detail"], late.text
        viewer = await api.client.post(f"/v1/review/job-groups/{group}/repropose", json={"reason": "x"}, headers=api.auth(V))
        assert viewer.status_code == 403

        again = await api.client.post(f"/v1/review/job-groups/{group}/repropose", json={"reason": "set 2 was down"},
                                      headers=api.auth(R))  # fmt: skip
        assert again.status_code == 200, again.text
        renewed = {p["set"]: p["proposal"] for p in again.json()["sets"]}
        assert again.json()["state"] == "proposed" and renewed[2]["state"] == "pending" and renewed[2]["id"] != before[2]
        assert renewed[2]["targets"] == [i for i in ids if i.startswith("2-")]
        repeat = await api.client.post(f"/v1/review/job-groups/{group}/repropose", json={"reason": "set 2 was down"},
                                       headers=api.auth(R))  # fmt: skip
        assert repeat.status_code == 200 and {p["set"]: p["proposal"]["id"] for p in repeat.json()["sets"]} == {
            s: p["id"] for s, p in renewed.items()}  # nothing proposed twice
        entries = [e for e in await audited(api, "propose") if e["set"] == 2]
        assert len(entries) == 2 and entries[0]["after"]["renews"] == before[2] and entries[0]["reason"] == "set 2 was down"
        own = await api.client.post(f"/v1/review/job-groups/{group}/approve", json={}, headers=api.auth(R))
        assert own.status_code == 403  # a reviewer does not approve (and the proposer never would)
        approved = await api.client.post(f"/v1/review/job-groups/{group}/approve", json={"reason": "ok"},
                                         headers=api.auth(A))  # fmt: skip
        assert approved.status_code == 200, approved.text
        assert approved.json()["state"] == "running" and approved.json()["total"] == 9
        assert {p["set"]: p["job"]["approved_by"] for p in approved.json()["sets"]} == {1: "approver", 2: "approver",
                                                                                        3: "approver"}  # fmt: skip
