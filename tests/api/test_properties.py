"""Properties over generated input, against the API served by uvicorn in this process:
schemathesis drives every operation of the OpenAPI description with generated requests (valid and
not) and checks that nothing answers 500 and that every answer matches the description (status,
media type, schema); Hypothesis submits generated valid payloads of every kind and reads them back
equal."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import re
import string
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import requests
import schemathesis
import uvicorn
from api_support import CALLBACK_TARGET, put_tokens, queue_store, settings
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api.http import check_key
from api.problems import Problem
from api.review_policy import DISCARD_REASON_CODES
from api.web.accounts import Accounts
from compensator.wiring.api import api_app
from delay.policy import DAY_MS
from handlers.classification import decode_table
from ledger.currencies import MINOR_UNIT_DIGITS
from ledger.kinds import AMOUNT_MINOR_MAX, VERSION_MAX
from ledger.request_ids import RequestId
from queues import QueueClient, RaftClient, Role
from raft_store.testing.processes import free_ports

EDGE_IDS = (2**64, 2**63, -(2**63) - 1, 0, "1e3", "1-18446744073709551616")
"""Path parameters a generator rarely draws and a 64-bit store cannot hold: each route gets them too."""
PAGE_USER = "fuzz-admin"
PAGE_PASSWORD = "correct horse battery staple"


@dataclass
class Served:
    url: str
    tokens: dict[Role, str]
    page_routes: list[Any]
    """The review pages' routes (outside the public description), for their own schema."""

    def auth(self, role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = queue_store(Path(tmp_path_factory.mktemp("store")))
    store.start()
    tokens = store.run(put_tokens(store))
    (port,) = free_ports(1)
    app = api_app(settings(store))
    store.run(_add_page_user(store))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="asyncio", log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", tokens,
                     [r for r in app.routes if isinstance(r, APIRoute) and r.path.startswith("/review")])
    finally:
        server.should_exit = True
        thread.join(15)
        store.stop()


async def _add_page_user(store: Any) -> None:
    """The pages' user, through a client of its own (the app's belongs to uvicorn's event loop)."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    try:
        await Accounts(queue, clock_ms=lambda: time.time_ns() // 1_000_000).add(PAGE_USER, Role.ADMIN, PAGE_PASSWORD,
                                                                              actor="tests")  # fmt: skip
    finally:
        await queue.raft.close()


def _outside_cross_field_rules(case: Any) -> bool:
    """The rules the description states in words, not in JSON Schema (a payer is not its own
    payee; not_before is at most 2 years ahead; a policy's backoff_min_ms is at most its
    backoff_max_ms and names each error class once; a classification table's rules make a whole
    table for the downstream in its path; an edited payload must suit the stored request's kind; a
    discard's reason code must be one the configuration lists; a callback's target must be one the configuration
    registers): schemathesis would call a request
    that breaks them 'valid data rejected'. For such requests that one check is left out (all the others run), and
    the rules are tested in test_intake.py, test_operator.py, test_downstreams.py and test_review_api.py; a job
    filter's ranges must not be empty and an amount range names its currency (test_review_jobs_api.py); the audit
    filter's `until` is after its `since` and its `target` names no other set's request (test_review_api.py); a
    cursor of several sets (a position per set) is one the deployment gave (tests/web/test_pages_sets.py); a
    retention is at least the store's floor (a day; tests/api/test_operator.py)."""
    body = case.body if isinstance(case.body, dict) else {}
    low, high = body.get("backoff_min_ms", 1000), body.get("backoff_max_ms", 3_600_000)
    if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
        return False
    overrides = body.get("overrides")
    if isinstance(overrides, list):
        classes = [o.get("error_class") for o in overrides if isinstance(o, dict)]
        if len(set(map(str, classes))) != len(classes):
            return False
    payload = body.get("payload")
    if isinstance(payload, dict) and "payer" in payload and payload.get("payer") == payload.get("payee"):
        return False
    if body.get("kind") == "callback" and isinstance(payload, dict) and payload.get("target") != CALLBACK_TARGET:
        return False
    if "rules" in body and "downstream" in body:  # a classification table: its rules must make a whole table
        try:
            table = decode_table(msgspec.json.encode(body))
        except (ValueError, msgspec.DecodeError):
            return False
        if not case.path_parameters or table.downstream != case.path_parameters.get("downstream"):
            return False
    path = getattr(case, "formatted_path", "") or ""
    if path.endswith("/edit"):  # an edited payload is checked against the stored request's kind
        return False
    if path.endswith("/discard") and body.get("reason_code") not in DISCARD_REASON_CODES:  # a configured list
        return False
    chosen = body.get("filter")
    if isinstance(chosen, dict):  # a job's filter: each range low <= high, an amount range in one currency
        for low, high in (("amount_min_minor", "amount_max_minor"), ("attempts_min", "attempts_max"),
                          ("dead_from", "dead_to")):  # fmt: skip
            if chosen.get(low) is not None and chosen.get(high) is not None and not _ordered(chosen[low], chosen[high]):
                return False
        if (chosen.get("amount_min_minor") is not None or chosen.get("amount_max_minor") is not None) and not chosen.get("currency"):
            return False
    query = case.query if isinstance(getattr(case, "query", None), dict) else {}
    if path.endswith("/v1/audit"):  # the audit filter: since before until; a request id of this set
        since, until = query.get("since"), query.get("until")
        if isinstance(since, str) and isinstance(until, str) and not _ordered(since, until, strict=True):
            return False
        request = RequestId.parse(str(query.get("target", "")))
        if request is not None and request.set_id != 1:
            return False
        if query.get("cursor") is not None:  # a cursor of several sets' merged chain: this deployment has one
            return False
    if path.endswith("/v1/review/dead-letters") and ":" in str(query.get("cursor", "")):
        return False  # a cursor of several sets' merged list, which one set never gives (docs/review.md)
    if path.endswith("/v1/retention") and any(
            isinstance(body.get(name), int | float) and body[name] < DAY_MS for name in ("retention_ms", "event_retention_ms")):
        return False
    not_before = body.get("not_before")
    return not (isinstance(not_before, str) and not_before[:4].isdigit() and int(not_before[:4]) > 2027)


def _ordered(low: Any, high: Any, *, strict: bool = False) -> bool:
    """low <= high (low < high when `strict`)."""
    try:
        if isinstance(low, str) and isinstance(high, str):
            low, high = dt.datetime.fromisoformat(low), dt.datetime.fromisoformat(high)
        return bool(low < high) if strict else bool(low <= high)
    except (TypeError, ValueError):
        return True  # not comparable: the schema refuses it, which is not this rule's business


def _fresh_key(case: Any) -> None:
    """Generated keys repeat ("0", "a"); a repeat with another body is rightly a 422 reuse, which
    schemathesis would read as valid data refused. A well-formed key becomes a fresh one (still
    well-formed); a malformed one is kept, so the 400s stay under test."""
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if isinstance(key, str):
        try:
            check_key(key)
        except Problem:
            return
        headers["Idempotency-Key"] = str(uuid.uuid4())


def test_no_input_gives_a_500_and_every_answer_matches_the_description(served: Served) -> None:
    """Every operation, generated cases, schemathesis' default checks (no server error, status,
    media type, headers and body as described, valid data accepted, invalid data refused). Driven
    through its Python API: its pytest plugin does not load under this pytest."""
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 12
    for operation in operations:

        @given(case=operation.as_strategy())
        @hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            _fresh_key(case)
            # Every check on every case, but "valid data accepted" only where JSON Schema can tell.
            excluded = [] if _outside_cross_field_rules(case) else [positive_data_acceptance]
            case.call_and_validate(headers=served.auth(Role.ADMIN), excluded_checks=excluded)

        check()


def test_no_input_to_a_review_page_gives_a_500(served: Served) -> None:
    """The review pages are outside the public description, so they get one of their own, from the
    same routes (their path parameters: ids, numbers, actions), valid and not (2**64 among them),
    and are driven by a logged-in admin whose session and CSRF token go with every request: no
    generated id, number or action may make a page answer 500 (a job number of 2**64 once did,
    with an OverflowError)."""
    routes = [copy.copy(route) for route in served.page_routes]
    for route in routes:
        route.include_in_schema = True
    schema = schemathesis.openapi.from_dict(get_openapi(title="review pages", version="1", routes=routes))
    session = requests.Session()
    login = session.post(f"{served.url}/review/login", data={"name": PAGE_USER, "password": PAGE_PASSWORD},
                         allow_redirects=False)  # fmt: skip
    assert login.status_code == 303, login.text
    cookies = dict(session.cookies)
    page = session.get(f"{served.url}/review/jobs", allow_redirects=False)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf, page.status_code
    headers = {"X-CSRF-Token": csrf.group(1)}
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 20
    for operation in operations:
        if operation.path == "/review/logout":
            continue  # it would end the session the others are driven with (tested in tests/web)
        names = re.findall(r"{([a-z_]+)}", operation.path)
        edges = [operation.as_strategy(path_parameters=dict.fromkeys(names, edge)) for edge in EDGE_IDS] if names else []

        @given(case=st.one_of(operation.as_strategy(), operation.as_strategy(schemathesis.GenerationMode.NEGATIVE), *edges))
        @hypothesis_settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            response = case.call(base_url=served.url, headers=headers, cookies=cookies, allow_redirects=False)
            assert response.status_code < 500, (case.method, case.formatted_path, response.status_code)
            location = response.headers.get("location") or [""]  # schemathesis keeps each header's values in a list
            assert not str(location[0]).startswith("/review/login"), "the session was not sent"
            case.validate_response(response, checks=[not_a_server_error])

        check()


_ID = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,40}\Z")
_AMOUNT = st.integers(min_value=1, max_value=AMOUNT_MINOR_MAX)
_CURRENCY = st.sampled_from(sorted(MINOR_UNIT_DIGITS))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(string.printable, max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_PAYLOADS = {
    "transfer": st.fixed_dictionaries(
        {"transfer_id": _ID, "payer": _ID, "payee": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY},
        optional={"memo": st.text(max_size=256)},
    ).filter(lambda p: p["payer"] != p["payee"]),
    "list_update": st.fixed_dictionaries({
        "red_packet_id": _ID, "receiver": _ID, "version": st.integers(1, VERSION_MAX), "amount_minor": _AMOUNT,
        "currency": _CURRENCY}),
    "callback": st.fixed_dictionaries({
        "target": st.just(CALLBACK_TARGET),
        "body": st.dictionaries(st.text(max_size=8), _JSON, max_size=5)}),
}  # fmt: skip
_REF_KEYS = {  # what each kind's downstream takes (ledger/kinds.py REF_KEY_PATTERNS): a transfer's is an identifier
    "transfer": _ID,
    "list_update": st.text(st.characters(exclude_categories=["Cs", "Cc", "Cf", "Zl", "Zp"]), min_size=1, max_size=64),
}  # fmt: skip
_REF_KEYS["callback"] = _REF_KEYS["list_update"]
_SUBMISSIONS = st.sampled_from(sorted(_PAYLOADS)).flatmap(
    lambda kind: st.fixed_dictionaries({"kind": st.just(kind), "ref_key": _REF_KEYS[kind], "payload": _PAYLOADS[kind]})
)


@given(submission=_SUBMISSIONS)
@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_valid_submission_is_accepted_and_reads_back_equal(served: Served, submission: dict[str, Any]) -> None:
    key = uuid.uuid4()  # Hypothesis repeats what it draws; a repeated key with another body is a 422
    with httpx.Client(base_url=served.url, timeout=10) as client:
        created = client.post("/v1/requests", json=submission,
                              headers={**served.auth(Role.PRODUCER), "Idempotency-Key": str(key)})  # fmt: skip
        assert created.status_code == 201, created.text
        view = client.get(created.headers["location"], headers=served.auth(Role.PRODUCER)).json()
    assert view["kind"] == submission["kind"] and view["ref_key"] == submission["ref_key"]
    assert view["payload"] == submission["payload"]
    assert view["idempotency_key"] == str(key)


def test_the_event_loop_policy_is_untouched() -> None:
    """uvicorn in a thread must not have replaced the loop policy the other tests run on."""
    assert isinstance(asyncio.get_event_loop_policy(), asyncio.DefaultEventLoopPolicy)
