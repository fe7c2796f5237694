"""The request page and its actions (redrive one, edit and redrive, discard), the approvals inbox and
the audit page, over HTTP against the real store."""

from __future__ import annotations

import json
import re

from api_support import dead_letters as dead
from pages_support import list_update, marked_ids, running_pages, transfer

from queues import Role, State
from raft_store.testing.inprocess import StoreThread

V, R, A, ADMIN = Role.VIEWER, Role.REVIEWER, Role.APPROVER, Role.ADMIN


def payload_of(html: str) -> dict[str, object]:
    found = re.search(r'<pre data-test="payload">(.*?)</pre>', html, flags=re.S)
    assert found, html[:300]
    return dict(json.loads(found.group(1).replace("&#34;", '"').replace("&quot;", '"')))


async def test_the_detail_page_shows_payload_attempts_timeline_and_audit(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("d1", 1234, memo="call Ann"))
        page = await pages.get(R, f"/review/requests/{request_id}")
        assert page.status_code == 200
        assert payload_of(page.text)["payee"] == "user-4200042" and "12.34 CNY" in page.text
        assert 'data-test="attempt-row" data-attempt="1"' in page.text
        assert "HTTP 402 from payment: balance too low" in page.text
        assert set(re.findall(r'data-test="timeline-entry" data-type="([a-z_]+)"', page.text)) >= {
            "intake", "attempt_started", "attempt_failed", "dead_lettered"}  # fmt: skip
        viewer = await pages.get(V, f"/review/requests/{request_id}")
        masked = payload_of(viewer.text)
        assert masked["payee"] == "****0042" and masked["memo"] == "****" and masked["amount_minor"] == 1234
        assert "user-4200042" not in viewer.text and "call Ann" not in viewer.text
        assert 'data-test="discard-form"' not in viewer.text and 'data-test="redrive-form"' not in viewer.text
        assert (await pages.get(R, "/review/requests/1-999999")).status_code == 404


async def test_edit_is_refused_naming_the_field_then_diffed_then_a_new_version(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, list_update("e1", 100))
        path = f"/review/requests/{request_id}/edit"
        form = await pages.get(R, path)
        assert form.status_code == 200 and 'data-test="edit-payload"' in form.text
        good = {**list_update("e1")["payload"], "amount_minor": 120}
        bad = await pages.post(R, path, {"payload": json.dumps({**good, "amount_minor": -1}), "reason": "typo", "step": "preview"})
        assert bad.status_code == 422 and 'data-field="payload.amount_minor"' in bad.text
        assert 'data-test="edit-submit"' not in bad.text
        not_json = await pages.post(R, path, {"payload": "{", "reason": "typo", "step": "preview"})
        assert not_json.status_code == 422 and 'data-field="payload"' in not_json.text
        preview = await pages.post(R, path, {"payload": json.dumps(good), "reason": "typo", "step": "preview"})
        assert 'data-test="edit-submit"' in preview.text
        assert re.search(r'data-test="diff-row" data-field="amount">.*?1.00 CNY.*?1.20 CNY', preview.text, re.S)
        assert re.search(r'data-test="edit-pays" data-currency="CNY" data-amount-minor="120">1.20 CNY<', preview.text)
        assert 'data-test="edit-pays-before" data-currency="CNY" data-amount-minor="100">1.00 CNY<' in preview.text
        previewed = re.search(r'name="previewed" value="([0-9a-f]+)"', preview.text)
        assert previewed
        unseen = await pages.post(R, path, {"payload": json.dumps({**good, "amount_minor": 130}), "reason": "typo",
                                            "step": "submit", "previewed": previewed.group(1)})  # fmt: skip
        assert 'data-kind="info"' in unseen.text  # changed after its diff: shown again, not stored
        assert (await pages.api.queue.get(int(request_id.split("-")[1]))).value.state is State.DEAD
        done = await pages.post(R, path, {"payload": json.dumps(good), "reason": "amount typo", "step": "submit",
                                          "previewed": previewed.group(1)})  # fmt: skip
        assert done.status_code == 200 and 'data-kind="success"' in done.text, done.text
        new_id = re.search(r'data-test="new-version-link" href="/review/requests/([0-9-]+)"', done.text)
        assert new_id
        new = await pages.get(R, f"/review/requests/{new_id.group(1)}")
        assert payload_of(new.text)["amount_minor"] == 120 and 'data-test="request-state">ready<' in new.text
        assert marked_ids(new.text, "version-row") == [request_id, new_id.group(1)]
        assert 'data-test="audit-entry" data-action="edit_redrive"' in new.text


async def test_discard_needs_a_code_and_a_comment(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, list_update("x1"))
        path = f"/review/requests/{request_id}/discard"
        no_comment = await pages.post(R, path, {"reason_code": "duplicate", "comment": " "})
        assert no_comment.status_code == 422 and 'data-field="comment"' in no_comment.text
        no_code = await pages.post(R, path, {"reason_code": "", "comment": "paid twice"})
        assert no_code.status_code == 422 and 'data-field="reason_code"' in no_code.text
        assert (await pages.api.queue.get(int(request_id.split("-")[1]))).value.state is State.DEAD
        done = await pages.post(R, path, {"reason_code": "duplicate", "comment": "paid twice, ticket 7"})
        assert done.status_code == 200 and 'data-kind="success"' in done.text
        assert (await pages.api.queue.get(int(request_id.split("-")[1]))).value.state is State.DISCARDED
        page = (await pages.get(R, f"/review/requests/{request_id}")).text
        dead_fact = re.search(r'data-test="request-dead">(.*?)</dd>', page, re.S)
        assert dead_fact and "discarded " in dead_fact.group(1) and "paid twice, ticket 7" in dead_fact.group(1), page


async def test_a_money_moving_redrive_is_proposed_and_approved_by_another_person(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("m1", 5000))
        proposed = await pages.post(R, f"/review/requests/{request_id}/redrive", {"reason": "bank is back"})
        assert proposed.status_code == 200 and 'data-kind="proposed"' in proposed.text
        assert 'data-kind="success"' not in proposed.text
        inbox = await pages.get(R, "/review/approvals")
        (proposal_id,) = marked_ids(inbox.text, "proposal")
        assert 'data-test="withdraw-submit"' in inbox.text and 'data-test="approve-submit"' not in inbox.text
        assert 'data-currency="CNY" data-amount-minor="5000"' in inbox.text
        own = await pages.post(ADMIN, f"/review/requests/{request_id}/redrive", {"reason": "mine"})
        assert 'data-kind="proposed"' in own.text
        admin_inbox = await pages.get(ADMIN, "/review/approvals")
        own_id = max(marked_ids(admin_inbox.text, "proposal"), key=int)
        refused = await pages.post(ADMIN, f"/review/approvals/{own_id}/approve")
        assert refused.status_code == 403 and 'data-kind="error"' in refused.text
        no_reason = await pages.post(A, f"/review/approvals/{own_id}/reject", {"reason": ""})
        assert no_reason.status_code == 422
        assert (await pages.post(A, f"/review/approvals/{own_id}/reject", {"reason": "duplicate"})).status_code == 200
        approved = await pages.post(A, f"/review/approvals/{proposal_id}/approve", {"reason": "checked"})
        assert approved.status_code == 200 and 'data-kind="success"' in approved.text, approved.text
        assert (await pages.api.queue.get(int(request_id.split("-")[1]))).value.state is State.READY
        audit = await pages.get(V, "/review/audit")
        actions = re.findall(r'data-test="audit-entry" data-seq="\d+" data-action="([a-z_]+)" data-actor="([a-z]+)"', audit.text)
        assert actions[:4] == [("redriven", "reviewer"), ("approve", "approver"), ("reject", "approver"), ("propose", "admin")]
        assert f'href="/review/requests/{request_id}"' in audit.text


async def test_a_proposer_withdraws_their_own_and_nobody_else_can(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("w1"))
        await pages.post(R, f"/review/requests/{request_id}/redrive", {"reason": "retry"})
        (proposal_id,) = marked_ids((await pages.get(R, "/review/approvals")).text, "proposal")
        other = await pages.post(A, f"/review/approvals/{proposal_id}/withdraw")
        assert other.status_code == 403
        withdrawn = await pages.post(R, f"/review/approvals/{proposal_id}/withdraw")
        assert withdrawn.status_code == 200 and f"Withdrew proposal {proposal_id}" in withdrawn.text
        assert 'data-test="empty-state"' in withdrawn.text
