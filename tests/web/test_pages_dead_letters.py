"""The dead-letter list and its CSV export, over HTTP against the real store."""

from __future__ import annotations

import csv
import io

from api_support import dead_letters as dead
from pages_support import list_update, marked_ids, running_pages, transfer

from queues import Role
from raft_store.testing.inprocess import StoreThread

V, R = Role.VIEWER, Role.REVIEWER


async def test_filters_and_totals_per_currency(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        cny = await dead(pages.api, list_update("a", 1250), list_update("b", 250), transfer("c", 100_000))
        jpy = await dead(pages.api, list_update("d", 12345, "JPY"))
        late = await dead(pages.api, list_update("e", 999, "BHD"), error_class="timeout")
        page = await pages.get(V, "/review/dead-letters")
        assert page.status_code == 200
        assert set(marked_ids(page.text, "dead-letter-row")) == {*cny, *jpy, *late}
        assert 'data-test="summary-count">5<' in page.text
        assert 'data-currency="CNY" data-count="3" data-amount-minor="101500"' in page.text
        assert "1,015.00 CNY" in page.text and "12,345 JPY" in page.text and "0.999 BHD" in page.text
        by_currency = await pages.get(V, "/review/dead-letters?currency=CNY&amount_min=2.50&amount_max=12.50")
        assert set(marked_ids(by_currency.text, "dead-letter-row")) == set(cny[:2])
        assert 'data-test="summary-count">2<' in by_currency.text
        assert "15.00 CNY" in by_currency.text
        by_kind = await pages.get(V, "/review/dead-letters?kind=transfer")
        assert marked_ids(by_kind.text, "dead-letter-row") == cny[2:]
        by_error = await pages.get(V, "/review/dead-letters?error_class=timeout&attempts_min=1&attempts_max=1")
        assert marked_ids(by_error.text, "dead-letter-row") == late
        empty = await pages.get(V, "/review/dead-letters?ref_key=nothing-here")
        assert 'data-test="empty-state"' in empty.text
        bad = await pages.get(V, "/review/dead-letters?currency=CNY&amount_min=1.234&attempts_min=x")
        assert bad.status_code == 422
        assert 'data-field="amount_min"' in bad.text and 'data-field="attempts_min"' in bad.text
        no_currency = await pages.get(V, "/review/dead-letters?amount_min=1")
        assert 'data-field="currency"' in no_currency.text


async def test_pages_follow_the_cursor(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        ids = await dead(pages.api, *(list_update(f"p{n}") for n in range(55)))
        first = await pages.get(R, "/review/dead-letters?kind=list_update")
        on_first = marked_ids(first.text, "dead-letter-row")
        assert len(on_first) == 50
        assert 'data-test="row-select"' in first.text
        link = first.text.split('data-test="next-page"')[0].rsplit('href="', 1)[1].split('"')[0]
        second = await pages.get(R, link.replace("&amp;", "&"))
        assert sorted([*on_first, *marked_ids(second.text, "dead-letter-row")]) == sorted(ids)
        viewer = await pages.get(V, "/review/dead-letters")
        assert 'data-test="row-select"' not in viewer.text  # a viewer cannot redrive: no selection


async def test_the_csv_export_is_every_page_masked_for_a_viewer_and_formula_safe(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        ids = await dead(pages.api, *(list_update(f"x{n}") for n in range(3)),
                         transfer("f", memo="=HYPERLINK(\"http://evil\")"), error_text="=cmd|' /C calc'!A0")  # fmt: skip
        for role, masked in ((V, True), (R, False)):
            answer = await pages.get(role, "/review/dead-letters.csv")
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
            rows = list(csv.DictReader(io.StringIO(answer.text)))
            assert sorted(row["id"] for row in rows) == sorted(ids)
            first = next(row for row in rows if row["id"] == ids[0])
            assert first["amount"] == "1.00" and first["currency"] == "CNY" and first["amount_minor"] == "100"
            assert all(row["error_text"].startswith("'=") for row in rows)
            assert ("user-700042" in answer.text) is not masked and ("HYPERLINK" in answer.text) is not masked
            assert ("****0042" in first["payload"]) is masked
        filtered = await pages.get(V, "/review/dead-letters.csv?kind=transfer")
        assert [row["id"] for row in csv.DictReader(io.StringIO(filtered.text))] == ids[3:]
