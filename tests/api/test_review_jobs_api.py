"""The redrive jobs of the JSON API: dry run numbers, a job redriving a filter's dead letters with a
result per item, cancel halfway (the rest stay dead, listed not redriven), pause and resume, and
four eyes for a bulk job. The maintenance driver's part (stepping running jobs) is played by the
test: `step_job` is the command it proposes."""

from __future__ import annotations

import asyncio
from typing import Any

from api_support import Api, dead_letters, running_api

from queues import Role, State
from raft_store.testing.inprocess import StoreThread

R, A, OP = Role.REVIEWER, Role.APPROVER, Role.OPERATOR


def list_update(key: str, amount_minor: int = 100, currency: str = "CNY") -> dict[str, Any]:
    return {"kind": "list_update", "ref_key": f"rp-{key}",
            "payload": {"red_packet_id": f"rp-{key}", "receiver": "user-7", "version": 1,
                        "amount_minor": amount_minor, "currency": currency}}  # fmt: skip


async def drive(api: Api, job_id: int, *, redriven: int | None = None) -> None:
    """What the maintenance driver does: step the job (at its rate, by the leader's time) until it
    is done, or until `redriven` items are."""
    for _ in range(200):
        (job,) = (await api.queue.jobs(ids=[job_id])).value
        if job.pending == 0 or (redriven is not None and job.redriven >= redriven):
            return
        limit = 300 if redriven is None else redriven - job.redriven
        await api.queue.step_job(job_id, limit=limit)
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} did not get there")


async def states(api: Api, ids: list[str]) -> list[State]:
    views = (await api.queue.get_many([int(i.split("-")[1]) for i in ids], with_history=False)).value
    by_id = {f"1-{v.message_id}": v.state for v in views}
    return [by_id[i] for i in ids]


async def test_dry_run_counts_and_totals_without_changing_anything(api: Api) -> None:
    ids = await dead_letters(api, list_update("a", 1250), list_update("b", 250), list_update("c", 7, "JPY"))
    answer = await api.client.post("/v1/review/jobs:dry-run", json={"filter": {"kind": "list_update"}}, headers=api.auth(R))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["count"] == 3 and body["without_amount"] == 0 and body["needs_approval"] is None
    assert body["totals"] == [{"currency": "CNY", "count": 2, "amount_minor": 1500, "amount": "15.00"},
                              {"currency": "JPY", "count": 1, "amount_minor": 7, "amount": "7"}]  # fmt: skip
    assert body["oldest"]["id"] in ids
    selection = await api.client.post("/v1/review/jobs:dry-run", json={"ids": ids[:1]}, headers=api.auth(R))
    assert selection.json()["count"] == 1 and selection.json()["oldest"]["id"] == ids[0]
    nothing = await api.client.post("/v1/review/jobs:dry-run", json={"filter": {"kind": "transfer"}}, headers=api.auth(R))
    assert nothing.status_code == 200 and nothing.json()["count"] == 0
    by_amount = await api.client.post("/v1/review/jobs:dry-run", headers=api.auth(R),
                                      json={"filter": {"currency": "CNY", "amount_min_minor": 1000}})  # fmt: skip
    assert by_amount.json()["count"] == 1
    empty_range = await api.client.post("/v1/review/jobs:dry-run", headers=api.auth(R),
                                        json={"filter": {"currency": "CNY", "amount_min_minor": 9, "amount_max_minor": 1}})  # fmt: skip
    assert empty_range.status_code == 422 and empty_range.json()["errors"][0]["field"] == "amount_max"
    assert await states(api, ids) == [State.DEAD] * 3


async def test_a_job_redrives_a_filters_dead_letters_item_by_item(api: Api) -> None:
    ids = await dead_letters(api, *(list_update(f"j{n}") for n in range(4)))
    started = await api.client.post("/v1/review/jobs", json={"filter": {"kind": "list_update"}, "reason": "bank is back",
                                                             "rate_per_s": 1000}, headers=api.auth(R))  # fmt: skip
    assert started.status_code == 201, started.text
    job = started.json()
    assert (job["state"], job["total"], job["pending"], job["actor"], job["rate_per_s"]) == ("running", 4, 4, "reviewer", 1000)
    assert started.headers["location"] == f"/v1/review/jobs/{job['id']}"
    await drive(api, job["id"])
    done = (await api.client.get(f"/v1/review/jobs/{job['id']}", headers=api.auth(OP))).json()
    assert (done["state"], done["redriven"], done["pending"]) == ("done", 4, 0)
    items = (await api.client.get(f"/v1/review/jobs/{job['id']}/items", headers=api.auth(A))).json()
    assert [(i["id"], i["result"]) for i in items["items"]] == [(i, "redriven") for i in ids]
    assert await states(api, ids) == [State.READY] * 4
    listed = (await api.client.get("/v1/review/jobs", headers=api.auth(R))).json()
    assert [j["id"] for j in listed] == [job["id"]]


async def test_cancel_halfway_leaves_the_rest_dead_and_listed_not_redriven(api: Api) -> None:
    ids = await dead_letters(api, *(list_update(f"c{n}") for n in range(6)))
    job = (await api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "slowly", "rate_per_s": 1000},
                                 headers=api.auth(R))).json()  # fmt: skip
    await drive(api, job["id"], redriven=2)
    paused = await api.client.post(f"/v1/review/jobs/{job['id']}/pause", json={"reason": "look first"}, headers=api.auth(R))
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    again = await api.client.post(f"/v1/review/jobs/{job['id']}/pause", json={"reason": "twice"}, headers=api.auth(R))
    assert again.status_code == 409
    resumed = await api.client.post(f"/v1/review/jobs/{job['id']}/resume", json={"reason": "ok"}, headers=api.auth(R))
    assert resumed.json()["state"] == "running"
    cancelled = await api.client.post(f"/v1/review/jobs/{job['id']}/cancel", json={"reason": "enough"}, headers=api.auth(R))
    assert cancelled.status_code == 200, cancelled.text
    counters = cancelled.json()
    assert (counters["state"], counters["redriven"], counters["not_redriven"], counters["pending"]) == ("cancelled", 2, 4, 0)
    not_redriven = (await api.client.get(f"/v1/review/jobs/{job['id']}/items?result=not_redriven&limit=3",
                                         headers=api.auth(R))).json()  # fmt: skip
    rest = (await api.client.get(f"/v1/review/jobs/{job['id']}/items?result=not_redriven&after={not_redriven['next_after']}",
                                 headers=api.auth(R))).json()  # fmt: skip
    listed = [i["id"] for i in (*not_redriven["items"], *rest["items"])]
    assert sorted(listed) == sorted(ids[2:]) and rest["next_after"] is None
    assert await states(api, ids) == [State.READY] * 2 + [State.DEAD] * 4
    audit = [e["action"] for e in (await api.client.get("/v1/audit", headers=api.auth(OP))).json()["entries"]]
    assert {"redrive_job", "pause_job", "resume_job", "cancel_job"} <= set(audit)
    for method, path in (("GET", "/v1/review/jobs/999"), ("GET", "/v1/review/jobs/999/items"),
                         ("POST", "/v1/review/jobs/999/cancel")):  # fmt: skip
        answer = await api.client.request(method, path, json={"reason": "x"}, headers=api.auth(R))
        assert answer.status_code == 404, (path, answer.text)


async def test_a_bulk_job_is_a_proposal_the_approval_starts(store: StoreThread) -> None:
    async with running_api(store, review__bulk_count_max="2") as api:
        ids = await dead_letters(api, *(list_update(f"b{n}") for n in range(3)))
        dry = (await api.client.post("/v1/review/jobs:dry-run", json={"ids": ids}, headers=api.auth(R))).json()
        assert dry["needs_approval"] == "it acts on 3 requests, more than 2"
        proposed = await api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "all"}, headers=api.auth(R))
        assert proposed.status_code == 202, proposed.text
        proposal = proposed.json()["proposal"]
        assert proposed.json()["rate_per_s"] == 20 and sorted(proposal["targets"]) == sorted(ids)
        assert (await api.client.get("/v1/review/jobs", headers=api.auth(R))).json() == []
        approved = await api.client.post(f"/v1/review/proposals/{proposal['id']}/approve", json={}, headers=api.auth(A))
        assert approved.status_code == 200, approved.text
        (job,) = (await api.client.get("/v1/review/jobs", headers=api.auth(R))).json()
        assert (job["proposal"], job["approved_by"], job["total"], job["rate_per_s"]) == (proposal["id"], "approver", 3, 20)
