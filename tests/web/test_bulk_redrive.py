"""The issue's bulk check: 10,000 dead letters redriven by filter, with the real maintenance driver
stepping the job. The reviewer's dry run counts them, the job is a proposal (a bulk above the
configured count), the approvals inbox shows its size and total, the approval starts it, and a
cancel halfway leaves what was not redriven dead and listed as such (never as redriven); a second
job by the same filter then redrives exactly the rest, item by item."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pages_support import Pages, running_pages

from queues import DeadLetterFilter, Enqueue, QueueClient, RaftClient, Role, State
from queues.maintenance import MaintenanceConfig, MaintenanceDriver
from raft_store.testing.inprocess import StoreThread

R, A = Role.REVIEWER, Role.APPROVER
COUNT = 10_000
BULK = {"kind": "transfer", "error_class": "bulk_outage"}


async def dead_transfers(pages: Pages, count: int) -> list[int]:
    """`count` dead transfers of 1.00 CNY each, stored as the intake stores them and dead-lettered
    by a worker's permanent failure (class ``bulk_outage``), in id order."""
    queue = pages.api.queue
    ids: list[int] = []
    for start in range(0, count, 1000):
        batch = [Enqueue(kind="transfer", idempotency_key=f"producer:bulk-{n}", ref_key=f"rp-bulk-{n}",
                         payload=json.dumps({"transfer_id": f"tr-bulk-{n}", "payer": "escrow", "payee": f"user-{n}",
                                             "amount_minor": 100, "currency": "CNY"}).encode())
                 for n in range(start, min(count, start + 1000))]  # fmt: skip
        ids += [result.message_id for result in await queue.enqueue_many(batch)]
    while grants := (await queue.lease("w", kinds=("transfer",), count_max=1000, lease_ms=60_000)).grants:
        await asyncio.gather(*(queue.fail(g.message_id, g.token, "bulk_outage", "HTTP 503", permanent=True)
                               for g in grants))  # fmt: skip
    return ids


async def job_json(pages: Pages, job_id: int) -> dict[str, Any]:
    answer = await pages.api.client.get(f"/v1/review/jobs/{job_id}", headers=pages.api.auth(R))
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def item_ids(pages: Pages, job_id: int, result: str) -> list[str]:
    found: list[str] = []
    query: dict[str, str | int] = {"result": result, "limit": 1000}
    while True:
        answer = await pages.api.client.get(f"/v1/review/jobs/{job_id}/items", params=query, headers=pages.api.auth(R))
        assert answer.status_code == 200, answer.text
        found += [item["id"] for item in answer.json()["items"]]
        if answer.json()["next_after"] is None:
            return found
        query["after"] = answer.json()["next_after"]


async def approve_the_job(pages: Pages, reason: str, rate_per_s: int) -> tuple[int, str]:
    """Proposed through the JSON API, approved in the approvals inbox; the started job's id, and the
    inbox as the approver saw it."""
    api = pages.api
    proposed = await api.client.post("/v1/review/jobs", json={"filter": BULK, "reason": reason, "rate_per_s": rate_per_s},
                                     headers=api.auth(R))  # fmt: skip
    assert proposed.status_code == 202, proposed.text
    proposal = proposed.json()["proposal"]
    inbox = await pages.get(A, "/review/approvals")
    assert inbox.status_code == 200, inbox.text[:500]
    approved = await pages.post(A, f"/review/approvals/{proposal['id']}/approve", {"reason": "checked"})
    assert approved.status_code == 200 and 'data-kind="success"' in approved.text, approved.text[:500]
    jobs = (await api.client.get("/v1/review/jobs", headers=api.auth(R))).json()
    (job,) = [j for j in jobs if j["proposal"] == proposal["id"]]
    return int(job["id"]), inbox.text


async def test_ten_thousand_by_filter_cancelled_halfway_then_the_rest(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        api = pages.api
        stored = await dead_transfers(pages, COUNT)
        dry = (await api.client.post("/v1/review/jobs:dry-run", json={"filter": BULK}, headers=api.auth(R))).json()
        assert dry["count"] == COUNT and dry["totals"] == [{"currency": "CNY", "count": COUNT, "amount_minor": 100 * COUNT,
                                                                   "amount": f"{COUNT}.00"}]
        assert dry["oldest"]["id"] == f"1-{stored[0]}" and dry["needs_approval"] is not None

        driver = MaintenanceDriver(QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10), coalesce=False),
                                   MaintenanceConfig(expire_every_s=0.1, purge_every_s=60.0, job_limit=500))  # fmt: skip
        driver.start()
        try:
            first_id, inbox = await approve_the_job(pages, "payment system back", 2000)
            assert f'data-test="proposal-target-count">{COUNT}<' in inbox
            assert f'data-currency="CNY" data-amount-minor="{100 * COUNT}"' in inbox
            for _ in range(1000):
                if (await job_json(pages, first_id))["redriven"] >= COUNT // 2:
                    break
                await asyncio.sleep(0.02)
            cancelled = await api.client.post(f"/v1/review/jobs/{first_id}/cancel", json={"reason": "halfway"},
                                              headers=api.auth(R))  # fmt: skip
            assert cancelled.status_code == 200, cancelled.text
            first = cancelled.json()
            assert first["state"] == "cancelled" and first["pending"] == 0 and first["refused"] == 0
            assert 0 < first["not_redriven"] < COUNT and first["redriven"] + first["not_redriven"] == COUNT
            redriven, rest = await item_ids(pages, first_id, "redriven"), await item_ids(pages, first_id, "not_redriven")
            assert len(redriven) == first["redriven"] and sorted(redriven + rest) == sorted(f"1-{m}" for m in stored)
            states = {v.message_id: v.state for v in (await api.queue.get_many(stored[:1000], with_history=False)).value}
            for start in range(1000, COUNT, 1000):
                views = (await api.queue.get_many(stored[start:start + 1000], with_history=False)).value
                states.update((v.message_id, v.state) for v in views)
            assert {states[int(i.split("-")[1])] for i in rest} == {State.DEAD}
            assert State.DEAD not in {states[int(i.split("-")[1])] for i in redriven}
            left = (await api.client.post("/v1/review/jobs:dry-run", json={"filter": BULK}, headers=api.auth(R))).json()
            assert left["count"] == len(rest)
            job_page = await pages.get(R, f"/review/jobs/{first_id}")
            assert 'data-test="job-state"' in job_page.text and "cancelled" in job_page.text

            second_id, _ = await approve_the_job(pages, "the rest", 5000)
            for _ in range(1000):
                second = await job_json(pages, second_id)
                if second["state"] == "done":
                    break
                await asyncio.sleep(0.02)
            assert (second["state"], second["total"], second["redriven"], second["refused"]) == ("done", len(rest), len(rest), 0)
            assert sorted(await item_ids(pages, second_id, "redriven")) == sorted(rest)
        finally:
            await driver.stop()
            await driver.queue.raft.close()
        assert (await api.queue.dead_letter_summary(DeadLetterFilter(kind="transfer"))).value.count == 0
