"""The audit page as a finance reviewer uses it: sign-ins left out unless asked for, filters in the
store (who, what, on what, when) with the paging links keeping them, bad values named at their
field, an edit read as field changes, masked for a viewer, and each entry linked to what it is
about; and the request page's timeline with the audit entries of its ref key, each once."""

from __future__ import annotations

import json
import re

import pytest
from api_support import dead_letters as dead
from pages_support import marked_ids, running_pages, transfer

from api.web import pages_audit
from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER
ENTRY = re.compile(r'data-test="audit-entry" data-seq="(\d+)" data-action="([a-z_]+)" data-actor="([a-z-]+)"')


def entries(html: str) -> list[tuple[int, str, str]]:
    return [(int(seq), action, actor) for seq, action, actor in ENTRY.findall(html)]


async def test_the_audit_page_filters_in_the_store_and_hides_sign_ins_unless_asked(
    store: StoreThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("au", 5000))
        proposed = await pages.post(R, f"/review/requests/{request_id}/redrive", {"reason": "bank is back"})
        assert 'data-kind="proposed"' in proposed.text
        (proposal_id,) = marked_ids((await pages.get(A, "/review/approvals")).text, "proposal")
        await pages.post(A, f"/review/approvals/{proposal_id}/approve", {"reason": "checked"})

        default = await pages.get(V, "/review/audit")
        assert default.status_code == 200 and 'data-test="sign-ins-hidden"' in default.text
        shown = {action for _, action, _ in entries(default.text)}
        assert {"redriven", "approve", "propose", "document_put"} <= shown  # users added by the fixture stay
        assert "document:sessions/" not in default.text and "document:logins/" not in default.text
        with_sign_ins = await pages.get(V, "/review/audit?sign_ins=1")
        assert "document:logins/viewer" in with_sign_ins.text and 'data-test="sign-ins-hidden"' not in with_sign_ins.text
        logins = entries((await pages.get(V, "/review/audit?action=sign-ins")).text)
        assert len(logins) == 4 and {a for _, a, _ in logins} == {"document_put"}  # one per login, not its session too

        assert [(a, who) for _, a, who in entries((await pages.get(V, "/review/audit?actor=approver")).text)] == [
            ("approve", "approver")]  # fmt: skip
        review_group = entries((await pages.get(V, "/review/audit?action=group%3AReview")).text)
        assert [a for _, a, _ in review_group] == ["redriven", "approve", "propose"]
        about_request = await pages.get(V, f"/review/audit?target={request_id}")
        assert [a for _, a, _ in entries(about_request.text)] == ["redriven", "approve", "propose"]
        assert f'href="/review/requests/{request_id}"' in about_request.text
        assert f'href="/review/approvals?all=1&amp;before={int(proposal_id) + 1}#proposal-{proposal_id}"' in about_request.text
        on_proposal = entries((await pages.get(V, f"/review/audit?target=proposal:{proposal_id}")).text)
        assert [a for _, a, _ in on_proposal] == ["approve", "propose"]
        users = entries((await pages.get(V, "/review/audit?target=document:users/")).text)
        assert len(users) == 4 and {who for _, _, who in users} == {"tests"}
        assert entries((await pages.get(V, "/review/audit?since=2999-01-01")).text) == []
        assert len(entries((await pages.get(V, "/review/audit?until=2999-01-01&sign_ins=1")).text)) == len(
            entries(with_sign_ins.text))  # fmt: skip

        monkeypatch.setattr(pages_audit, "PAGE_SIZE", 2)
        first = await pages.get(V, "/review/audit?actor=tests")
        older = re.search(r'href="/review/audit\?([^"]+)" data-test="older-page"', first.text)
        assert older and "actor=tests" in older.group(1), first.text
        second = await pages.get(V, "/review/audit?" + older.group(1).replace("&amp;", "&"))
        seqs = [seq for seq, _, _ in entries(first.text) + entries(second.text)]
        assert len(seqs) == 4 and seqs == sorted(seqs, reverse=True)  # full pages of the filtered chain, in order
        assert {who for _, _, who in entries(second.text)} == {"tests"}

        for query, field in (("since=yesterday", "since"), ("since=2026-01-02&until=2026-01-01", "until"),
                             ("target=999-1", "target"), ("action=Drop+Table", "action"),
                             ("action=sign-ins&target=proposal:1", "action")):  # fmt: skip
            refused = await pages.get(V, f"/review/audit?{query}")
            assert refused.status_code == 422 and f'data-field="{field}"' in refused.text, (query, refused.text[-2000:])


async def test_an_edit_reads_as_field_changes_masked_for_a_viewer_and_once_on_the_request_page(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        body = transfer("ed", 1250, payer="acct-6222020012345678")
        (request_id,) = await dead(pages.api, body)
        path = f"/review/requests/{request_id}/edit"
        edited = json.dumps({**body["payload"], "payer": "acct-6222020099990000", "amount_minor": 1300})
        preview = await pages.post(R, path, {"payload": edited, "reason": "backup escrow", "step": "preview"})
        previewed = re.search(r'name="previewed" value="([0-9a-f]+)"', preview.text)
        assert previewed
        await pages.post(R, path, {"payload": edited, "reason": "backup escrow", "step": "submit",
                                   "previewed": previewed.group(1)})  # fmt: skip
        (proposal_id,) = marked_ids((await pages.get(A, "/review/approvals")).text, "proposal")
        approved = await pages.post(A, f"/review/approvals/{proposal_id}/approve", {"reason": "checked"})
        assert 'data-kind="success"' in approved.text

        page = (await pages.get(R, "/review/audit?action=edit_redrive")).text
        assert [a for _, a, _ in entries(page)] == ["edit_redrive"]
        changed = set(re.findall(r'data-test="audit-change" data-field="([a-z_.]+)"', page))
        assert {"payload.payer", "payload.amount", "state", "superseded_by"} <= changed
        assert not {"payload.currency", "payload.amount_minor"} & changed  # the amount as money, once
        assert re.search(r'data-field="payload.amount">.*?12.50 CNY.*?→.*?13.00 CNY', page, re.S)
        assert re.search(r'data-field="payload.payer">.*?acct-6222020012345678.*?→.*?acct-6222020099990000', page, re.S)
        assert 'data-test="audit-raw"' in page and "\\&#34;" not in page.split('data-test="audit-raw"')[0]

        masked = (await pages.get(V, "/review/audit?action=edit_redrive")).text
        assert "acct-6222020012345678" not in masked and "acct-6222020099990000" not in masked
        assert re.search(r'data-field="payload.payer">.*?\*\*\*\*5678.*?→.*?\*\*\*\*0000', masked, re.S)

        detail = await pages.get(R, f"/review/requests/{request_id}")
        actions = re.findall(r'data-test="audit-entry" data-action="([a-z_]+)" data-type="audit"', detail.text)
        assert actions == ["propose", "approve", "edit_redrive"]  # each once, in the timeline
        assert 'data-type="discarded"' not in detail.text  # the superseded original's event: the edit's entry says it
        assert 'data-test="audit-change" data-field="payload.payer"' in detail.text
        viewer_detail = (await pages.get(V, f"/review/requests/{request_id}")).text
        assert "acct-6222020099990000" not in viewer_detail and "****0000" in viewer_detail
