"""The producers' outbox against a real PostgreSQL (the producer's) and the real API over HTTP.

What is checked: rows added while the API is down stay pending (and the relay keeps probing, not
dropping), and once the API is back every one arrives exactly once (one stored request per key);
a row the API refuses is kept as rejected with its problem, counted, and blocks nothing; two relays
at once send each row once (SKIP LOCKED); a row sent again (a relay that died before it marked it)
is answered as a replay and stored once; adding is transactional and idempotent by key.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter

import asyncpg
import pytest
from outbox_support import PRODUCER, ApiServer, empty_database, enqueued_keys, producer_token, rows, transfer

import outbox
from ledger import pg
from raft_store.testing.inprocess import StoreThread

FAST = outbox.RelaySettings(batch_max=10, concurrency=4, poll_interval_s=0.05, http_timeout_s=5,
                            backoff_min_s=0.05, backoff_max_s=0.3)  # fmt: skip
DEADLINE_S = 60.0


async def add_all(dsn: str, requests: list[outbox.OutboxRequest]) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            for request in requests:
                assert await outbox.add(connection, request)
    finally:
        await connection.close()


async def wait_until(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def outbox_status(pool: asyncpg.Pool) -> outbox.OutboxStatus:
    async with pool.acquire() as connection:
        return await outbox.status(connection)


async def test_rows_wait_while_the_api_is_down_and_all_arrive_once_when_it_is_back(
    producer_dsn: str, store: StoreThread, api: ApiServer
) -> None:
    requests = [transfer(n) for n in range(40)]
    await add_all(producer_dsn, requests)
    async with producer_token(store) as token, asyncpg.create_pool(producer_dsn, min_size=1, max_size=2) as pool:
        target = outbox.ApiTarget(url=api.url, token=token)
        async with outbox.Relay(pool, target, FAST, rng=random.Random(1)) as relay:
            stop = asyncio.Event()
            running = asyncio.create_task(relay.run(stop))
            await wait_until(lambda: _retried_at_least(relay, 3), "the relay to probe the absent API three times")
            pending = await outbox_status(pool)
            assert (pending.pending, pending.sent, pending.rejected) == (40, 0, 0)
            assert relay.metrics.pending._value.get() == 40
            assert relay.metrics.oldest_pending_age._value.get() > 0
            await api.up()
            await wait_until(lambda: _all_sent(pool, 40), "every row to be sent")
            stop.set()
            await running
            assert relay.metrics.pending._value.get() == 0
    stored = await enqueued_keys(store)
    assert sorted(stored) == sorted(f"{PRODUCER}:{r.key}" for r in requests)  # each once, none lost
    table = await rows(producer_dsn)
    assert {row["state"] for row in table} == {"sent"}
    assert {row["response_status"] for row in table} == {201}
    assert len({row["request_id"] for row in table}) == 40
    assert max(row["attempts"] for row in table) >= 2  # the first rows were tried while the API was down


async def _retried_at_least(relay: outbox.Relay, count: int) -> bool:
    return relay.metrics.retries.labels("no_answer")._value.get() >= count


async def _all_sent(pool: asyncpg.Pool, count: int) -> bool:
    found = await outbox_status(pool)
    return found.sent == count and found.pending == 0


async def test_a_refused_request_is_rejected_with_its_problem_and_blocks_nothing(
    producer_dsn: str, store: StoreThread, api: ApiServer
) -> None:
    bad = transfer(2, amount_minor=-5)
    await add_all(producer_dsn, [transfer(1), bad, transfer(3)])
    await api.up()
    async with producer_token(store) as token, asyncpg.create_pool(producer_dsn, min_size=1, max_size=2) as pool:
        async with outbox.Relay(pool, outbox.ApiTarget(url=api.url, token=token), FAST) as relay:
            result = await relay.drain()
            assert (result.sent, result.rejected, result.retried) == (2, 1, 0)
            assert relay.metrics.rejected.labels("422")._value.get() == 1
            assert (await relay.drain()).claimed == 0  # never sent again
        assert await outbox_status(pool) == outbox.OutboxStatus(pending=0, sent=2, rejected=1, oldest_pending_age_s=0)
    rejected = [row for row in await rows(producer_dsn) if row["state"] == "rejected"]
    assert [row["idempotency_key"] for row in rejected] == [bad.key]
    problem = json.loads(rejected[0]["problem"])
    assert problem["type"] == "/problems/invalid-request"
    assert "payload.amount_minor" in json.dumps(problem["errors"])
    assert sorted(await enqueued_keys(store)) == [f"{PRODUCER}:grant-1", f"{PRODUCER}:grant-3"]


async def test_a_wrong_token_rejects_nothing(producer_dsn: str, store: StoreThread, api: ApiServer) -> None:
    await add_all(producer_dsn, [transfer(1)])
    await api.up()
    async with asyncpg.create_pool(producer_dsn, min_size=1, max_size=2) as pool:
        target = outbox.ApiTarget(url=api.url, token="cmp_not-a-token")
        async with outbox.Relay(pool, target, FAST) as relay:
            result = await relay.drain()
            assert (result.sent, result.rejected, result.retried) == (0, 0, 1)
            assert relay.metrics.retries.labels("relay_misconfigured")._value.get() == 1
        assert (await outbox_status(pool)).pending == 1


async def test_two_relays_send_each_row_once(producer_dsn: str, store: StoreThread, api: ApiServer) -> None:
    requests = [transfer(n) for n in range(60)]
    await add_all(producer_dsn, requests)
    await api.up()
    settings = outbox.RelaySettings(batch_max=5, concurrency=2, poll_interval_s=0.05)
    async with producer_token(store) as token, asyncpg.create_pool(producer_dsn, min_size=2, max_size=4) as pool:
        target = outbox.ApiTarget(url=api.url, token=token)
        async with outbox.Relay(pool, target, settings) as first, outbox.Relay(pool, target, settings) as second:
            results = await asyncio.gather(first.drain(), second.drain())
    assert sum(r.sent for r in results) == 60
    assert all(r.sent > 0 for r in results), results  # both worked, on different rows
    table = await rows(producer_dsn)
    assert Counter(row["response_status"] for row in table) == {201: 60}  # no row was sent twice
    assert Counter(await enqueued_keys(store)) == Counter(f"{PRODUCER}:{r.key}" for r in requests)


async def test_a_row_sent_again_is_a_replay_and_stored_once(
    producer_dsn: str, store: StoreThread, api: ApiServer
) -> None:
    await add_all(producer_dsn, [transfer(1)])
    await api.up()
    async with (
        producer_token(store) as token,
        asyncpg.create_pool(producer_dsn, min_size=1, max_size=2) as pool,
        outbox.Relay(pool, outbox.ApiTarget(url=api.url, token=token), FAST) as relay,
    ):
        assert (await relay.drain()).sent == 1
        first_id = (await rows(producer_dsn))[0]["request_id"]
        async with pool.acquire() as connection:  # as if the relay died after the POST, before its commit
            await connection.execute(
                f"UPDATE {outbox.DEFAULT_TABLE} SET state = 'pending', finished_at = NULL, request_id = NULL"
            )
        assert (await relay.drain()).sent == 1
    (row,) = await rows(producer_dsn)
    assert (row["state"], row["response_status"], row["request_id"]) == ("sent", 200, first_id)
    assert await enqueued_keys(store) == [f"{PRODUCER}:grant-1"]


async def test_adding_is_transactional_and_idempotent_by_key(producer_dsn: str) -> None:
    connection = await asyncpg.connect(producer_dsn)
    try:
        with pytest.raises(RuntimeError):
            async with connection.transaction():
                await outbox.add(connection, transfer(1))
                raise RuntimeError("the producer's own change failed")
        assert await rows(producer_dsn) == []
        assert await outbox.add(connection, transfer(1))
        assert not await outbox.add(connection, transfer(1))  # the same request again: nothing new
        with pytest.raises(outbox.OutboxConflict):
            await outbox.add(connection, transfer(1, amount_minor=7))
    finally:
        await connection.close()
    assert [row["idempotency_key"] for row in await rows(producer_dsn)] == ["grant-1"]


async def test_relays_installing_the_table_at_once_all_succeed(postgres: pg.EmbeddedPostgres) -> None:
    """Several relays started with --install-table on a new database: `CREATE ... IF NOT EXISTS`
    collides with itself in PostgreSQL (pg_type's unique index), so install takes a lock first."""
    for _ in range(3):
        dsn = await empty_database(postgres)
        connections = [await asyncpg.connect(dsn) for _ in range(6)]
        try:
            await asyncio.gather(*(outbox.install(connection) for connection in connections))
            assert await outbox.schema.exists(connections[0])
        finally:
            for connection in connections:
                await connection.close()
