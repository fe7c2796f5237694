"""The review pages' job over several sets' dead letters (docs/review.md, "Job groups"): the dry run
shows the whole and each set's part and its confirmation carries the group (confirming twice
creates each part once); the group's page shows the summed counters and cancels every part; under
four eyes the approvals inbox sends each part to its group's page, where one approval approves
every set's part. The control set and three sets are one-node stores in this process."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pages_support import list_update, login, running_pages
from sets_support import dead_in_sets, set_stores, write_table

from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    with set_stores(tmp_path) as started:
        yield started


def hidden(html: str, name: str) -> str:
    found = re.search(rf'type="hidden" name="{name}" value="([^"]*)"', html)
    assert found is not None, name
    return found.group(1)


async def test_a_redrive_over_every_set_runs_as_one_group_from_the_pages(stores: dict[int, StoreThread]) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides, review__bulk_count_max="100") as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"q{n}", 100 + n) for n in range(9)), prefix="q")
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter", "kind": "list_update"})
        assert dry.status_code == 200, dry.text
        assert 'data-test="dry-run-count">9<' in dry.text
        per_set = dict(re.findall(r'data-test="dry-run-set" data-set="(\d)" data-count="(\d+)"', dry.text))
        assert sorted(per_set) == ["1", "2", "3"] and sum(map(int, per_set.values())) == 9
        group = hidden(dry.text, "group")
        confirm = {"scope": "filter", "kind": "list_update", "reason": "bank is back", "rate_per_s": "1", "group": group}
        started = await pages.post(R, "/review/redrive", confirm)
        assert started.status_code == 303 and started.headers["location"] == f"/review/job-groups/{group}", started.text
        twice = await pages.post(R, "/review/redrive", confirm)  # a second press: the same parts
        assert twice.status_code == 303
        jobs = (await pages.api.client.get("/v1/review/jobs", headers=pages.api.auth(V))).json()
        assert sorted(j["set"] for j in jobs) == [1, 2, 3]
        page = await pages.get(V, started.headers["location"])
        assert 'data-test="group-state">running<' in page.text and 'data-test="group-total">9<' in page.text
        assert len(re.findall(r'data-test="group-part" ', page.text)) == 3
        assert 'data-test="group-control-form"' not in page.text  # a viewer sees no controls
        cancelled = await pages.post(R, f"/review/job-groups/{group}/cancel", {"reason": "wrong batch"})
        assert cancelled.status_code == 200, cancelled.text
        assert 'data-test="group-state">cancelled<' in cancelled.text and 'data-test="group-not-redriven">9<' in cancelled.text
        assert len(ids) == 9


async def test_four_eyes_approve_a_group_once_from_its_page(stores: dict[int, StoreThread]) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides, review__bulk_count_max="4") as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"w{n}", 300 + n) for n in range(9)), prefix="w")
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "selection", "ids": ids})
        assert 'data-test="dry-run-needs-approval"' in dry.text
        group = hidden(dry.text, "group")
        proposed = await pages.post(R, "/review/redrive", {"scope": "selection", "ids": ids, "reason": "funds back",
                                                           "group": group})  # fmt: skip
        assert proposed.status_code == 303
        inbox = await pages.get(A, "/review/approvals")
        links = re.findall(r'data-test="proposal-group-link" href="/review/job-groups/([0-9a-f]+)"', inbox.text)
        assert links == [group] * 3 and 'data-test="approve-form"' not in inbox.text  # never a part alone
        page = await pages.get(A, f"/review/job-groups/{group}")
        assert 'data-test="group-state">proposed<' in page.text and 'data-test="group-proposed-count">9<' in page.text
        totals = re.findall(r'data-test="group-pays-total" data-currency="CNY" data-count="9" data-amount-minor="(\d+)"', page.text)
        assert totals == [str(sum(300 + n for n in range(9)))]
        own = await pages.get(R, f"/review/job-groups/{group}")
        assert 'data-test="group-approve-form"' not in own.text and 'data-test="group-withdraw-form"' in own.text
        approved = await pages.post(A, f"/review/job-groups/{group}/approve", {"reason": "checked"})
        assert approved.status_code == 200, approved.text
        assert 'data-test="group-state">running<' in approved.text and 'data-test="group-total">9<' in approved.text
        assert 'data-test="group-approve-form"' not in approved.text


async def test_a_part_that_expired_while_its_set_was_down_is_proposed_again_from_the_groups_page(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides, review__bulk_count_max="4") as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"e{n}", 400 + n) for n in range(9)), prefix="e")
        proposed = await pages.api.client.post("/v1/review/jobs", json={"ids": ids, "reason": "funds back"},
                                               headers=pages.api.auth(R))  # fmt: skip
        group = proposed.json()["group"]["group"]
        stores[2].stop_node()
        try:
            half = await pages.post(A, f"/review/job-groups/{group}/approve", {"reason": "checked"})
            assert half.status_code == 503 and "set 2 did not answer" in half.text
            real = time.time_ns
            monkeypatch.setattr(time, "time_ns", lambda: real() + 2 * 86_400 * 10**9)  # past the part's expiry
        finally:
            stores[2].start_node()
        for role in (V, R, A):  # two days on: their sessions ended, they sign in again
            await pages.browsers[role].aclose()
            pages.browsers[role], pages.csrf[role] = await login(pages.api, role.value)
        page = await pages.get(R, f"/review/job-groups/{group}")
        assert 'data-test="group-repropose-form"' in page.text and "Propose set 2's part again" in page.text
        assert 'data-test="group-repropose-form"' not in (await pages.get(V, f"/review/job-groups/{group}")).text
        again = await pages.post(R, f"/review/job-groups/{group}/repropose", {"reason": "set 2 was down"})
        assert again.status_code == 200 and 'data-kind="success"' in again.text, again.text
        assert 'data-test="group-state">proposed<' in again.text and 'data-test="group-repropose-form"' not in again.text
        approved = await pages.post(A, f"/review/job-groups/{group}/approve", {"reason": "checked"})
        assert approved.status_code == 200 and 'data-test="group-state">running<' in approved.text, approved.text
