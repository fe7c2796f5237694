"""The stand-ins' HTTP contract, spoken to with a plain HTTP client: what each answers, what it
writes to its ledger, and each fault mode, including the dangerous one (applied, then no answer)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from handlers_support import SECRETS, WITHHOLD_MS, Standins

from handlers.signing import sign

TRANSFER: dict[str, Any] = {"transfer_id": "t/1:a", "payer": "escrow", "payee": "u-1", "amount_minor": 888,
                            "currency": "CNY", "business_id": "grant-1"}  # fmt: skip


async def post_transfer(client: httpx.AsyncClient, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key if key is not None else body["transfer_id"]}
    return await client.post("/transfers", json=body, headers=headers)


async def test_a_transfer_is_made_once_replayed_the_same_and_refused_with_other_content(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
        created = await post_transfer(client, TRANSFER)
        replayed = await post_transfer(client, dict(reversed(list(TRANSFER.items()))))  # other key order, same body
        conflict = await post_transfer(client, {**TRANSFER, "amount_minor": 889})
        found = await client.get("/transfers/t%2F1:a")
        missing = await client.get("/transfers/t-2")
        mismatched_key = await post_transfer(client, {**TRANSFER, "transfer_id": "t-3"}, key="t-4")
        invalid = await post_transfer(client, {**TRANSFER, "transfer_id": "t-5", "amount_minor": "5"})
        closed = await post_transfer(client, {**TRANSFER, "transfer_id": "t-6", "payer": "closed-77"})
    assert (created.status_code, replayed.status_code, conflict.status_code) == (201, 200, 409)
    made = created.json()
    assert made == {**TRANSFER, "payment_id": made["payment_id"], "status": "SUCCEEDED", "created_at": made["created_at"]}
    assert made["payment_id"].startswith("pay-")
    assert replayed.json() == created.json() == found.json()
    assert conflict.json() == {"code": "idempotency_conflict"}
    assert (missing.status_code, missing.json()) == (404, {"code": "not_found"})
    assert (mismatched_key.status_code, mismatched_key.json()) == (400, {"code": "idempotency_key_mismatch"})
    assert (invalid.status_code, invalid.json()) == (400, {"code": "invalid_request"})
    assert (closed.status_code, closed.json()) == (422, {"code": "account_closed"})
    rows = await standins.rows("SELECT transfer_id, business_id, payer, payee, amount_minor, currency, status"
                               " FROM payment_transfers")  # fmt: skip
    assert rows == [{**{k: v for k, v in TRANSFER.items()}, "status": "SUCCEEDED"}]
    stats = await standins.stats("payment")
    assert (stats["requests"], stats["applied"], stats["repeats"]) == (8, 1, 1)
    assert stats["by_outcome"] == {"account_closed": 1, "created": 1, "found": 1, "idempotency_conflict": 1,
                                   "idempotency_key_mismatch": 1, "invalid_request": 1, "not_found": 1,
                                   "replayed": 1}  # fmt: skip


async def test_insufficient_funds_is_drawn_at_the_permanent_rate_but_a_replay_is_still_answered(
    standins: Standins,
) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
        assert (await post_transfer(client, TRANSFER)).status_code == 201
        await standins.faults("payment", permanent_rate=1.0)
        refused = await post_transfer(client, {**TRANSFER, "transfer_id": "t-2"})
        replayed = await post_transfer(client, TRANSFER)
    assert (refused.status_code, refused.json()) == (422, {"code": "insufficient_funds"})
    assert replayed.status_code == 200
    assert await standins.rows("SELECT transfer_id FROM payment_transfers") == [{"transfer_id": "t/1:a"}]


async def put_receiver(client: httpx.AsyncClient, version: int, amount_minor: int = 100) -> httpx.Response:
    return await client.put("/red-packets/rp%2F1/receivers/u-1", headers={"Idempotency-Key": f"k-{version}"},
                            json={"version": version, "amount_minor": amount_minor, "currency": "CNY"})  # fmt: skip


async def test_a_receive_list_only_moves_to_a_newer_version(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["red_packet"]) as client:
        answers = [await put_receiver(client, 2), await put_receiver(client, 2), await put_receiver(client, 1),
                   await put_receiver(client, 2, amount_minor=999), await put_receiver(client, 3, amount_minor=300)]  # fmt: skip
        no_key = await client.put("/red-packets/rp/receivers/u-1", json={"version": 9, "amount_minor": 1, "currency": "CNY"})
        listed = await client.get("/red-packets/rp%2F1/receivers")
    assert [(a.status_code, a.json()) for a in answers] == [
        (200, {"applied": True, "version": 2, "repeat": False}),
        (200, {"applied": True, "version": 2, "repeat": True}),
        (409, {"code": "stale_version", "current_version": 2}),
        (409, {"code": "version_conflict", "current_version": 2}),
        (200, {"applied": True, "version": 3, "repeat": False}),
    ]
    assert (no_key.status_code, no_key.json()) == (400, {"code": "missing_idempotency_key"})
    assert listed.json() == {"receivers": [{"receiver": "u-1", "version": 3, "amount_minor": 300, "currency": "CNY"}]}
    history = await standins.rows("SELECT version, idempotency_key FROM red_packet_versions ORDER BY seq")
    assert history == [{"version": 2, "idempotency_key": "k-2"}, {"version": 3, "idempotency_key": "k-3"}]
    grants = await standins.rows("SELECT grant_id, red_packet_id, recipient, amount_minor, currency, state"
                                 " FROM red_packet_grants")  # fmt: skip
    assert grants == [{"grant_id": "rp/1:u-1", "red_packet_id": "rp/1", "recipient": "u-1", "amount_minor": 300,
                       "currency": "CNY", "state": "GRANTED"}]  # fmt: skip


def signed(body: bytes, *, target: str = "merchant-a", at_s: int | None = None, key: str = "cb-1") -> dict[str, str]:
    timestamp_s = int(time.time()) if at_s is None else at_s
    return {"Webhook-Signature": sign(SECRETS[target], timestamp_s=timestamp_s, body=body), "Idempotency-Key": key,
            "Content-Type": "application/json"}  # fmt: skip


async def test_the_callback_receiver_checks_signatures_and_counts_repeats(standins: Standins) -> None:
    body = b'{"order":"o-1","paid":true}'
    async with httpx.AsyncClient(base_url=standins.urls["callback"]) as client:
        first = await client.post("/callbacks/merchant-a", content=body, headers=signed(body))
        again = await client.post("/callbacks/merchant-a", content=body, headers=signed(body))
        tampered = await client.post("/callbacks/merchant-a", content=body.replace(b"true", b"false"), headers=signed(body))
        other_secret = await client.post("/callbacks/merchant-a", content=body, headers=signed(body, target="merchant-b"))
        stale = await client.post("/callbacks/merchant-a", content=body, headers=signed(body, at_s=int(time.time()) - 301))
        unsigned = await client.post("/callbacks/merchant-a", content=body, headers={"Idempotency-Key": "cb-1"})
        unknown = await client.post("/callbacks/merchant-z", content=body, headers=signed(body))
        other_body = b'{"order":"o-2"}'
        reused_key = await client.post("/callbacks/merchant-a", content=other_body, headers=signed(other_body))
    assert [(r.status_code, r.json()) for r in (first, again)] == [
        (200, {"received": True, "repeat": False}), (200, {"received": True, "repeat": True})]
    assert [(r.status_code, r.json()["code"]) for r in (tampered, other_secret, stale, unsigned, unknown, reused_key)] == [
        (401, "bad_signature"), (401, "bad_signature"), (401, "stale_signature"), (401, "missing_signature"),
        (404, "unknown_target"), (409, "idempotency_conflict")]  # fmt: skip
    assert await standins.rows("SELECT target, idempotency_key, count FROM callback_deliveries") == [
        {"target": "merchant-a", "idempotency_key": "cb-1", "count": 2}]
    stats = await standins.stats("callback")
    assert (stats["applied"], stats["repeats"]) == (1, 1)


async def test_each_fault_mode(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["payment"], timeout=httpx.Timeout(2.0, read=0.5)) as client:
        await standins.faults("payment", error_rate=1.0)
        unavailable = await post_transfer(client, TRANSFER)
        await standins.faults("payment", throttle_rate=1.0, retry_after_s=3)
        throttled = await post_transfer(client, TRANSFER)
        view = await standins.faults("payment", outage_s=0.6)
        in_outage = await client.get("/transfers/t-9")
        await asyncio.sleep(0.65)
        after_outage = await client.get("/transfers/t-9")
        await standins.faults("payment", latency_ms=200)
        started = time.monotonic()
        slow = await client.get("/transfers/t-9")
        slow_s = time.monotonic() - started
        await standins.faults("payment", apply_then_timeout_rate=1.0, withhold_ms=WITHHOLD_MS)
        with pytest.raises(httpx.ReadTimeout):
            await post_transfer(client, TRANSFER)
        await standins.faults("payment", apply_then_drop_rate=1.0)
        with pytest.raises(httpx.RemoteProtocolError):
            await post_transfer(client, {**TRANSFER, "transfer_id": "t-2"})
        await standins.faults("payment")
        replayed = await post_transfer(client, TRANSFER)
    assert (unavailable.status_code, unavailable.json()) == (503, {"code": "unavailable"})
    assert (throttled.status_code, throttled.json(), throttled.headers["retry-after"]) == (429, {"code": "rate_limited"}, "3")
    assert 0.0 < view["outage_remaining_s"] <= 0.6
    assert (in_outage.status_code, in_outage.json(), after_outage.status_code) == (503, {"code": "outage"}, 404)
    assert slow.status_code == 404 and slow_s >= 0.2
    assert replayed.status_code == 200  # the withheld transfer had been made
    rows = await standins.rows("SELECT transfer_id FROM payment_transfers ORDER BY transfer_id")
    assert rows == [{"transfer_id": "t-2"}, {"transfer_id": "t/1:a"}]  # both faults applied before failing
    stats = await standins.stats("payment")
    assert stats["faults"] == {"dropped": 1, "withheld": 1}
    assert stats["applied"] == 2 and stats["by_outcome"]["outage"] == 1


async def test_fault_settings_are_validated_and_a_seed_replays_the_same_draws(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["red_packet"]) as client:
        refused = [await client.put("/_faults", json=document) for document in (
            {"error_rate": 2}, {"colour": "red"}, {"apply_then_timeout_rate": 0.6, "apply_then_drop_rate": 0.6},
            {"latency_ms": "5"})]  # fmt: skip
        runs = []
        for _ in range(2):
            await standins.faults("red_packet", error_rate=0.5, seed=11)
            runs.append([(await client.get("/red-packets/rp/receivers")).status_code for _ in range(16)])
        current = (await client.get("/_faults")).json()
    assert [r.status_code for r in refused] == [422, 422, 422, 422]
    assert [r.json()["code"] for r in refused] == ["invalid_faults"] * 4
    assert runs[0] == runs[1] and set(runs[0]) == {200, 503}
    assert current["error_rate"] == 0.5 and current["seed"] == 11


async def test_a_patch_changes_only_the_settings_it_names_and_an_outage_only_when_named(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
        await client.put("/_faults", json={"permanent_rate": 1.0})
        outage = (await client.patch("/_faults", json={"outage_s": 0.5})).json()
        in_outage = await post_transfer(client, {**TRANSFER, "transfer_id": "p-1"})
        refused = [await client.patch("/_faults", json=document) for document in (
            {"error_rate": 2}, {"colour": "red"}, ["outage_s"], {"apply_then_timeout_rate": 0.6, "apply_then_drop_rate": 0.6})]  # fmt: skip
        unchanged = (await client.get("/_faults")).json()
        still_out = (await client.patch("/_faults", json={"latency_ms": 1})).json()  # the outage goes on
        await asyncio.sleep(max(0.0, still_out["outage_remaining_s"]) + 0.05)
        refused_after = await post_transfer(client, {**TRANSFER, "transfer_id": "p-1"})
        healthy = (await client.patch("/_faults", json={"permanent_rate": None, "latency_ms": None})).json()
        paid = await post_transfer(client, {**TRANSFER, "transfer_id": "p-1"})
    assert (outage["permanent_rate"], outage["outage_s"]) == (1.0, 0.5) and 0.0 < outage["outage_remaining_s"] <= 0.5
    assert (in_outage.status_code, in_outage.json()) == (503, {"code": "outage"})
    assert [(r.status_code, r.json()["code"]) for r in refused] == [(422, "invalid_faults")] * 4
    assert unchanged == {**unchanged, "permanent_rate": 1.0, "latency_ms": 0, "error_rate": 0.0}
    assert 0.0 < still_out["outage_remaining_s"] <= outage["outage_remaining_s"]
    assert (refused_after.status_code, refused_after.json()) == (422, {"code": "insufficient_funds"})
    assert (healthy["permanent_rate"], healthy["latency_ms"], healthy["outage_s"]) == (0.0, 0, 0.5)
    assert paid.status_code == 201


async def test_the_ledgers_have_the_shape_the_reconciliation_reads(standins: Standins) -> None:
    from ledger.upstream import UPSTREAM_DDL

    connection_rows = await standins.rows("SELECT 1 AS ok")  # the stand-ins created their tables at start
    assert connection_rows == [{"ok": 1}]
    import asyncpg

    connection = await asyncpg.connect(standins.dsn)
    try:
        await connection.execute("CREATE SCHEMA reconcile")
        await connection.execute("SET search_path TO reconcile")
        await connection.execute(UPSTREAM_DDL)
        columns = await connection.fetch(
            "SELECT table_schema, table_name, column_name, data_type, is_nullable, ordinal_position"
            " FROM information_schema.columns WHERE table_name IN ('payment_transfers', 'red_packet_grants')"
            " ORDER BY table_name, ordinal_position"
        )
        keys = await connection.fetch(
            "SELECT tc.table_schema, tc.table_name, kcu.column_name FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu USING (constraint_schema, constraint_name)"
            " WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_name IN ('payment_transfers', 'red_packet_grants')"
        )
    finally:
        await connection.close()
    by_schema: dict[str, list[tuple[Any, ...]]] = {"public": [], "reconcile": []}
    for row in columns:
        by_schema[row["table_schema"]].append(tuple(row)[1:])
    assert by_schema["public"] == by_schema["reconcile"] and len(by_schema["public"]) == 16
    assert sorted(tuple(k)[1:] for k in keys if k[0] == "public") == sorted(tuple(k)[1:] for k in keys if k[0] == "reconcile")


# ---- the payment system's modes: no deduplication, enforced expiry ----------------------------------


def _stamp(unix_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def test_without_dedup_every_post_is_a_new_payment_and_the_lookup_finds_the_first(database: str) -> None:
    from handlers_support import running_standins

    with running_standins(database, payment_dedup=False) as standins:
        async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
            first = await post_transfer(client, TRANSFER)
            second = await post_transfer(client, TRANSFER)
            other = await post_transfer(client, {**TRANSFER, "amount_minor": 1})  # no conflict: a payment too
            found = await client.get("/transfers/t%2F1:a")
        rows = await standins.rows("SELECT payment_id, transfer_id, amount_minor FROM payment_transfers"
                                   " ORDER BY created_at")  # fmt: skip
        stats = await standins.stats("payment")
    assert (first.status_code, second.status_code, other.status_code) == (201, 201, 201)
    assert len({first.json()["payment_id"], second.json()["payment_id"], other.json()["payment_id"]}) == 3
    assert [(r["transfer_id"], r["amount_minor"]) for r in rows] == [("t/1:a", 888), ("t/1:a", 888), ("t/1:a", 1)]
    assert found.json() == first.json()
    assert (stats["applied"], stats["repeats"], stats["by_outcome"]) == (3, 0, {"created": 1, "paid_again": 2,
                                                                                 "found": 1})  # fmt: skip


async def test_an_enforced_expiry_refuses_a_late_request_and_writes_nothing(database: str) -> None:
    from handlers_support import running_standins

    with running_standins(database, payment_expiry=True) as standins:
        async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
            late = await post_transfer(client, {**TRANSFER, "expires_at": _stamp(time.time() - 0.001)})
            late_header = await client.post("/transfers", json=TRANSFER, headers={
                "Idempotency-Key": TRANSFER["transfer_id"], "Expires-At": _stamp(time.time() - 5)})  # fmt: skip
            soon = _stamp(time.time() + 30)
            disagree = await client.post("/transfers", json={**TRANSFER, "expires_at": soon}, headers={
                "Idempotency-Key": TRANSFER["transfer_id"], "Expires-At": _stamp(time.time() + 31)})  # fmt: skip
            in_time = await client.post("/transfers", json={**TRANSFER, "expires_at": soon}, headers={
                "Idempotency-Key": TRANSFER["transfer_id"], "Expires-At": soon})  # fmt: skip
            replay = await post_transfer(client, {**TRANSFER, "expires_at": _stamp(time.time() + 60)})
            unbounded = await post_transfer(client, {**TRANSFER, "transfer_id": "t-2"})
        paid = await standins.rows("SELECT transfer_id FROM payment_transfers ORDER BY transfer_id")
    assert (late.status_code, late.json()) == (422, {"code": "request_expired"})
    assert (late_header.status_code, late_header.json()) == (422, {"code": "request_expired"})
    assert (disagree.status_code, disagree.json()) == (400, {"code": "expires_at_mismatch"})
    assert (in_time.status_code, replay.status_code, unbounded.status_code) == (201, 200, 201)
    assert "expires_at" not in in_time.json()  # the expiry is the request's, not the transfer's
    assert paid == [{"transfer_id": "t-2"}, {"transfer_id": "t/1:a"}]


async def test_an_ignored_expiry_is_read_and_ignored(standins: Standins) -> None:
    async with httpx.AsyncClient(base_url=standins.urls["payment"]) as client:
        late = await post_transfer(client, {**TRANSFER, "expires_at": _stamp(time.time() - 60)})
    assert late.status_code == 201


async def test_a_callback_receiver_without_dedup_takes_every_delivery_as_new(database: str) -> None:
    from handlers_support import running_standins

    body = b'{"event":"x"}'
    with running_standins(database, callback_dedup=False) as standins:
        async with httpx.AsyncClient(base_url=standins.urls["callback"]) as client:
            answers = []
            for _ in range(2):
                signature = sign(SECRETS["merchant-a"], timestamp_s=int(time.time()), body=body)
                answers.append(await client.post("/callbacks/merchant-a", content=body, headers={
                    "Webhook-Signature": signature, "Idempotency-Key": "k-1", "Content-Type": "application/json"}))
        rows = await standins.rows("SELECT count FROM callback_deliveries")
    assert [a.json() for a in answers] == [{"received": True, "repeat": False}] * 2
    assert rows == [{"count": 2}]


async def test_a_payment_ledger_keyed_by_transfer_id_gets_payment_ids_in_place(database: str) -> None:
    """A stand-in database from before payments had ids of their own (make run's, kept between runs)."""
    import asyncpg

    from handlers.standins.payment import DDL

    connection = await asyncpg.connect(database)
    try:
        await connection.execute(
            "CREATE TABLE payment_transfers (transfer_id text PRIMARY KEY, business_id text, payer text, payee text,"
            " amount_minor bigint NOT NULL, currency text NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL);"
            " CREATE TABLE payment_transfer_requests (transfer_id text PRIMARY KEY, request_sha256 bytea NOT NULL,"
            " request jsonb NOT NULL);"
            " INSERT INTO payment_transfers VALUES ('t-1', 'g-1', 'a', 'b', 5, 'CNY', 'SUCCEEDED', now());"
            " INSERT INTO payment_transfer_requests VALUES ('t-1', '\\x00', '{}')"
        )  # fmt: skip
        for _ in range(2):  # each stand-in start runs it; the second finds nothing to do
            await connection.execute(DDL)
        await connection.execute("INSERT INTO payment_transfers (transfer_id, amount_minor, currency, status, created_at)"
                                 " VALUES ('t-1', 5, 'CNY', 'SUCCEEDED', now())")  # fmt: skip
        rows = await connection.fetch("SELECT payment_id, transfer_id FROM payment_transfers ORDER BY created_at")
        requests = await connection.fetch("SELECT payment_id, transfer_id FROM payment_transfer_requests")
    finally:
        await connection.close()
    assert tuple(rows[0]) == ("pay-t-1", "t-1") and rows[1]["payment_id"].startswith("pay-")
    assert [tuple(r) for r in requests] == [("pay-t-1", "t-1")]
