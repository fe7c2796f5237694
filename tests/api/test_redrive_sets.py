"""A redrive at once of dead letters of several sets (`POST /v1/review/redrive`; api/review_redrive.py):
each set's part redriven in its set and audited there; a set lost between reading the targets and
redriving answers the 503 partially-applied naming it, and the same request repeated redrives only
that set's part; a filter takes the oldest over every set; four eyes decided on the whole propose
one job group (found again by the same Idempotency-Key after a set missed it) whose one approval
redrives every part. The control set and three sets are one-node stores in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import Api, running_api
from sets_support import client, dead_in_sets, list_update, set_stores, stop_after, write_table

import api.review_redrive as spanning
from queues import Role
from raft_store.testing.inprocess import StoreThread

R, A, V = Role.REVIEWER, Role.APPROVER, Role.VIEWER


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    with set_stores(tmp_path) as started:
        yield started


async def states(api: Api, ids: list[str]) -> set[str]:
    found = set()
    for request_id in ids:
        answer = await api.client.get(f"/v1/requests/{request_id}", headers=api.auth(Role.OPERATOR))
        assert answer.status_code == 200, answer.text
        found.add(answer.json()["state"])
    return found


async def test_a_redrive_over_every_set_is_done_in_each_set_and_repeated_safely_after_a_set_missed_it(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = await write_table(stores)
    async with running_api(stores[1], **overrides, review__bulk_count_max="4") as api:
        ids = await dead_in_sets(api, stores, *(list_update(f"rr{n}", 100 + n) for n in range(18)), prefix="rr")
        per_set = {s: [i for i in ids if i.startswith(f"{s}-")] for s in (1, 2, 3)}
        assert all(len(found) >= 3 for found in per_set.values()), ids
        chosen = [per_set[1][0], per_set[2][0], per_set[3][0]]
        done = await api.client.post("/v1/review/redrive", json={"ids": chosen, "reason": "bank is back"},
                                     headers=api.auth(R))  # fmt: skip
        assert done.status_code == 200, done.text
        assert (done.json()["outcome"], sorted(done.json()["redriven"]), done.json()["refused"]) == ("done", sorted(chosen), [])
        assert [(s["set"], s["redriven"]) for s in done.json()["sets"]] == [(1, 1), (2, 1), (3, 1)]
        assert await states(api, chosen) == {"ready"}
        entries = (await api.client.get("/v1/audit", params={"action": "redriven"}, headers=api.auth(V))).json()["entries"]
        assert sorted((e["set"], e["actor"]) for e in entries) == [(1, "reviewer"), (2, "reviewer"), (3, "reviewer")]
        again = await api.client.post("/v1/review/redrive", json={"ids": chosen, "reason": "bank is back"},
                                      headers=api.auth(R))  # fmt: skip
        assert again.status_code == 200 and again.json()["redriven"] == []
        assert {r["reason"] for r in again.json()["refused"]} == {"illegal_state"} and len(again.json()["refused"]) == 3
        viewer = await api.client.post("/v1/review/redrive", json={"ids": chosen, "reason": "x"}, headers=api.auth(V))
        assert viewer.status_code == 403
        missing = await api.client.post("/v1/review/redrive", json={"ids": [per_set[1][1], "2-999999"], "reason": "x"},
                                        headers=api.auth(R))  # fmt: skip
        assert missing.status_code == 404 and await states(api, [per_set[1][1]]) == {"dead"}  # nothing done
        alone = await api.client.post("/v1/review/redrive", json={"ids": [per_set[2][-1]], "reason": "one set"},
                                      headers=api.auth(R))  # fmt: skip
        assert alone.status_code == 200 and alone.json() == {"outcome": "done", "redriven": [per_set[2][-1]],
                                                              "refused": []}  # one set's: its answer as always

        second = [per_set[1][1], per_set[2][1], per_set[3][1]]
        stop_after(monkeypatch, spanning, "parts_of_ids", stores[3])
        try:
            half = await api.client.post("/v1/review/redrive", json={"ids": second, "reason": "funds back"},
                                         headers=api.auth(R))  # fmt: skip
            assert half.status_code == 503 and half.headers["retry-after"], half.text
            problem = half.json()
            assert problem["type"] == "/problems/partially-applied"
            assert (problem["applied_sets"], problem["unapplied_sets"]) == ([1, 2], [3])
            assert sorted(problem["redriven"]) == sorted(second[:2]) and "set 3 did not answer" in problem["detail"]
        finally:
            monkeypatch.undo()
            stores[3].start_node()
        assert await states(api, [second[2]]) == {"dead"}
        repeated = await api.client.post("/v1/review/redrive", json={"ids": second, "reason": "funds back"},
                                         headers=api.auth(R))  # fmt: skip
        assert repeated.status_code == 200, repeated.text
        assert repeated.json()["redriven"] == [second[2]]  # set 3's part only: nothing redriven twice
        assert sorted(r["id"] for r in repeated.json()["refused"]) == sorted(second[:2])

        rest = sorted(set(ids) - set(chosen) - set(second) - {per_set[2][-1]})
        oldest = await api.client.get("/v1/review/dead-letters", params={"limit": "3"}, headers=api.auth(V))
        expected = [item["id"] for item in oldest.json()["items"]]
        by_filter = await api.client.post("/v1/review/redrive", headers=api.auth(R),
                                          json={"filter": {"kind": "list_update"}, "limit": 3, "reason": "oldest"})  # fmt: skip
        assert by_filter.status_code == 200, by_filter.text
        assert sorted(by_filter.json()["redriven"]) == sorted(expected)  # the oldest three over every set

        left = sorted(set(rest) - set(expected))
        assert len(left) > 4 and len({i.split("-")[0] for i in left}) > 1
        stop_after(monkeypatch, spanning, "parts_of_ids", stores[2])
        key = {**api.auth(R), "Idempotency-Key": "redrive-left-1"}
        try:
            half = await api.client.post("/v1/review/redrive", json={"ids": left, "reason": "all of them"}, headers=key)
            assert half.status_code == 503 and half.json()["unapplied_sets"] == [2], half.text
            group = half.json()["group"]
        finally:
            monkeypatch.undo()
            stores[2].start_node()
        proposed = await api.client.post("/v1/review/redrive", json={"ids": left, "reason": "all of them"}, headers=key)
        assert proposed.status_code == 202, proposed.text
        assert "more than 4" in proposed.json()["why"] and proposed.json()["group"]["group"] == group
        assert proposed.headers["location"] == f"/v1/review/job-groups/{group}"
        document = proposed.json()["group"]
        assert document["proposal"]["targets"] == len(left) and document["proposal"]["states"] == ["pending"]
        assert sorted(p["set"] for p in document["sets"]) == sorted({int(i.split("-")[0]) for i in left})
        assert await states(api, left) == {"dead"}  # nothing redriven before the approval
        approved = await api.client.post(f"/v1/review/job-groups/{group}/approve", json={"reason": "checked"},
                                         headers=api.auth(A))  # fmt: skip
        assert approved.status_code == 200 and approved.json()["total"] == len(left), approved.text
        for part in approved.json()["sets"]:  # the approved parts are jobs (a maintenance driver steps them)
            queue = client(stores[part["set"]])
            try:
                for _ in range(50):
                    if (await queue.step_job(part["job"]["id"])).pending == 0:
                        break
                    await asyncio.sleep(0.1)
            finally:
                await queue.raft.close()
        assert await states(api, left) == {"ready"}
