"""What every route answers at its edges, walked over the routes the app serves (a new route is
walked without anyone adding it here): ids of 2**64 and other out-of-range or malformed ids are a
clear 4xx on every page and JSON route, never a 500; a JSON error is an RFC 9457 problem; every
review page, whatever it answers, is sent not to be cached, sniffed or framed, with a CSP."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from pages_support import Pages, running_pages
from starlette.routing import Route

from api.web.headers import PAGE_HEADERS
from queues import Enqueue, Role
from raft_store.testing.inprocess import StoreThread

R = Role.REVIEWER
BAD_IDS: Final = (str(2**64), str(2**63), str(2**62 + 1), "0", "-1", "1e3", "9" * 60, "1-" + str(2**64))
PARAMETERS: Final = {"request_id", "proposal_id", "job_id", "ref_key", "kind", "downstream", "name", "action", "group"}
"""Every path parameter the app's routes have; a new one must be added here (and to the walk)."""


def _routes(app: Any) -> Iterator[tuple[str, str, list[str]]]:
    for route in app.routes:
        if isinstance(route, Route):
            names = re.findall(r"{([a-z_]+)}", route.path)
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    yield method, route.path, names


async def _ask(pages: Pages, method: str, path: str, *, page: bool) -> Any:
    if not page:
        return await pages.api.client.request(method, path, json={}, headers=pages.api.auth(Role.ADMIN))
    if method == "GET":
        return await pages.get(Role.ADMIN, path)
    return await pages.post(Role.ADMIN, path, {"reason": "edge"})


async def test_an_id_out_of_range_is_a_4xx_on_every_route(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        walked = 0
        for method, path, names in _routes(pages.api.app):
            assert set(names) <= PARAMETERS, f"{path}: a parameter this walk does not know"
            if not {"request_id", "proposal_id", "job_id", "group"} & set(names):
                continue
            for bad in BAD_IDS:
                filled = path
                for name in names:
                    filled = filled.replace("{" + name + "}", {"action": "pause"}.get(name, bad))
                page = filled.startswith("/review")
                answer = await _ask(pages, method, filled, page=page)
                assert 400 <= answer.status_code < 500, (method, filled, answer.status_code, answer.text[:300])
                if not page or answer.headers["content-type"].startswith("application/"):
                    assert answer.headers["content-type"] == "application/problem+json", (method, filled)
                    assert answer.json()["status"] == answer.status_code
                walked += 1
        assert walked >= 20 * len(BAD_IDS), walked


async def test_every_review_page_is_sent_uncached_unsniffed_unframed_with_a_csp(store: StoreThread) -> None:
    async with running_pages(store) as pages:
        walked = 0
        for method, path, names in _routes(pages.api.app):
            if not path.startswith("/review"):
                continue
            filled = path
            for name in names:
                filled = filled.replace("{" + name + "}", {"request_id": "1-999", "action": "pause"}.get(name, "999"))
            for who in ("anonymous", "reviewer"):
                if who == "anonymous":
                    answer = await pages.anonymous.request(method, filled, data={"name": "x", "password": "y"})
                elif method == "GET":
                    answer = await pages.get(R, filled)
                else:
                    answer = await pages.post(R, filled, {"reason": "headers"})
                for header, value in PAGE_HEADERS.items():
                    assert answer.headers.get(header) == value, (who, method, filled, answer.status_code, header)
                walked += 1
        assert walked >= 40, walked
        csp = PAGE_HEADERS["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "unsafe" not in csp and "http" not in csp
        page = (await pages.get(R, "/review/dead-letters")).text
        assert "<script>" not in page and "style=" not in page and "<style" not in page  # nothing inline to allow


async def test_a_hidden_character_stored_before_intake_refused_it_is_shown_escaped(store: StoreThread) -> None:
    """A ref key stored with a right-to-left override reads "rp-live" if printed as it is: every page
    prints it as its escape, and a form gives back exactly what it was given."""
    async with running_pages(store) as pages:
        queue = pages.api.queue
        payload = b'{"red_packet_id":"rp-1","receiver":"u-1","version":1,"amount_minor":1,"currency":"CNY"}'
        (stored,) = await queue.enqueue_many([Enqueue(kind="list_update", idempotency_key="producer:old",
                                                      ref_key="rp-\u202eevil", payload=payload)])  # fmt: skip
        (grant,) = (await queue.lease("w", count_max=1, lease_ms=30_000)).grants
        await queue.fail(grant.message_id, grant.token, "closed", "gone\u200b", permanent=True)
        for path in ("/review/dead-letters", f"/review/requests/1-{stored.message_id}"):
            page = (await pages.get(R, path)).text
            assert "rp-\\u202eevil" in page and "\u202e" not in page and "\u200b" not in page, path
        typed = await pages.get(R, "/review/dead-letters", params={"ref_key": "rp-\u202eevil"})
        assert 'value="rp-\u202eevil"' in typed.text  # the filter as typed, to send again
        assert 'data-test="dead-letter-row"' in typed.text
