"""Who may do what, once, as a table: every JSON review endpoint and every review page action, for
every role and for nobody (no token, no session), answered as specified: allowed (anything but
401/403 and no server error: a conflict with the state is still allowed), 403 for a role without
the right, 401 without a token, and a redirect to the login page without a session. One store and
one set of logins serve the whole table (module-scoped); each row acts on targets of its own."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pytest
import pytest_asyncio
from api_support import dead_letters, transfer
from pages_support import Pages, list_update, running_pages

from queues import RedriveJob, Role
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store

MODULE_LOOP: Final = pytest.mark.asyncio(loop_scope="module")
P, OP, V, R, A, ADMIN = Role.PRODUCER, Role.OPERATOR, Role.VIEWER, Role.REVIEWER, Role.APPROVER, Role.ADMIN
OBSERVERS: Final = frozenset({OP, R, A, V})
EVERY_WEB_ROLE: Final = frozenset({V, R, A, ADMIN})


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    """With {dead}, {money}, {job}, {proposal}: each row's own targets, made by the fixture."""
    body: dict[str, Any] | None
    allowed: frozenset[Role]
    """Besides admin, who may do everything (but approve their own proposal: tested below)."""


JSON_ROWS: Final = (
    Row("GET", "/v1/review/dead-letters", None, OBSERVERS),
    Row("POST", "/v1/review/redrive", {"ids": ["{dead}"], "reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/requests/{dead}/edit", {"payload": {**list_update("e")["payload"], "version": 2}, "reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/requests/{dead}/discard", {"reason_code": "duplicate", "comment": "m"}, frozenset({R})),
    Row("GET", "/v1/review/proposals", None, OBSERVERS),
    Row("POST", "/v1/review/proposals/{proposal}/approve", {}, frozenset({A})),
    Row("POST", "/v1/review/proposals/{proposal}/reject", {"reason": "m"}, frozenset({R, A})),
    Row("GET", "/v1/audit", None, OBSERVERS),
    Row("POST", "/v1/review/jobs:dry-run", {"ids": ["{dead}"]}, frozenset({R})),
    Row("POST", "/v1/review/jobs", {"ids": ["{dead}"], "reason": "m", "rate_per_s": 1}, frozenset({R})),
    Row("GET", "/v1/review/jobs", None, OBSERVERS),
    Row("GET", "/v1/review/jobs/{job}", None, OBSERVERS),
    Row("GET", "/v1/review/jobs/{job}/items", None, OBSERVERS),
    Row("POST", "/v1/review/jobs/{job}/pause", {"reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/jobs/{job}/resume", {"reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/jobs/{job}/cancel", {"reason": "m"}, frozenset({R})),
    Row("GET", "/v1/review/job-groups/{group}", None, OBSERVERS),
    Row("POST", "/v1/review/job-groups/{jobgroup}/pause", {"reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/job-groups/{jobgroup}/resume", {"reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/job-groups/{jobgroup}/cancel", {"reason": "m"}, frozenset({R})),
    Row("POST", "/v1/review/job-groups/{group}/approve", {}, frozenset({A})),
    Row("POST", "/v1/review/job-groups/{group}/reject", {"reason": "m"}, frozenset({R, A})),
    Row("POST", "/v1/review/job-groups/{group}/repropose", {"reason": "m"}, frozenset({R})),
)  # fmt: skip

PAGE_ROWS: Final = (
    Row("GET", "/review/dead-letters", None, EVERY_WEB_ROLE),
    Row("GET", "/review/dead-letters.csv", None, EVERY_WEB_ROLE),
    Row("GET", "/review/requests/{dead}", None, EVERY_WEB_ROLE),
    Row("POST", "/review/requests/{dead}/redrive", {"reason": "m"}, frozenset({R})),
    Row("GET", "/review/requests/{dead}/edit", None, frozenset({R})),
    Row("POST", "/review/requests/{dead}/edit", {"payload": "{}", "reason": "m", "step": "preview"}, frozenset({R})),
    Row("POST", "/review/requests/{dead}/discard", {"reason_code": "duplicate", "comment": "m"}, frozenset({R})),
    Row("POST", "/review/redrive/dry-run", {"scope": "selection", "ids": "{dead}"}, frozenset({R})),
    Row("POST", "/review/redrive", {"scope": "selection", "ids": "{dead}", "reason": "m"}, frozenset({R})),
    Row("GET", "/review/jobs", None, EVERY_WEB_ROLE),
    Row("GET", "/review/jobs/{job}", None, EVERY_WEB_ROLE),
    Row("GET", "/review/jobs/{job}/progress", None, EVERY_WEB_ROLE),
    Row("POST", "/review/jobs/{job}/pause", {"reason": "m"}, frozenset({R})),
    Row("POST", "/review/jobs/{job}/cancel", {"reason": "m"}, frozenset({R})),
    Row("GET", "/review/job-groups/{group}", None, EVERY_WEB_ROLE),
    Row("POST", "/review/job-groups/{group}/approve", {"reason": "m"}, frozenset({A})),
    Row("POST", "/review/job-groups/{group}/reject", {"reason": "m"}, frozenset({A})),
    Row("POST", "/review/job-groups/{group}/withdraw", {"reason": "m"}, frozenset({R})),
    Row("POST", "/review/job-groups/{jobgroup}/pause", {"reason": "m"}, frozenset({R})),
    Row("POST", "/review/job-groups/{jobgroup}/cancel", {"reason": "m"}, frozenset({R})),
    Row("GET", "/review/approvals", None, EVERY_WEB_ROLE),
    Row("POST", "/review/approvals/{proposal}/approve", {"reason": "m"}, frozenset({A})),
    Row("POST", "/review/approvals/{proposal}/reject", {"reason": "m"}, frozenset({A})),
    Row("POST", "/review/approvals/{proposal}/withdraw", {"reason": "m"}, frozenset({R})),
    Row("GET", "/review/audit", None, EVERY_WEB_ROLE),
)  # fmt: skip
"""The proposals are the reviewer's: only they may withdraw one (admin included, nobody else)."""


@pytest.fixture(scope="module")
def matrix_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreThread]:
    with running_store(tmp_path_factory.mktemp("matrix") / "store", machine_factory) as thread:
        yield thread


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pages(matrix_store: StoreThread) -> AsyncIterator[Pages]:
    async with running_pages(matrix_store) as running:
        yield running


async def targets(pages: Pages) -> dict[str, str]:
    """A row's own dead letter, money-moving dead letter, running job and pending proposal, and a
    job group proposed by the reviewer and one running (one set holds each group's one part)."""
    api = pages.api
    n = len((await api.queue.jobs(limit=1000)).value)
    dead, money, for_job, for_group, for_jobgroup = await dead_letters(
        api, list_update(f"t{n}"), transfer(f"m{n}"), list_update(f"j{n}"), list_update(f"g{n}"), list_update(f"h{n}"))
    started = await api.queue.start_job(RedriveJob(actor="tests", reason="matrix", ids=(int(for_job.split("-")[1]),),
                                                   rate_per_s=1))  # fmt: skip
    proposed = await api.client.post("/v1/review/redrive", json={"ids": [money], "reason": "matrix"}, headers=api.auth(R))
    assert proposed.status_code == 202, proposed.text
    group, jobgroup = secrets.token_hex(16), secrets.token_hex(16)
    await api.queue.propose(RedriveJob(actor="reviewer", reason="matrix", ids=(int(for_group.split("-")[1]),),
                                       rate_per_s=1, group=group), ttl_ms=3_600_000)  # fmt: skip
    await api.queue.start_job(RedriveJob(actor="tests", reason="matrix", ids=(int(for_jobgroup.split("-")[1]),),
                                         rate_per_s=1, group=jobgroup))  # fmt: skip
    return {"dead": dead, "money": money, "job": str(started.job_id), "proposal": str(proposed.json()["proposal"]["id"]),
            "group": group, "jobgroup": jobgroup}  # fmt: skip


def filled(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, target in names.items():
            value = value.replace("{" + name + "}", target)
        return value
    if isinstance(value, dict):
        return {k: filled(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [filled(v, names) for v in value]
    return value


@MODULE_LOOP
@pytest.mark.parametrize("row", JSON_ROWS, ids=lambda row: f"{row.method} {row.path}")
async def test_json_review_endpoints_by_role(pages: Pages, row: Row) -> None:
    names = await targets(pages)
    path, body = filled(row.path, names), filled(row.body, names)
    for role in (None, *Role):
        headers = {} if role is None else pages.api.auth(role)
        status = (await pages.api.client.request(row.method, path, json=body, headers=headers)).status_code
        if role is None:
            assert status == 401, (row, status)
        elif role in row.allowed or role is ADMIN:
            assert status not in (401, 403) and status < 500, (row, role, status)
        else:
            assert status == 403, (row, role, status)


@MODULE_LOOP
@pytest.mark.parametrize("row", PAGE_ROWS, ids=lambda row: f"{row.method} {row.path}")
async def test_review_pages_by_role(pages: Pages, row: Row) -> None:
    names = await targets(pages)
    path, body = filled(row.path, names), filled(row.body, names)
    anonymous = await pages.anonymous.request(row.method, path, data=body)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/review/login"), (row, anonymous)
    for role in (R, V, A, ADMIN):  # the reviewer first: a withdrawal by anyone else is tested while it is pending
        if row.method == "GET":
            answer = await pages.get(role, path)
        else:
            answer = await pages.post(role, path, body)
        if role in row.allowed or (role is ADMIN and not path.endswith("/withdraw")):
            to_login = answer.headers.get("location", "").startswith("/review/login")
            assert not to_login and answer.status_code not in (401, 403) and answer.status_code < 500, (row, role, answer.status_code)
        else:
            assert answer.status_code == 403, (row, role, answer.status_code)
    if row.method == "POST":  # a form without the session's CSRF token changes nothing
        forged = await pages.browsers[ADMIN].post(path, data={**(body or {}), "csrf_token": "forged"})
        assert forged.status_code == 403, (row, forged.status_code)


@MODULE_LOOP
async def test_a_proposer_approving_their_own_proposal_is_refused(pages: Pages) -> None:
    api = pages.api
    (money,) = await dead_letters(api, transfer("own"))
    for role, approve in ((ADMIN, "json"), (ADMIN, "page")):
        proposed = await api.client.post("/v1/review/redrive", json={"ids": [money], "reason": "mine"}, headers=api.auth(role))
        proposal = proposed.json()["proposal"]["id"]
        if approve == "json":
            answer = await api.client.post(f"/v1/review/proposals/{proposal}/approve", json={}, headers=api.auth(role))
            assert answer.status_code == 403 and answer.json()["type"] == "/problems/own-proposal"
        else:
            page = await pages.post(role, f"/review/approvals/{proposal}/approve")
            assert page.status_code == 403 and 'data-kind="error"' in page.text
        state = (await api.queue.proposals(ids=[proposal])).value[0].state
        assert state.value == "pending"


def test_the_table_names_every_review_route() -> None:
    """A new review route must be added to the table: the table is the specification."""
    from api.routers import review, review_jobs
    from api.web import (
        pages_approvals,
        pages_audit,
        pages_dead_letters,
        pages_detail,
        pages_edit,
        pages_groups,
        pages_jobs,
    )

    routes = {(method, route.path) for module in (review, review_jobs) for route in module.router.routes
              for method in getattr(route, "methods", ())}  # fmt: skip
    assert routes == {(row.method, row.path.replace("{dead}", "{request_id}").replace("{proposal}", "{proposal_id}")
                       .replace("{job}", "{job_id}").replace("{jobgroup}", "{group}")) for row in JSON_ROWS}  # fmt: skip
    pages = {(method, route.path) for module in (pages_dead_letters, pages_detail, pages_edit, pages_approvals,
                                                 pages_audit, pages_jobs, pages_groups)
             for route in module.router.routes for method in getattr(route, "methods", ())} - {("GET", "/review")}  # fmt: skip
    covered = {(row.method, row.path.replace("{dead}", "{request_id}").replace("{proposal}", "{proposal_id}")
                .replace("{job}", "{job_id}").replace("{jobgroup}", "{group}")) for row in PAGE_ROWS}  # fmt: skip
    assert pages - covered <= {("POST", "/review/jobs/{job_id}/{action}"), ("POST", "/review/job-groups/{group}/{action}")}
    assert {("POST", f"/review/job-groups/{{group}}/{a}") for a in ("approve", "reject", "withdraw", "cancel")} <= covered
    assert {("POST", "/review/jobs/{job_id}/pause"), ("POST", "/review/jobs/{job_id}/cancel")} <= covered
