"""`compensator project` as a process: killed with SIGKILL in the middle of its batch transactions,
several times, while traffic flows, it leaves no row twice and misses no event (the ledger equals
the store at the end); SIGTERM stops it cleanly; a gap is one line on stderr and exit 1."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from projector_support import SET_ID, Traffic, assert_ledger_matches_store, ledger_rows

from queues import QueueClient
from raft_store.testing.inprocess import StoreThread

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KILLS = 4

_SLOW_ATTEMPTS = """
CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$;
CREATE TRIGGER slow_down AFTER INSERT OR UPDATE ON compensation_attempts FOR EACH ROW EXECUTE FUNCTION slow_down();
"""
"""Each batch transaction takes tens of milliseconds, so a kill lands inside one."""
_IN_TRANSACTION = """
SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
    AND backend_type = 'client backend' AND xact_start IS NOT NULL AND query LIKE '%compensation_attempts%'"""


def environment(store: StoreThread, dsn: str, **settings: str) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    environ.update({"COMPENSATOR_PG_DSN": dsn, **store.service_settings(),
                    "COMPENSATOR_STORE__DEADLINE_S": "3", "COMPENSATOR_PROJECTOR__BATCH_MAX": "20",
                    "COMPENSATOR_PROJECTOR__IDLE_POLL_MS": "20", "COMPENSATOR_PROJECTOR__STANDBY_POLL_MS": "50"})  # fmt: skip
    environ.update({f"COMPENSATOR_{name.upper()}": value for name, value in settings.items()})
    return environ


def start(environ: dict[str, str], name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "compensator", "project", "--id", name, *extra], cwd=ROOT, env=environ,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def cursor_and_in_transaction(dsn: str) -> tuple[int, bool]:
    connection = await asyncpg.connect(dsn)
    try:
        cursor = await connection.fetchval("SELECT last_seq FROM projector_cursors WHERE set_id = $1", SET_ID)
        return int(cursor or 0), bool(await connection.fetchval(_IN_TRANSACTION))
    finally:
        await connection.close()


async def flowing(traffic: Traffic, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await traffic.round()
        await asyncio.sleep(0.01)


async def test_killed_mid_batch_again_and_again_it_writes_no_row_twice_and_misses_no_event(
    queue: QueueClient, store: StoreThread, pg_dsn: str
) -> None:
    connection = await asyncpg.connect(pg_dsn)
    await connection.execute(_SLOW_ATTEMPTS)
    await connection.close()
    traffic, stop = Traffic(queue, seed=21), asyncio.Event()
    for _ in range(20):
        await traffic.round()
    flow = asyncio.create_task(flowing(traffic, stop))
    environ = environment(store, pg_dsn)
    last_cursor, killed_in_transaction = 0, 0
    try:
        for kill in range(KILLS):
            process = start(environ, f"p{kill}")
            try:
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    assert process.poll() is None, process.communicate()[1]
                    cursor, busy = await cursor_and_in_transaction(pg_dsn)
                    if cursor > last_cursor and busy:
                        break
                    assert asyncio.get_running_loop().time() < deadline, "the projector made no progress"
                    await asyncio.sleep(0.005)
            finally:
                process.send_signal(signal.SIGKILL)
                process.communicate()
            killed_in_transaction += 1
            await asyncio.sleep(0.1)  # PostgreSQL sees the connection close and rolls the batch back
            last_cursor, busy = await cursor_and_in_transaction(pg_dsn)
            assert not busy, "the killed projector's transaction was rolled back"
    finally:
        stop.set()
        await flow
    assert killed_in_transaction == KILLS
    final = start(environ, "last")
    try:
        head = (await queue.events_digest(0, 0)).value.last_seq
        deadline = asyncio.get_running_loop().time() + 60
        while (await ledger_rows(pg_dsn))[2] < head:
            assert final.poll() is None, final.communicate()[1]
            assert asyncio.get_running_loop().time() < deadline, "the projector did not catch up"
            await asyncio.sleep(0.05)
    finally:
        final.send_signal(signal.SIGTERM)
        out, err = final.communicate(timeout=30)
    assert final.returncode == 0, err
    assert f"projector stopped at event {head}" in out
    await assert_ledger_matches_store(queue, pg_dsn)


async def test_a_gap_is_one_line_and_exit_1(gapped: tuple[StoreThread, QueueClient], pg_dsn: str) -> None:
    environ = environment(gapped[0], pg_dsn)
    for extra in ((), ("--rebuild",)):
        process = start(environ, "gap", *extra)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 1
        lines = [line for line in err.splitlines() if line.startswith("compensator project:")]
        assert len(lines) == 1 and lines[0].startswith("compensator project: error: set 1: events 1..6 were purged")
        assert "Traceback" not in err
    assert (await ledger_rows(pg_dsn))[2] == 0
