"""A viewer never sees personal data unmasked, anywhere: every page and every JSON endpoint the app
serves is walked as a viewer (the routes read from the app itself, so a new one is walked without
anyone adding it here) over requests that carry planted account numbers, phone numbers, names and
a memo, in payloads, in an edit's payload and diff (pending and decided), in the audit entries,
in the downstream's error text and the producer's failure text, and in a redrive job's items. No
planted value may appear in any answer; the masked forms must (the walk reached the data).

Reasons and comments are what operators write, shown as written (docs/review.md asks them to keep
personal data out: the audit keeps them for ever); the walk's are free of it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from api_support import CALLBACK_TARGET, Api
from api_support import dead_letters as dead
from pages_support import running_pages
from starlette.routing import Mount, Route

from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER
PAYER: Final = "acct-6222020012345678"
PAYEE: Final = "acct-6222020087654321"
NEW_PAYEE: Final = "acct-6222020099990000"
OTHER_PAYEE: Final = "acct-6222020055556666"
RECEIVER: Final = "wx-13900139000"
NAME: Final = "Zhang Wei"
PHONE: Final = "+86 138 0013 8000"
ID_CARD: Final = "110101199003077777"
MEMO: Final = f"for {NAME}, call {PHONE}"
PLANTED: Final = (PAYER, PAYEE, NEW_PAYEE, OTHER_PAYEE, RECEIVER, NAME, PHONE, ID_CARD, "6222020012345678",
                  "13900139000")  # fmt: skip
MASKED: Final = ("****5678", "****4321", "****0000", "****6666", "****9000")
"""What a viewer sees instead: the last four characters of each account (and the receiver)."""
SKIPPED: Final = frozenset({"/docs", "/openapi.json"})
"""Routes that serve no data: the API's description and its browser."""
QUERIES: Final = {
    "/review/approvals": ("", "?all=1"),
    "/review/audit": ("", "?sign_ins=1", "?action=edit_redrive", "?action=group:Review"),
    "/v1/review/proposals": ("", "?pending=true"),
    "/v1/audit": ("", "?action=edit_redrive&action=propose"),
    "/review/jobs/{job_id}": ("", "?result=redriven"),
    "/v1/review/jobs/{job_id}/items": ("", "?result=redriven"),
    "/review/dead-letters": ("", "?kind=transfer", "?currency=CNY&amount_min=1"),
}
"""More than the plain page where a query shows other data (decided proposals, sign-ins, ...)."""


def _transfer(key: str, payee: str) -> dict[str, Any]:
    return {"kind": "transfer", "ref_key": f"rp-{key}",
            "payload": {"transfer_id": f"tr-{key}", "payer": PAYER, "payee": payee, "amount_minor": 6000,
                        "currency": "USD", "memo": MEMO},
            "failure": {"error_class": "timeout", "text": f"payment system did not answer for payee {payee}"}}  # fmt: skip


async def _plant(api: Api) -> dict[str, list[str]]:
    """Dead letters carrying personal data everywhere it can be, an edit approved and one pending,
    a discard proposed, and a redrive job over requests with personal data."""
    transfers = await dead(api, _transfer("mask-1", PAYEE), _transfer("mask-2", PAYEE),
                           error_text=f"HTTP 422 from payment: account {PAYER} is closed")  # fmt: skip
    others = await dead(api, {
        "kind": "list_update", "ref_key": "rp-mask-3",
        "payload": {"red_packet_id": "rp-mask-3", "receiver": RECEIVER, "version": 1, "amount_minor": 88, "currency": "CNY"},
    }, error_text=f"receiver {RECEIVER} unknown")  # fmt: skip
    others += await dead(api, {
        "kind": "callback", "ref_key": "rp-mask-4",
        "payload": {"target": CALLBACK_TARGET, "body": {"user": {"name": NAME, "phone": PHONE, "id_card": ID_CARD}}},
    }, error_text=f"HTTP 409 from the merchant: {NAME} ({ID_CARD}) exists already")  # fmt: skip
    reviewer, approver = api.auth(R), api.auth(A)
    edits = []
    for request_id, payee in ((transfers[0], NEW_PAYEE), (transfers[1], OTHER_PAYEE)):
        payload = {**_transfer("x", payee)["payload"], "transfer_id": f"tr-{request_id}", "amount_minor": 9_999_900}
        answer = await api.client.post(f"/v1/review/requests/{request_id}/edit", headers=reviewer,
                                       json={"payload": payload, "reason": "the customer's new account"})  # fmt: skip
        assert answer.status_code == 202, answer.text
        edits.append(answer.json()["proposal"]["id"])
    approved = await api.client.post(f"/v1/review/proposals/{edits[0]}/approve", headers=approver, json={"reason": "ok"})
    assert approved.status_code == 200, approved.text
    new_id = approved.json()["new_ids"][0]
    discard = await api.client.post(f"/v1/review/requests/{others[0]}/discard", headers=reviewer,
                                    json={"reason_code": "duplicate", "comment": "paid twice"})  # fmt: skip
    assert discard.status_code in (200, 202), discard.text
    job = await api.client.post("/v1/review/jobs", headers=reviewer, json={"ids": [others[1]], "reason": "retry",
                                                                          "rate_per_s": 1})  # fmt: skip
    assert job.status_code == 201, job.text
    proposals = [str(p) for p in edits]
    if discard.status_code == 202:
        proposals.append(str(discard.json()["proposal"]["id"]))
    return {"request_id": [*transfers, *others, new_id], "ref_key": ["rp-mask-1", "rp-mask-2", "rp-mask-3", "rp-mask-4"],
            "proposal_id": proposals, "job_id": [str(job.json()["id"])], "kind": ["transfer", "list_update", "callback"],
            "downstream": ["payment", "red_packet", "callback"], "name": ["not-found"], "group": ["0" * 32]}  # fmt: skip


def _paths(app: Any, values: dict[str, list[str]]) -> Iterator[str]:
    """Every GET path the app serves, each path parameter filled with each planted value."""
    for route in app.routes:
        if isinstance(route, Mount) or not isinstance(route, Route) or "GET" not in (route.methods or ()):
            continue
        if route.path in SKIPPED:
            continue
        names = re.findall(r"{([a-z_]+)(?::[a-z]+)?}", route.path)
        assert all(name in values for name in names), f"{route.path}: a path parameter this walk cannot fill"
        fillings: list[str] = [route.path]
        for name in names:
            fillings = [re.sub(rf"{{{name}(:[a-z]+)?}}", value, path) for path in fillings for value in values[name]]
        for path in fillings:
            for query in QUERIES.get(route.path, ("",)):
                yield path + query


def _unmasked(text: str) -> list[str]:
    return [value for value in PLANTED if value in text or value.replace("+", "&#43;") in text]


async def test_a_viewer_sees_no_personal_data_on_any_page_or_in_any_json_answer(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        values = await _plant(pages.api)
        seen = ""
        walked = 0
        for path in _paths(pages.api.app, values):
            answers = [await pages.get(V, path), await pages.api.client.get(path, headers=pages.api.auth(V))]
            if path.startswith("/review/dead-letters") and "?" not in path:
                answers.append(await pages.get(V, path, headers={"HX-Request": "true"}))  # the htmx fragment
            for answer in answers:
                assert answer.status_code < 500, (path, answer.status_code)
                assert not _unmasked(answer.text), (path, answer.status_code, _unmasked(answer.text))
                seen += answer.text
            walked += 1
        assert walked > 40, walked
        assert all(masked in seen for masked in MASKED), [m for m in MASKED if m not in seen]
        for role in (R, A):  # the walk's data is there unmasked for those who may see it
            reviewer_view = (await pages.get(role, f"/review/requests/{values['request_id'][0]}")).text
            assert PAYER in reviewer_view and PAYEE in reviewer_view, role


async def test_a_viewer_reads_masked_through_the_api_even_where_a_route_forgot_to_say_who_may_read(
    store: StoreThread,
) -> None:
    """The masking is the store client's, chosen by who authenticated: a request no one
    authenticated for (request.state says nothing) is given the masked client."""
    from starlette.requests import Request

    from api.masked_reads import MaskedQueueClient
    from api.services import of

    async with running_pages(store) as pages:
        scope = {"type": "http", "app": pages.api.app, "headers": [], "state": {}}
        request = Request(scope)
        assert isinstance(of(request).queue, MaskedQueueClient)
        request.state.personal_data = True
        assert not isinstance(of(request).queue, MaskedQueueClient)
        await _plant(pages.api)
        masked = of(Request({**scope, "state": {}})).queue
        views = (await masked.dead_letters()).value.items
        assert views and not any(_unmasked(repr(view)) for view in views)
        assert _unmasked(repr((await pages.api.queue.dead_letters()).value.items))
