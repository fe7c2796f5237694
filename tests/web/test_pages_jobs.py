"""Bulk redrives from the pages: the dry run's numbers, a confirmed job redriving a filter's dead
letters with its items listed, cancel halfway (the rest stay dead, listed not redriven), and a bulk
job proposed under four eyes. The maintenance driver's stepping is the test's `step_job` calls."""

from __future__ import annotations

import asyncio
import re

from api_support import dead_letters as dead
from pages_support import Pages, list_update, marked_ids, running_pages

from queues import Role, State
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER


async def drive(pages: Pages, job_id: int, *, redriven: int | None = None) -> None:
    for _ in range(200):
        (job,) = (await pages.api.queue.jobs(ids=[job_id])).value
        if job.pending == 0 or (redriven is not None and job.redriven >= redriven):
            return
        await pages.api.queue.step_job(job_id, limit=300 if redriven is None else redriven - job.redriven)
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} did not get there")


def figure(html: str, name: str) -> str:
    found = re.search(rf'data-test="{name}"[^>]*>([^<]+)<', html)
    assert found, name
    return found.group(1)


async def test_dry_run_then_a_job_redrives_the_filter_item_by_item(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        ids = await dead(pages.api, *(list_update(f"j{n}", 1000 + n) for n in range(4)), list_update("y", 5, "JPY"))
        await dead(pages.api, list_update("other"), error_class="timeout")
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter", "error_class": "insufficient_funds"})
        assert dry.status_code == 200, dry.text
        assert figure(dry.text, "dry-run-count") == "5"
        assert 'data-currency="CNY" data-count="4" data-amount-minor="4006"' in dry.text and "40.06 CNY" in dry.text
        assert 'data-currency="JPY" data-count="1" data-amount-minor="5"' in dry.text
        assert 'data-test="dry-run-needs-approval"' not in dry.text and 'data-test="confirm-submit"' in dry.text
        assert all(state is State.DEAD for state in [v.state for v in (await pages.api.queue.get_many(
            [int(i.split("-")[1]) for i in ids], with_history=False)).value])  # fmt: skip
        no_reason = await pages.post(R, "/review/redrive", {"scope": "filter", "error_class": "insufficient_funds"})
        assert no_reason.status_code == 422 and 'data-kind="error"' in no_reason.text
        started = await pages.post(R, "/review/redrive", {"scope": "filter", "error_class": "insufficient_funds",
                                                          "reason": "bank is back", "rate_per_s": "1000"})  # fmt: skip
        assert started.status_code == 303, started.text
        job_path = started.headers["location"].split("?")[0]
        job_id = int(job_path.rsplit("/", 1)[1])
        page = await pages.get(R, started.headers["location"])
        assert 'data-kind="success"' in page.text and figure(page.text, "job-total") == "5"
        assert f'hx-get="/review/jobs/{job_id}/progress"' in page.text
        await drive(pages, job_id)
        done = await pages.get(V, job_path)
        assert figure(done.text, "job-state") == "done" and figure(done.text, "job-redriven") == "5"
        assert sorted(re.findall(r'data-test="job-item" data-id="([0-9-]+)" data-result="redriven"', done.text)) == sorted(ids)
        assert 'data-test="job-pause"' not in done.text and 'hx-trigger="every 2s"' not in done.text
        listed = await pages.get(V, "/review/jobs")
        assert marked_ids(listed.text, "job-row") == [str(job_id)]


async def test_cancel_halfway_leaves_the_rest_dead_and_listed(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        ids = await dead(pages.api, *(list_update(f"c{n}") for n in range(5)))
        started = await pages.post(R, "/review/redrive", {"scope": "selection", "ids": ids, "reason": "slowly",
                                                          "rate_per_s": "1000"})  # fmt: skip
        job_path = started.headers["location"].split("?")[0]
        job_id = int(job_path.rsplit("/", 1)[1])
        await drive(pages, job_id, redriven=2)
        viewer = await pages.post(V, f"{job_path}/cancel", {"reason": "no"})
        assert viewer.status_code == 403
        no_reason = await pages.post(R, f"{job_path}/cancel", {"reason": ""})
        assert no_reason.status_code == 422
        cancelled = await pages.post(R, f"{job_path}/cancel", {"reason": "enough for today"})
        assert cancelled.status_code == 200 and 'data-kind="success"' in cancelled.text
        assert figure(cancelled.text, "job-state") == "cancelled" and figure(cancelled.text, "job-not-redriven") == "3"
        rest = await pages.get(R, f"{job_path}?result=not_redriven")
        listed = re.findall(r'data-test="job-item" data-id="([0-9-]+)" data-result="not_redriven"', rest.text)
        views = (await pages.api.queue.get_many([int(i.split("-")[1]) for i in ids], with_history=False)).value
        still_dead = sorted(f"1-{v.message_id}" for v in views if v.state is State.DEAD)
        assert sorted(listed) == still_dead and len(still_dead) == 3
        again = await pages.post(R, f"{job_path}/resume", {"reason": "oops"})
        assert again.status_code == 409 and 'data-kind="error"' in again.text


async def test_a_bulk_job_is_proposed_and_the_approval_starts_it(store: StoreThread) -> None:
    async with running_pages(store, review__bulk_count_max="2") as pages:
        ids = await dead(pages.api, *(list_update(f"b{n}") for n in range(3)))
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "selection", "ids": ids})
        assert "more than 2" in figure(dry.text, "dry-run-needs-approval")
        proposed = await pages.post(R, "/review/redrive", {"scope": "selection", "ids": ids, "reason": "all three"})
        assert proposed.status_code == 200 and 'data-kind="proposed"' in proposed.text
        assert 'data-kind="success"' not in proposed.text
        assert 'data-test="empty-state"' in (await pages.get(R, "/review/jobs")).text
        inbox = await pages.get(A, "/review/approvals")
        (proposal_id,) = marked_ids(inbox.text, "proposal")
        assert 'data-action="redrive_job"' in inbox.text
        approved = await pages.post(A, f"/review/approvals/{proposal_id}/approve")
        assert approved.status_code == 200 and "job" in approved.text and 'data-kind="success"' in approved.text
        (job,) = (await pages.api.queue.jobs()).value
        assert (job.total, job.approved_by, job.proposal_id) == (3, "approver", int(proposal_id))
