"""Logins, sessions and CSRF of the review pages, against a real store and the real app (two apps
on one store stand for two API processes: each has its own mirror of users and sessions)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from api_support import Api, running_api, transfer

from api.web.accounts import PASSWORDS, Accounts, session_name
from api.web.sessions import COOKIE, SEEN_WRITE_EVERY_MS, WebAuth, WebSettings
from queues import QueueClient, RaftClient, Role
from raft_store.testing.inprocess import StoreThread

PASSWORD = "correct horse battery"
SAME_ORIGIN = {"Origin": "http://api", "Sec-Fetch-Site": "same-origin"}


def web(api: Api) -> WebAuth:
    found = api.app.state.services.web
    assert isinstance(found, WebAuth)
    return found


async def add_user(api: Api, name: str = "alice", role: Role = Role.REVIEWER) -> None:
    await web(api).accounts.add(name, role, PASSWORD, actor="tests")


async def log_in(api: Api, name: str = "alice", password: str = PASSWORD, **extra: str) -> httpx.Response:
    return await api.client.post("/review/login", data={"name": name, "password": password, **extra},
                                 headers=SAME_ORIGIN)  # fmt: skip


async def logged_in(api: Api, session_id: str) -> bool:
    """Whether this app takes the session: its login page sends a logged-in user on (303)."""
    answer = await api.client.get("/review/login", headers={"Cookie": f"{COOKIE}={session_id}"})
    return answer.status_code == 303


async def within(seconds: float, condition: object) -> float:
    """How long until the coroutine function `condition` answered True (fails after `seconds`)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if await condition():  # type: ignore[operator]
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {seconds} s")


@asynccontextmanager
async def two_processes(store: StoreThread) -> AsyncIterator[tuple[Api, Api]]:
    async with running_api(store) as first, running_api(store) as second:
        yield first, second


async def test_login_sets_a_strict_cookie_and_logout_ends_the_session_in_every_process(store: StoreThread) -> None:
    async with two_processes(store) as (first, second):
        await add_user(first)
        answer = await log_in(first, next="/review/dead-letters?kind=transfer")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/review/dead-letters?kind=transfer"
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=")
        for attribute in ("HttpOnly", "Path=/", "SameSite=strict", "Max-Age=43200"):
            assert attribute in cookie
        assert "Secure" not in cookie  # the default, for make run on loopback
        session_id = first.client.cookies[COOKIE]
        # The store knows the session by its hash only.
        names = [d.name for d in (await first.queue.documents("sessions")).value.documents]
        assert names == [session_name(session_id)] and session_id not in str(names)
        assert await logged_in(second, session_id)  # created on the first process, known to the second at once

        user = await web(first).user_of(session_id)
        assert user is not None and (user.name, user.role) == ("alice", Role.REVIEWER)
        out = await first.client.post("/review/logout", data={"csrf_token": user.csrf_token}, headers=SAME_ORIGIN)
        assert out.status_code == 303 and out.headers["location"] == "/review/login"
        assert f'{COOKIE}=""' in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
        assert not await logged_in(first, session_id)
        took = await within(1.5, lambda: _not(logged_in(second, session_id)))
        assert took < 1.0 + 0.3  # one refresh interval (0.2 s in tests), with room for a loaded machine


async def _not(check: object) -> bool:
    return not await check  # type: ignore[misc]


async def test_the_secure_flag_is_configurable(store: StoreThread) -> None:
    async with running_api(store, web__cookie_secure="true") as api:
        await add_user(api)
        assert "Secure" in (await log_in(api)).headers["set-cookie"]


@asynccontextmanager
async def client_at(api: Api, address: str) -> AsyncIterator[httpx.AsyncClient]:
    """A browser at another client address."""
    transport = httpx.ASGITransport(app=api.app, client=(address, 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


async def attempt(client: httpx.AsyncClient, name: str = "alice", password: str = PASSWORD) -> httpx.Response:
    return await client.post("/review/login", data={"name": name, "password": password}, headers=SAME_ORIGIN)


async def test_failed_logins_look_alike_a_client_alone_cannot_lock_and_several_do(store: StoreThread) -> None:
    async with running_api(store) as api:
        await add_user(api)
        await add_user(api, "bob")
        await log_in(api, "alice", "a wrong password")  # the first argon2 runs warm the process
        timings = {}
        bodies = {}
        for case, name, password in (("wrong", "bob", "a wrong password"), ("unknown", "nobody", "a wrong password")):
            start = time.perf_counter()
            answer = await log_in(api, name, password)
            timings[case] = time.perf_counter() - start
            assert answer.status_code == 401 and COOKIE not in answer.headers.get("set-cookie", "")
            bodies[case] = answer.text.replace(f'value="{name}"', 'value="NAME"')
        assert bodies["wrong"] == bodies["unknown"]
        assert 0.4 < timings["unknown"] / timings["wrong"] < 2.5, timings  # both verify an argon2 hash

        for _ in range(2):  # with the one above: three in a row
            assert (await log_in(api, "alice", "a wrong password")).status_code == 401
        assert (await log_in(api)).status_code == 303  # a success resets the count (this client's too)
        for _ in range(4):  # one short of the lock: then this client is throttled, not the account locked
            assert (await log_in(api, "alice", "a wrong password")).status_code == 401
        throttled = await log_in(api)  # even with the right password: nothing is tried
        assert throttled.status_code == 429 and 60 <= int(throttled.headers["retry-after"]) <= 900, throttled.headers
        assert "Too many failed logins from your address" in throttled.text
        async with client_at(api, "192.0.2.7") as elsewhere:  # alice, from her own desk, is not locked out
            assert (await attempt(elsewhere)).status_code == 303
        assert (await web(api).accounts.logins())["alice"].locked_until_ms is None

        for address in ("198.51.100.1", "198.51.100.2"):  # a guess from several addresses locks the account
            async with client_at(api, address) as guesser:
                for _ in range(3 if address.endswith("1") else 2):
                    assert (await attempt(guesser, password="a wrong password")).status_code == 401
        async with client_at(api, "192.0.2.8") as desk:
            locked = await attempt(desk)
            assert locked.status_code == 401 and locked.text.replace('value="alice"', 'value="NAME"') == bodies["wrong"]
        record = (await web(api).accounts.logins())["alice"]
        assert record.locked_until_ms is not None and record.logins == 2
        assert await web(api).accounts.unlock("alice", actor="tests")  # an admin lifts the lock
        async with client_at(api, "192.0.2.8") as desk:
            assert (await attempt(desk)).status_code == 303

        audit = (await api.queue.audit_log(before=None, limit=1000)).value.entries
        reasons = [e.reason for e in audit if e.target == "document:logins/alice"]
        assert "login" in reasons and "failed login" in reasons and "failed login: locked now" in reasons
        assert "failed login: locked" in reasons and "unlocked by an admin" in reasons
        assert [e for e in audit if e.target == "document:logins/nobody" and e.reason == "failed login"]


async def test_one_address_spraying_many_accounts_is_throttled(store: StoreThread) -> None:
    async with running_api(store, web__client_failures_max="3") as api:
        for name in ("ann", "ben", "cid", "dan"):
            await add_user(api, name)
        for name in ("ann", "ben", "cid"):
            assert (await log_in(api, name, "a wrong password")).status_code == 401
        assert (await log_in(api, "dan")).status_code == 429  # refused before it is tried
        assert (await web(api).accounts.logins()).get("dan") is None  # and nothing written for it


async def test_the_lock_ends_by_itself_and_so_does_a_throttle(store: StoreThread) -> None:
    async with running_api(store, web__lockout_failures="2", web__lockout_s="1") as api:
        await add_user(api)
        async with client_at(api, "198.51.100.1") as one, client_at(api, "198.51.100.2") as two:
            for guesser in (one, two):
                assert (await attempt(guesser, password="a wrong password")).status_code == 401
            assert (await attempt(one)).status_code == 429
            assert (await log_in(api)).status_code == 401  # locked
            await asyncio.sleep(1.1)
            assert (await log_in(api)).status_code == 303
            assert (await attempt(one)).status_code == 303


async def test_disabling_a_user_or_changing_their_role_or_password_ends_their_sessions(store: StoreThread) -> None:
    """A disable or a role change is seen by the second process's very next request, though it polls
    only every 30 s here; a password change ends the sessions within a poll (the first's, 0.2 s)."""
    async with running_api(store) as first, running_api(store, auth__refresh_interval_s="30") as second:
        await add_user(first)
        accounts = web(first).accounts
        changes = (lambda: accounts.disable("alice", actor="tests", reason="left"),
                   lambda: accounts.set_role("alice", Role.APPROVER, actor="tests"),
                   lambda: accounts.set_password("alice", "another long password", actor="tests"))  # fmt: skip
        for change in changes:
            await accounts.enable("alice", actor="tests")
            password = PASSWORD if (await first.client.post("/review/login", data={"name": "alice", "password": PASSWORD},
                                                            headers=SAME_ORIGIN)).status_code == 303 else "another long password"  # fmt: skip
            first.client.cookies.clear()
            assert (await log_in(first, password=password)).status_code == 303
            session_id = first.client.cookies[COOKIE]
            first.client.cookies.clear()
            assert await logged_in(second, session_id)
            assert await change() >= 1
            if change is not changes[2]:  # a disable or a role change: the very next request sees it
                assert not await logged_in(second, session_id)
            await within(1.5, lambda sid=session_id: _not(logged_in(first, sid)))  # type: ignore[misc]
        assert (await log_in(first, password="another long password")).status_code == 303
        await accounts.disable("alice", actor="tests", reason="left")
        first.client.cookies.clear()
        assert (await log_in(first, password="another long password")).status_code == 401


async def test_idle_timeout_lifetime_and_the_minute_between_last_seen_writes(store: StoreThread) -> None:
    now = [1_800_000_000_000]
    queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
    auth = WebAuth(queue, WebSettings(idle_timeout_s=900, lifetime_s=3600), clock_ms=lambda: now[0])
    try:
        await Accounts(queue, clock_ms=lambda: now[0]).add("alice", Role.VIEWER, PASSWORD, actor="tests")
        found = await auth.login("alice", PASSWORD)
        assert found is not None
        session_id = found[0]
        version = (await queue.documents("sessions")).value.version
        now[0] += 30_000
        assert await auth.user_of(session_id) is not None
        assert (await queue.documents("sessions")).value.version == version  # within the minute: no write
        now[0] += SEEN_WRITE_EVERY_MS
        assert await auth.user_of(session_id) is not None
        assert (await queue.documents("sessions")).value.version == version + 1  # written back once
        now[0] += 899_000
        assert await auth.user_of(session_id) is not None  # 899 s idle
        now[0] += 900_000
        assert await auth.user_of(session_id) is None  # 900 s idle: ended, and deleted
        assert (await queue.documents("sessions")).value.documents == ()

        found = await auth.login("alice", PASSWORD)
        assert found is not None
        for _ in range(7):  # busy all along, yet the lifetime ends it
            now[0] += 500_000
            assert await auth.user_of(found[0]) is not None
        now[0] += 100_000
        assert await auth.user_of(found[0]) is None
    finally:
        await queue.raft.close()


async def test_csrf_and_origin_are_checked_and_a_refused_request_changes_nothing(store: StoreThread) -> None:
    async with running_api(store) as api:
        await add_user(api)
        assert (await log_in(api)).status_code == 303
        session_id = api.client.cookies[COOKIE]
        user = await web(api).user_of(session_id)
        assert user is not None
        before = (await api.queue.documents("sessions")).value
        refused = [
            ({}, SAME_ORIGIN),
            ({"csrf_token": "not-the-token"}, SAME_ORIGIN),
            ({"csrf_token": user.csrf_token + "x"}, SAME_ORIGIN),
            ({"csrf_token": user.csrf_token}, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}),
            ({"csrf_token": user.csrf_token}, {"Origin": "http://evil.example"}),
            ({"csrf_token": user.csrf_token}, {"Sec-Fetch-Site": "same-site"}),
            ({"csrf_token": user.csrf_token}, {"Origin": "null"}),
        ]
        for data, headers in refused:
            answer = await api.client.post("/review/logout", data=data, headers=headers)
            assert answer.status_code == 403, (data, headers)
            assert 'data-test="forbidden"' in answer.text and "Nothing was changed" in answer.text
        wrong_header = await api.client.post("/review/logout", headers={"X-CSRF-Token": "nope", **SAME_ORIGIN})
        assert wrong_header.status_code == 403
        after = (await api.queue.documents("sessions")).value
        assert after.version == before.version and after.documents == before.documents  # still logged in
        assert await logged_in(api, session_id)
        # htmx sends the token in its header; a browser without Origin (an old one) still needs the token.
        done = await api.client.post("/review/logout", headers={"X-CSRF-Token": user.csrf_token, "HX-Request": "true"})
        assert done.status_code == 303
        assert not await logged_in(api, session_id)


async def test_a_login_from_another_site_and_a_redirect_to_another_site_are_refused(store: StoreThread) -> None:
    async with running_api(store) as api:
        await add_user(api)
        foreign = await api.client.post("/review/login", data={"name": "alice", "password": PASSWORD},
                                        headers={"Origin": "http://evil.example"})  # fmt: skip
        assert foreign.status_code == 403 and COOKIE not in foreign.headers.get("set-cookie", "")
        for target in ("//evil.example/x", "http://evil.example/", "https:evil", "/\\evil.example", "review"):
            api.client.cookies.clear()
            answer = await log_in(api, next=target)
            assert answer.status_code == 303 and answer.headers["location"] == "/review", target


async def test_no_session_sends_pages_to_the_login_and_htmx_gets_hx_redirect(store: StoreThread) -> None:
    async with running_api(store) as api:
        page = await api.client.post("/review/logout", data={"csrf_token": "x"})
        assert page.status_code == 303 and page.headers["location"] == "/review/login?next=/review/logout"
        fragment = await api.client.post("/review/logout", headers={
            "HX-Request": "true", "HX-Current-URL": "http://api/review/dead-letters?kind=transfer"})  # fmt: skip
        assert fragment.status_code == 401
        assert fragment.headers["hx-redirect"] == "/review/login?next=/review/dead-letters%3Fkind%3Dtransfer"
        stale = await api.client.post("/review/logout", headers={"Cookie": f"{COOKIE}=no-such-session"})
        assert stale.status_code == 303 and f'{COOKIE}=""' in stale.headers["set-cookie"]
        form = await api.client.get("/review/login?next=/review/jobs")
        assert form.status_code == 200 and 'name="next" value="/review/jobs"' in form.text
        assert form.headers["cache-control"] == "no-store"


async def test_no_password_or_hash_in_logs_the_audit_chain_or_events(store: StoreThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_api(store) as api:
        await add_user(api)
        await log_in(api, "alice", "a wrong password")
        assert (await log_in(api)).status_code == 303
        session_id = api.client.cookies[COOKIE]
        await web(api).accounts.set_password("alice", "another long password", actor="tests")
        (stored,) = (await api.queue.documents(PASSWORDS)).value.documents
        encoded = stored.body.decode().split('"argon2":"')[1].split('"')[0]
        assert encoded.startswith("$argon2id$")
        audit = (await api.queue.audit_log(before=None, limit=1000)).value.entries
        chain = " ".join(f"{e.before} {e.after} {e.reason}" for e in audit)
        events = str((await api.queue.events_after(0, limit=1000)).value)
        secrets = (PASSWORD, "a wrong password", "another long password", encoded, encoded.rsplit("$", 1)[1], session_id)
        for secret in secrets:
            assert secret not in caplog.text and secret not in chain and secret not in events
        assert any(e.target == "document:passwords/alice" and '"body":"sha256:' in e.after for e in audit)
        assert any(e.target == "document:users/alice" and '\\"role\\":\\"reviewer\\"' in e.after for e in audit)


async def test_a_viewer_token_reads_payloads_masked(store: StoreThread) -> None:
    async with running_api(store) as api:
        body = transfer("mask")
        body["payload"].update(payer="6222020200112233", payee="6222020200445566", memo="for Zhang Wei")
        created = await api.client.post("/v1/requests", json=body, headers={**api.auth(), "Idempotency-Key": "mask"})
        request_id = created.json()["id"]
        full = (await api.client.get(f"/v1/requests/{request_id}", headers=api.auth(Role.OPERATOR))).json()
        assert full["payload"]["payer"] == "6222020200112233"
        masked = (await api.client.get(f"/v1/requests/{request_id}", headers=api.auth(Role.VIEWER))).json()
        assert masked["payload"] == {**full["payload"], "payer": "****2233", "payee": "****5566", "memo": "****"}
        assert {k: v for k, v in masked.items() if k != "payload"} == {k: v for k, v in full.items() if k != "payload"}
        letters = await api.client.get("/v1/review/dead-letters", headers=api.auth(Role.VIEWER))
        assert letters.status_code == 200 and "6222020200112233" not in letters.text
        refused = await api.client.post("/v1/review/redrive", json={"ids": [request_id], "reason": "x"},
                                        headers=api.auth(Role.VIEWER))  # fmt: skip
        assert refused.status_code == 403
