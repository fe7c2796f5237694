"""The review with several sets (docs/review.md, "Several sets"): the dead-letter list, its totals
and `GET /v1/review/dead-letters` span every set, merged oldest first and paged with a position
per set; a set that does not answer is a 503 naming it (or a partial answer when asked, a banner on
the page) while /readyz stays ready naming it; a request of set 3 is shown, redriven, discarded, edited and proposed from the review,
its proposal listed as `3-n` and approved in set 3; a redrive spanning sets is done in each set; the
audit chain is every set's, merged by time and paged with a position per set, and `compensator audit
verify` verifies each set's chain. The
control set and three sets are one-node stores in this process."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pages_support import list_update, marked_ids, running_pages, transfer
from sets_support import client, dead_in_sets, set_stores, write_table

from compensator.cli import main
from queues import Role, State
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    with set_stores(tmp_path) as started:
        yield started


def _key(request_id: str) -> tuple[int, int]:
    set_id, message = request_id.split("-")
    return int(set_id), int(message)


async def test_the_dead_letter_list_and_totals_span_every_set_and_page_across_them(
    stores: dict[int, StoreThread],
) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides) as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"m{n}", 100 + n) for n in range(14)))
        assert {_key(i)[0] for i in ids} == {1, 2, 3}, ids  # the keys are spread over every set
        headers = pages.api.auth(Role.OPERATOR)
        seen: list[dict[str, object]] = []
        cursor = None
        for _ in range(10):
            query = {"limit": "4", **({"cursor": cursor} if cursor else {})}
            answer = await pages.api.client.get("/v1/review/dead-letters", params=query, headers=headers)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["partial"] is False and body["unanswered_sets"] == []
            seen.extend(body["items"])
            cursor = body["next_cursor"]
            if cursor is None:
                break
        listed = [str(item["id"]) for item in seen]
        assert sorted(listed) == sorted(ids)  # every row once, none missing, none twice
        assert listed == [str(i["id"]) for i in sorted(seen, key=lambda i: (str(i["dead_at"]), *_key(str(i["id"]))))]
        for bad in ("1.1", "9:1.1", "1:1.1,1:2.2", "x"):
            refused = await pages.api.client.get("/v1/review/dead-letters", params={"cursor": bad}, headers=headers)
            assert refused.status_code == 422, (bad, refused.text)

        page = await pages.get(V, "/review/dead-letters")
        assert sorted(marked_ids(page.text, "dead-letter-row")) == sorted(ids)
        assert 'data-test="summary-count">14<' in page.text
        total = sum(100 + n for n in range(14))
        assert f'data-currency="CNY" data-count="14" data-amount-minor="{total}"' in page.text
        oldest = re.search(r'data-test="summary-oldest"><a href="/review/requests/([0-9-]+)"', page.text)
        assert oldest and oldest.group(1) == listed[0]
        paged = await pages.get(V, "/review/dead-letters?cursor=" + "1:1.1,7:1.1")
        assert paged.status_code == 422 and 'data-field="cursor"' in paged.text
        export = await pages.get(Role.ADMIN, "/review/dead-letters.csv")
        assert sorted(line.split(",")[0] for line in export.text.splitlines()[1:]) == sorted(ids)

        ready = (await pages.api.client.get("/readyz")).json()
        assert ready["status"] == "ready" and ready["checks"]["sets_down"] == [] and sorted(ready["checks"]["sets"]) == ["1", "2", "3"]
        stores[3].stop_node()
        try:
            await asyncio.sleep(1.1)  # readiness is probed at most once a second
            still = await pages.api.client.get("/readyz")  # a set down stops its keys only, not the API
            assert still.status_code == 200 and still.json()["checks"]["sets_down"] == [3], still.text
            down = await pages.api.client.get("/v1/review/dead-letters", headers=headers)
            assert down.status_code == 503 and down.headers["retry-after"]
            assert down.json()["unanswered_sets"] == [3]
            partial = await pages.api.client.get("/v1/review/dead-letters?partial=true", headers=headers)
            assert partial.status_code == 200 and partial.json()["partial"] is True
            assert partial.json()["unanswered_sets"] == [3]
            assert sorted(i["id"] for i in partial.json()["items"]) == sorted(i for i in ids if i.startswith(("1-", "2-")))
            banner = await pages.get(V, "/review/dead-letters")
            assert banner.status_code == 200 and "Set 3 did not answer" in banner.text
            assert all(not i.startswith("3-") for i in marked_ids(banner.text, "dead-letter-row"))
        finally:
            stores[3].start_node()


async def test_a_set_3_request_is_shown_redriven_discarded_edited_and_proposed_from_the_review(
    stores: dict[int, StoreThread],
) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides) as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"a{n}") for n in range(12)),
                                 *(transfer(f"t{n}", 5000) for n in range(8)))  # fmt: skip
        in_3 = [i for i in ids[:12] if i.startswith("3-")]
        money_3 = next(i for i in ids[12:] if i.startswith("3-"))
        assert len(in_3) >= 3, ids
        set_3 = client(stores[3])
        try:
            detail = await pages.get(R, f"/review/requests/{in_3[0]}")
            assert detail.status_code == 200 and in_3[0] in detail.text
            redriven = await pages.post(R, f"/review/requests/{in_3[0]}/redrive", {"reason": "bank is back"})
            assert redriven.status_code == 200 and 'data-kind="success"' in redriven.text, redriven.text
            assert (await set_3.get(_key(in_3[0])[1])).value.state is State.READY

            discarded = await pages.post(R, f"/review/requests/{in_3[1]}/discard",
                                         {"reason_code": "duplicate", "comment": "paid twice, ticket 9"})  # fmt: skip
            assert discarded.status_code == 200 and 'data-kind="success"' in discarded.text
            assert (await set_3.get(_key(in_3[1])[1])).value.state is State.DISCARDED

            payload = {**list_update("a")["payload"], "receiver": "user-700043"}
            edited = await pages.api.client.post(f"/v1/review/requests/{in_3[2]}/edit", headers=pages.api.auth(R),
                                                 json={"payload": payload, "reason": "receiver typo"})  # fmt: skip
            assert edited.status_code == 200, edited.text
            assert edited.json()["new_id"].startswith("3-")

            proposed = await pages.post(R, f"/review/requests/{money_3}/redrive", {"reason": "bank is back"})
            assert 'data-kind="proposed"' in proposed.text
            listed = await pages.api.client.get("/v1/review/proposals?pending=true", headers=pages.api.auth(A))
            ((document),) = listed.json()
            assert document["set"] == 3 and document["targets"] == [money_3]
            inbox = await pages.get(A, "/review/approvals")
            label = f"3-{document['id']}"
            assert marked_ids(inbox.text, "proposal") == [label]
            assert f'action="/review/approvals/{document["id"]}/approve?set=3"' in inbox.text
            approved = await pages.post(A, f"/review/approvals/{document['id']}/approve?set=3", {"reason": "checked"})
            assert approved.status_code == 200 and f"Approved proposal {label}" in approved.text, approved.text
            assert (await set_3.get(_key(money_3)[1])).value.state is State.READY
        finally:
            await set_3.raft.close()

        other = next(i for i in ids[:12] if not i.startswith("3-") and i not in in_3)
        spanning = await pages.api.client.post("/v1/review/redrive", headers=pages.api.auth(R),
                                               json={"ids": [in_3[0], other], "reason": "both"})  # fmt: skip
        assert spanning.status_code == 200, spanning.text  # each set's part in its set (tests/api/test_redrive_sets.py)
        assert spanning.json()["redriven"] == [other] and spanning.json()["refused"] == [
            {"id": in_3[0], "reason": "illegal_state"}]  # redriven above already: not twice
        assert (await pages.get(R, "/review/requests/7-1")).status_code == 404

        operator = pages.api.auth(Role.OPERATOR)
        about = await pages.api.client.get(f"/v1/audit?target={in_3[0]}", headers=operator)
        assert about.status_code == 200, about.text
        assert {e["set"] for e in about.json()["entries"]} == {3} and list(about.json()["heads"]) == ["3"]
        assert [e["action"] for e in about.json()["entries"]] == ["redriven"]
        whole: list[dict[str, object]] = []
        cursor = None
        for _ in range(40):
            answer = await pages.api.client.get("/v1/audit", headers=operator,
                                                params={"limit": "3", **({"cursor": cursor} if cursor else {})})  # fmt: skip
            assert answer.status_code == 200, answer.text
            whole.extend(answer.json()["entries"])
            cursor = answer.json()["next_cursor"]
            if cursor is None:
                break
        assert sorted(answer.json()["heads"]) == ["0", "1", "2", "3"]  # the control set's chain too
        assert len(whole) == answer.json()["count"] == len({(e["set"], e["seq"]) for e in whole})
        assert [e["at"] for e in whole] == sorted((e["at"] for e in whole), reverse=True)  # newest first over the sets
        assert {"redriven", "discarded", "edit_redrive", "propose", "approve"} <= {e["action"] for e in whole if e["set"] == 3}
        # The tokens and the review users live in the control set: their writes are in its chain.
        control = [e for e in whole if e["set"] == 0]
        assert {"token_put", "document_put"} <= {e["action"] for e in control}
        assert any(str(e["target"]).startswith("document:users/") for e in control)
        assert (await pages.api.client.get("/v1/audit?before=5", headers=operator)).status_code == 422
        page = await pages.get(V, "/review/audit?action=discarded")
        assert re.findall(r'data-test="audit-entry" data-seq="\d+" data-action="discarded" [^>]*data-set="(\d)"', page.text) == ["3"]
        assert len(re.findall(r'data-test="audit-set-head"', page.text)) == 4
        assert 'data-set="0">control set <code>' in page.text
        stores[2].stop_node()
        try:
            down = await pages.api.client.get("/v1/audit", headers=operator)
            assert down.status_code == 503 and down.json()["unanswered_sets"] == [2]
        finally:
            stores[2].start_node()


async def test_a_redrive_job_of_set_3_runs_there_and_is_listed_with_its_set(stores: dict[int, StoreThread]) -> None:
    overrides = await write_table(stores)
    async with running_pages(stores[1], **overrides) as pages:
        ids = await dead_in_sets(pages.api, stores, *(list_update(f"j{n}") for n in range(12)), prefix="j")
        in_3 = [i for i in ids if i.startswith("3-")]
        other = next(i for i in ids if not i.startswith("3-"))
        narrowed = await pages.get(R, "/review/dead-letters?set=3")
        assert sorted(marked_ids(narrowed.text, "dead-letter-row")) == sorted(in_3)
        assert f'data-test="summary-count">{len(in_3)}<' in narrowed.text and 'data-test="filter-set"' in narrowed.text
        assert (await pages.get(R, "/review/dead-letters?set=x")).status_code == 422
        api_3 = await pages.api.client.get("/v1/review/dead-letters?set=3", headers=pages.api.auth(V))
        assert sorted(i["id"] for i in api_3.json()["items"]) == sorted(in_3)
        whole = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter", "kind": "list_update"})
        assert whole.status_code == 200 and len(re.findall(r'data-test="dry-run-set" ', whole.text)) == 3  # a job group
        by_set = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter", "kind": "list_update", "set": "3"})
        assert by_set.status_code == 200 and f'data-test="dry-run-count">{len(in_3)}<' in by_set.text, by_set.text
        assert 'type="hidden" name="set" value="3"' in by_set.text
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "selection", "ids": in_3})
        assert dry.status_code == 200 and 'data-test="confirm-submit"' in dry.text, dry.text
        spanning = await pages.post(R, "/review/redrive/dry-run", {"scope": "selection", "ids": [in_3[0], other]})
        assert spanning.status_code == 200 and 'data-test="dry-run-count">2<' in spanning.text
        started = await pages.post(R, "/review/redrive", {"scope": "selection", "ids": in_3, "reason": "bank is back",
                                                          "rate_per_s": "1000"})  # fmt: skip
        assert started.status_code == 303 and started.headers["location"].endswith("&set=3"), started.text
        job_id = int(started.headers["location"].split("?")[0].rsplit("/", 1)[1])
        page = await pages.get(R, started.headers["location"])
        assert f'data-test="job-id">3-{job_id}<' in page.text and f"Job 3-{job_id} started" in page.text
        assert f'hx-get="/review/jobs/{job_id}/progress?set=3"' in page.text
        assert sorted(re.findall(r'data-test="job-item" data-id="([0-9-]+)"', page.text)) == sorted(in_3)
        cancelled = await pages.post(R, f"/review/jobs/{job_id}/cancel?set=3", {"reason": "wrong batch"})
        assert cancelled.status_code == 200 and f"Job 3-{job_id} is cancelled" in cancelled.text, cancelled.text
        listed = await pages.get(V, "/review/jobs")
        assert marked_ids(listed.text, "job-row") == [f"3-{job_id}"]
        assert f'href="/review/jobs/{job_id}?set=3"' in listed.text

        body = {"ids": [other], "reason": "one more", "rate_per_s": 1000}
        answer = await pages.api.client.post("/v1/review/jobs", json=body, headers=pages.api.auth(R))
        assert answer.status_code == 201, answer.text
        set_id = int(other.split("-")[0])
        assert answer.json()["set"] == set_id and answer.headers["location"].endswith(f"?set={set_id}")
        jobs = (await pages.api.client.get("/v1/review/jobs", headers=pages.api.auth(V))).json()
        assert [(j["set"], j["state"]) for j in jobs] == [(set_id, "running"), (3, "cancelled")]
        one = await pages.api.client.get(answer.headers["location"], headers=pages.api.auth(V))
        assert one.status_code == 200 and one.json()["total"] == 1
        spanning_job = await pages.api.client.post("/v1/review/jobs", headers=pages.api.auth(R),
                                                   json={**body, "ids": [in_3[0], other]})  # fmt: skip
        assert spanning_job.status_code == 201 and len(spanning_job.json()["sets"]) == 2  # a group: one part per set


def test_audit_verify_checks_every_sets_chain_and_names_a_set_that_does_not_answer(
    stores: dict[int, StoreThread], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    async def prepare() -> None:
        await write_table(stores)
        for set_id in (1, 2, 3):
            queue = client(stores[set_id])
            try:
                await queue.put_document("notes", f"n{set_id}", b"{}", actor="alice", reason="audited")
            finally:
                await queue.raft.close()

    asyncio.run(prepare())
    for name, value in {"ADDRESSES": stores[1].addresses, "CONTROL_ADDRESSES": stores[0].addresses,
                        "SECRET_FILE": str(stores[1].secret_file), "DEADLINE_S": "1",
                        "ATTEMPT_TIMEOUT_S": "0.5"}.items():  # fmt: skip
        monkeypatch.setenv(f"COMPENSATOR_STORE__{name}", value)
    assert main(["audit", "verify"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # The control set's chain first: the set table's write (a document) is its entry.
    assert [(line["source"].split(":")[0], line["entries"], line["verified"]) for line in lines] == [
        ("control set", 1, True), ("set 1", 1, True), ("set 2", 1, True), ("set 3", 1, True)]
    stores[2].stop_node()
    assert main(["audit", "verify"]) == 1
    out, err = capsys.readouterr()
    assert [json.loads(line)["source"].split(":")[0] for line in out.splitlines()] == ["control set", "set 1", "set 3"]
    assert "set 2: " in err and "did not answer" in err
