"""Four eyes show the money that moves: an approver sees, before approving, what each proposal
will pay once done (an edit's new amount and currency, beside the old), the totals per currency of
what will be paid, and an amount in a diff as money; in the approvals inbox and the JSON API alike."""

from __future__ import annotations

import json
import re

from api_support import dead_letters as dead
from pages_support import marked_ids, running_pages, transfer

from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R, A = Role.VIEWER, Role.REVIEWER, Role.APPROVER


def _section(html: str, proposal_id: str) -> str:
    start = html.index(f'data-test="proposal" data-id="{proposal_id}"')
    end = html.find('data-test="proposal" data-id=', start + 10)
    return html[start:] if end < 0 else html[start:end]


async def test_an_edit_of_amount_currency_and_payee_shows_the_approver_what_will_be_paid(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        (request_id,) = await dead(pages.api, transfer("money", 6000, currency="USD"))
        path = f"/review/requests/{request_id}/edit"
        edited = json.dumps({**transfer("money")["payload"], "amount_minor": 9_999_900, "currency": "EUR",
                             "payee": "user-9900099"})  # fmt: skip
        preview = await pages.post(R, path, {"payload": edited, "reason": "customer's new account", "step": "preview"})
        assert 'data-test="edit-pays" data-currency="EUR" data-amount-minor="9999900">99,999.00 EUR<' in preview.text
        assert 'data-test="edit-pays-before" data-currency="USD" data-amount-minor="6000">60.00 USD<' in preview.text
        previewed = re.search(r'name="previewed" value="([0-9a-f]+)"', preview.text)
        assert previewed
        proposed = await pages.post(R, path, {"payload": edited, "reason": "customer's new account", "step": "submit",
                                              "previewed": previewed.group(1)})  # fmt: skip
        assert 'data-kind="proposed"' in proposed.text

        inbox = (await pages.get(A, "/review/approvals")).text
        (proposal_id,) = marked_ids(inbox, "proposal")
        card = _section(inbox, proposal_id)
        assert re.search(r'data-test="proposal-total" data-currency="EUR" data-amount-minor="9999900" data-count="1">'
                         r"99,999.00 EUR<", card), card  # fmt: skip
        assert re.search(r'data-test="proposal-total-before" data-currency="USD" data-amount-minor="6000"[^>]*>60.00 USD<',
                         card)  # fmt: skip
        assert "Amounts:" not in card and ">60.00 USD (1)<" not in card  # never the old figure as what is paid
        payment = re.search(r'data-test="proposal-payment" data-id="([^"]+)" data-currency="EUR" data-amount-minor="9999900"'
                            r' data-before-currency="USD" data-before-amount-minor="6000"', card)  # fmt: skip
        assert payment and payment.group(1) == request_id
        assert re.search(r'data-field="amount"><code>amount</code> <span class="before">60.00 USD</span> → '
                         r'<span class="after">99,999.00 EUR</span>', card), card  # fmt: skip
        assert re.search(r'data-field="payee">.*?user-4200042.*?→.*?user-9900099', card, re.S)
        assert "amount_minor" not in re.sub(r"<pre.*?</pre>", "", card, flags=re.S)  # no minor units to divide

        viewer = _section((await pages.get(V, "/review/approvals")).text, proposal_id)
        assert "99,999.00 EUR" in viewer and "user-9900099" not in viewer and "****0099" in viewer

        listed = await pages.api.client.get("/v1/review/proposals?pending=true", headers=pages.api.auth(A))
        (document,) = listed.json()
        assert document["pays"] == {
            "totals": [{"currency": "EUR", "count": 1, "amount_minor": 9_999_900, "amount": "99999.00"}],
            "before_totals": [{"currency": "USD", "count": 1, "amount_minor": 6000, "amount": "60.00"}],
            "without_amount": 0, "item_count": 1,
            "items": [{"id": request_id, "amount": {"amount_minor": 9_999_900, "currency": "EUR", "amount": "99999.00"},
                       "before": {"amount_minor": 6000, "currency": "USD", "amount": "60.00"}}],
        }  # fmt: skip


async def test_a_redrive_shows_its_totals_and_a_discard_that_it_pays_nothing(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        api = pages.api
        first, second, third = await dead(api, transfer("r1", 1250), transfer("r2", 750), transfer("r3", 999, currency="JPY"))
        redrive = await api.client.post("/v1/review/redrive", json={"ids": [first, second, third], "reason": "back"},
                                        headers=api.auth(R))  # fmt: skip
        assert redrive.status_code == 202, redrive.text
        pays = redrive.json()["proposal"]["pays"]
        assert pays["totals"] == [{"currency": "CNY", "count": 2, "amount_minor": 2000, "amount": "20.00"},
                                  {"currency": "JPY", "count": 1, "amount_minor": 999, "amount": "999"}]  # fmt: skip
        assert pays["before_totals"] is None and [item["before"] for item in pays["items"]] == [None, None, None]
        await api.client.post(f"/v1/review/proposals/{redrive.json()['proposal']['id']}/reject",
                              json={"reason": "not yet"}, headers=api.auth(A))  # fmt: skip
        discard = await api.client.post(f"/v1/review/requests/{first}/discard",
                                        json={"reason_code": "paid_manually", "comment": "bank transfer"},
                                        headers=api.auth(R))  # fmt: skip
        assert discard.status_code == 202 and discard.json()["proposal"]["pays"]["totals"] == []
        assert discard.json()["proposal"]["pays"]["before_totals"][0]["amount"] == "12.50"
        inbox = (await pages.get(A, "/review/approvals")).text
        card = _section(inbox, str(discard.json()["proposal"]["id"]))
        assert 'data-test="proposal-pays-nothing"' in card and ">12.50 CNY<" in card
