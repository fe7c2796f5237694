"""The review pages as a finance reviewer reads them: filter fields empty (hints under them, never a
value-like placeholder), times in UTC and request ids instead of epoch milliseconds and store ids,
the request, proposal and job an audit entry is about separated, the dry run naming the filter it
acts on, and a button that makes a proposal saying so."""

from __future__ import annotations

import html
import re

from api_support import dead_letters as dead
from pages_support import list_update, marked_ids, running_pages, transfer

from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER
UTC_TIME = r"20[0-9]{2}-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-5][0-9](?:\.[0-9]{3})? UTC"
EPOCH_MS = re.compile(r"(?<![0-9a-f])1[0-9]{12}(?![0-9])")
"""Milliseconds since the epoch (2001 to 2286) as a page would print them raw."""


def visible(page: str) -> str:
    """The text a person sees: no tags, attributes or the folded stored JSON, entities decoded."""
    page = re.sub(r'<details class="raw".*?</details>', "", page, flags=re.S)
    page = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return re.sub(r" ([,.:;)])", r"\1", text)


def button(page: str, test_id: str) -> str:
    found = re.search(rf'<button[^>]*data-test="{test_id}"[^>]*>(.*?)</button>', page, re.S)
    assert found, page[-3000:]
    return found.group(1)


async def test_filter_fields_are_empty_with_hints_and_the_redrive_buttons_say_when_they_propose(
    store: StoreThread,
) -> None:
    async with running_pages(store) as pages:
        transfers = await dead(pages.api, transfer("wt", 500), transfer("wt", 700))
        updates = await dead(pages.api, list_update("wl", 100))
        listed = (await pages.get(R, "/review/dead-letters")).text
        assert "placeholder=" not in listed.split('data-test="filter-form"')[1].split("</form>")[0]
        assert re.search(r'data-test="filter-dead-from"><small class="hint">', listed)
        assert re.search(r'data-test="redrive-filter-dry-run" data-proposes="yes">Propose a redrive of all 3 matching',
                         listed)  # a transfer among all three, and this page shows them all  # fmt: skip
        assert 'data-proposes="maybe">Redrive selected…' in listed  # a list update alone is redriven at once
        only_transfers = (await pages.get(R, "/review/dead-letters?kind=transfer")).text
        assert button(only_transfers, "redrive-selected-dry-run").startswith("Propose a redrive of the selected")
        only_updates = (await pages.get(R, "/review/dead-letters?kind=list_update")).text
        assert button(only_updates, "redrive-selected-dry-run").startswith("Redrive selected")
        assert button(only_updates, "redrive-filter-dry-run").startswith("Redrive all 1 matching")
        assert "Four eyes apply to a redrive of more than 10 requests or of any transfer" in only_updates
        assert "The dry run says whether yours does." in only_updates

        money = (await pages.get(R, f"/review/requests/{transfers[0]}")).text
        assert button(money, "redrive-submit") == "Propose a redrive"
        assert button(money, "discard-submit") == "Propose a discard"
        assert "Edit the payload and propose a redrive…" in money
        assert 'data-test="four-eyes-note"' in money and "transfer moves money" in money
        plain = (await pages.get(R, f"/review/requests/{updates[0]}")).text
        assert button(plain, "redrive-submit") == "Redrive this request"
        assert button(plain, "discard-submit") == "Discard this request"
        assert 'data-test="four-eyes-note"' not in plain


async def test_times_are_utc_and_ids_are_the_ones_people_use(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("wi", 1250))
        await pages.post(R, f"/review/requests/{request_id}/redrive", {"reason": "bank is back"})
        (proposal_id,) = marked_ids((await pages.get(A, "/review/approvals")).text, "proposal")
        await pages.post(A, f"/review/approvals/{proposal_id}/approve", {"reason": "checked"})

        detail = (await pages.get(R, f"/review/requests/{request_id}")).text
        seen = visible(detail)
        assert not re.search(r"[0-9]T[0-9]{2}:[0-9]{2}", seen) and not EPOCH_MS.search(seen), seen
        assert re.search(rf'data-test="attempt-row" data-attempt="1">\s*<td class="num">1</td><td>w</td>'
                         rf'<td class="when">{UTC_TIME}</td><td class="num">[0-9]+ (?:ms|s)</td>', detail)  # fmt: skip
        steps = [html.unescape(s) for s in re.findall(r'data-test="timeline-entry" data-type="[a-z_]+">\s*<td class="when">'
                                                      rf'{UTC_TIME}</td>\s*<td>[^<]*</td>\s*<td>([^<]+)</td>', detail)]  # fmt: skip
        assert steps == ["received", "attempt 1 started", "attempt 1 failed", "dead-lettered"], steps
        assert "error:" in seen and "why:" in seen  # the steps' details named, not error_class / reason

        audit = (await pages.get(V, "/review/audit?sign_ins=1")).text
        seen = visible(audit)
        assert not EPOCH_MS.search(seen) and not re.search(r"[0-9]T[0-9]{2}:[0-9]{2}", seen), seen
        assert re.search(rf'data-field="expires_ms">.*?→ <span class="after"><code>{UTC_TIME}</code>', audit, re.S)
        assert re.search(rf'data-field="targets">.*?→ <span class="after"><code>{request_id}</code>', audit, re.S)
        # the request and the proposal an entry is about, separated (never "1-12proposal 1")
        assert re.search(rf"request {request_id}, proposal {proposal_id}\b", seen), seen
        assert "user viewer" in seen and "set a user" in seen and "document:users/viewer" not in seen
        assert "sign-ins of viewer" in seen and "password of" in seen and "sha256:" not in seen
        assert "edit redrive" not in seen and "document put" not in seen
        assert 'data-test="audit-target" data-target="document:users/viewer"' in audit  # the stored name, for tools


async def test_the_dry_run_shows_the_filter_it_acts_on_and_why_an_approver_is_needed(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        await dead(pages.api, transfer("wd", 300), transfer("wd", 400))
        query = {"kind": "transfer", "ref_key": "rp-wd", "currency": "CNY", "amount_min": "2.50"}
        dry = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter", **query})
        assert dry.status_code == 200, dry.text
        fields = dict(re.findall(r'data-test="dry-run-filter" data-field="([a-z_]+)">([^<]*)<', dry.text))
        assert fields == {"kind": "transfer", "ref_key": "rp-wd", "currency": "CNY", "amount_min": "2.50"}
        assert re.search(r"<dt>Ref key</dt><dd[^>]*>rp-wd<", dry.text)
        assert 'href="/review/dead-letters?kind=transfer&amp;ref_key=rp-wd&amp;currency=CNY&amp;amount_min=2.50"' in dry.text
        seen = visible(dry.text)
        assert "this it acts" not in seen and "Four eyes: confirming makes a proposal" in seen
        assert "(transfer moves money)" in seen
        everything = await pages.post(R, "/review/redrive/dry-run", {"scope": "filter"})
        assert 'data-test="dry-run-no-filter"' in everything.text
