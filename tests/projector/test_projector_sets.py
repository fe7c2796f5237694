"""One projector over several sets (real one-node stores in this process, a control set holding
their table, a real PostgreSQL): what several sets had ready goes into one transaction, a set
added to the table later is projected, a set that is down holds up no other, a set whose log has a
gap or whose ledger disagrees with it stops alone (the others keep projecting), and the sets' locks
are each held by one process (a second takes over a set whose lock is released, and a killed
session's sets, without a gap or a row twice). Counted, not timed: the waits are generous."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from projector_support import (
    FAST,
    KINDS,
    Traffic,
    assert_ledger_matches_store,
    end_session_of,
    execute,
    running,
    short_event_retention,
    wait_until,
)

from compensator.wiring.parts import table_rereader
from queues import ControlSet, QueueClient, RaftClient, SetsClient
from queues.replicated import machine_factory
from queues.sets import table
from raft_store.testing.inprocess import StoreThread, running_store
from raft_store.testing.processes import free_ports
from services.projector import ledger_writer
from services.projector.metrics import ProjectorMetrics
from services.projector.runner import EveryLaneStopped, Projector, ProjectorSettings, RebuildRefused, rebuild

WAIT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-4, each a started one-node store."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_store(tmp_path / f"set{s}", machine_factory)) for s in range(5)}


def client_of(thread: StoreThread) -> QueueClient:
    return QueueClient(RaftClient([thread.address], auth=thread.auth, attempt_timeout_s=0.5, deadline_s=2))


async def facade(stores: dict[int, StoreThread]) -> SetsClient:
    """The facade over sets 1-3 (set 4, when there is one, is added by a test), the table in the
    control set, and each set's kinds' policies set (three events in each set's log)."""
    by_address = {thread.addresses: thread for thread in stores.values()}
    control = ControlSet(client_of(stores[0]))
    await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                        actor="test", reason="init")  # fmt: skip
    found = await SetsClient.from_control(control, connect=lambda _s, a: client_of(by_address[a[0]]), refresh_s=0.1)
    for s in sorted(stores.keys() - {0}):
        queue = client_of(stores[s])
        for kind in KINDS:
            await queue.set_policy(kind, FAST)
        await queue.raft.close()
    return found


@pytest.fixture
async def sets(stores: dict[int, StoreThread]) -> AsyncIterator[SetsClient]:
    found = await facade(stores)
    yield found
    await found.close()


async def add_set_4(stores: dict[int, StoreThread], sets: SetsClient) -> None:
    assert sets.control is not None
    found, version = await sets.control.read()
    assert found is not None
    grown, epoch = table.with_new_sets(found, [(stores[4].addresses,)])
    version = await sets.control.write(grown, expected_version=version, actor="test", reason="grow")
    await sets.control.write(table.activated(grown, epoch.epoch), expected_version=version, actor="test", reason="grow")


def projector(
    sets: SetsClient, dsn: str, owner: str = "p1", standby_poll_s: float = 0.05, round_gather_s: float = 0.02
) -> Projector:
    settings = ProjectorSettings(owner=owner, batch_max=50, idle_poll_s=0.05, standby_poll_s=standby_poll_s,
                                 discover_every_s=0.1, round_gather_s=round_gather_s)  # fmt: skip
    return Projector(sets.clients, dsn, settings, tracer=TracerProvider().get_tracer("test"), metrics=ProjectorMetrics(),
                     discover=table_rereader(sets))  # fmt: skip


async def until(check: Callable[[], object], what: str) -> None:
    await wait_until(check, timeout_s=WAIT_S, what=what)


async def caught_up(built: Projector, sets: SetsClient, *set_ids: int) -> bool:
    for set_id in set_ids:
        last = (await sets.clients[set_id].events_digest(0, 0)).value.last_seq
        if set_id not in built.lanes or built.lanes[set_id].cursor != last:
            return False
    return True


async def test_what_several_sets_have_ready_is_one_transaction_and_a_set_added_later_is_projected(
    stores: dict[int, StoreThread], sets: SetsClient, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor rows are held by another transaction while every set has events: the first round
    waits on them, the other sets' batches get ready meanwhile, and the next round carries them all:
    with three sets some round writes two or more (the first, or the one after it). No round writes
    a set twice."""
    rounds: list[list[int]] = []
    write_round = ledger_writer.write_round

    async def recorded(connection: asyncpg.Connection, batches: list[ledger_writer.SetBatch], *, owner: str) -> None:
        await write_round(connection, batches, owner=owner)
        rounds.append([b.set_id for b in batches])

    monkeypatch.setattr(ledger_writer, "write_round", recorded)
    traffic = {s: Traffic(sets.clients[s], seed=s) for s in (1, 2, 3)}
    for each in traffic.values():
        await each.enqueue(20)
    blocker = await asyncpg.connect(pg_dsn)
    try:
        await blocker.execute("INSERT INTO projector_cursors (set_id, last_seq) VALUES (1, 0), (2, 0), (3, 0)")
        held = blocker.transaction()
        await held.start()
        await blocker.execute("SELECT 1 FROM projector_cursors FOR UPDATE")
        built = projector(sets, pg_dsn)
        async with running(built):
            await until(lambda: _all_ready(built, 1, 2, 3), "every set's first batch ready")
            await held.rollback()
            await until(lambda: caught_up(built, sets, 1, 2, 3), "sets 1-3 projected")
            assert any(len(r) >= 2 for r in rounds[:2]), rounds
            await add_set_4(stores, sets)
            await until(lambda: _has(sets, 4), "set 4 in the table")
            traffic[4] = Traffic(sets.clients[4], seed=4)
            for _ in range(6):
                for each in traffic.values():
                    await each.round()
            await until(lambda: caught_up(built, sets, 1, 2, 3, 4), "every set projected, set 4 too")
    finally:
        await blocker.close()
    assert all(len(r) == len(set(r)) for r in rounds), rounds
    assert built.rounds == len(rounds) == built.metrics.registry.get_sample_value("compensator_projector_rounds_total")
    assert built.metrics.registry.get_sample_value("compensator_projector_batches_total") == sum(map(len, rounds))
    for set_id in (1, 2, 3, 4):
        await assert_ledger_matches_store(sets.clients[set_id], pg_dsn, set_id)


async def _all_ready(built: Projector, *set_ids: int) -> bool:
    return all(s in built.lanes and (n := built.lanes[s].next) is not None and n.done() for s in set_ids)


async def _has(sets: SetsClient, set_id: int) -> bool:
    await sets.refresh()
    return set_id in sets.clients


async def test_a_set_that_is_down_holds_up_no_other_set(
    stores: dict[int, StoreThread], sets: SetsClient, pg_dsn: str
) -> None:
    traffic = {s: Traffic(sets.clients[s], seed=s) for s in (1, 2)}
    built = projector(sets, pg_dsn)
    async with running(built):
        await traffic[2].enqueue(5)
        await until(lambda: caught_up(built, sets, 1, 2), "both sets projected")
        stores[2].stop_node()
        for _ in range(8):
            await traffic[1].round()
        await until(lambda: caught_up(built, sets, 1), "set 1 projected while set 2 is down")
        stores[2].start_node()
        for _ in range(4):
            await traffic[2].round()
        await until(lambda: caught_up(built, sets, 1, 2), "set 2 projected once it is back")
    for set_id in (1, 2):
        await assert_ledger_matches_store(sets.clients[set_id], pg_dsn, set_id)


async def test_each_set_is_taken_over_by_the_other_process_without_a_gap_or_a_row_twice(
    sets: SetsClient, pg_dsn: str
) -> None:
    """Another process holds set 2's lock: this one projects sets 1 and 3, and takes set 2 over
    when that lock is released. Then a second projector stands by; the first's session is killed
    (as its process would be; it reconnects only after 5 s), and the second takes the sets over
    from the committed cursors. Every batch inserts new rows under primary keys: a row written
    twice would fail a projector, and each set's ledger equals its store at the end."""
    traffic = {s: Traffic(sets.clients[s], seed=20 + s) for s in (1, 2)}
    other = await asyncpg.connect(pg_dsn)
    try:
        assert await ledger_writer.try_lock(other, 2)
        first = projector(sets, pg_dsn, owner="a", standby_poll_s=5.0)
        async with running(first):
            for _ in range(5):
                for each in traffic.values():
                    await each.round()
            await until(lambda: caught_up(first, sets, 1, 3), "sets 1 and 3 projected")
            assert 2 not in first.lanes, "set 2's lock is another's"
            await other.close()
            await until(lambda: caught_up(first, sets, 1, 2, 3), "set 2 taken over once its lock is released")
            second = projector(sets, pg_dsn, owner="b")
            async with running(second):
                await asyncio.sleep(0.3)
                assert not second.lanes, "the second stands by for every set"
                for _ in range(5):
                    for each in traffic.values():
                        await each.round()
                await end_session_of(pg_dsn, 1)
                for _ in range(5):
                    for each in traffic.values():
                        await each.round()
                await until(lambda: _caught_up_by_either(first, second, sets), "every set projected after the kill")
            assert second.projected > 0
    finally:
        await other.close()
    for set_id in (1, 2, 3):
        await assert_ledger_matches_store(sets.clients[set_id], pg_dsn, set_id)


async def _caught_up_by_either(first: Projector, second: Projector, sets: SetsClient) -> bool:
    for set_id in (1, 2, 3):
        holder = second if set_id in second.lanes else first
        if not await caught_up(holder, sets, set_id):
            return False
    return True


@pytest.fixture
def gapped_stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-3, set 2's store with a 200 ms event retention."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_store(tmp_path / f"set{s}", short_event_retention if s == 2
                                                    else machine_factory)) for s in range(4)}  # fmt: skip


async def test_a_gap_or_a_ledger_that_disagrees_stops_only_its_set_and_the_others_keep_reaching_the_ledger(
    gapped_stores: dict[int, StoreThread], pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Set 2's log lost its first events (as the one-set gap test's store does): its lane stops at
    cursor 0, once, loudly (one line, the metric, its cursor row), holding its lock, while sets 1
    and 3 go on. Then set 3's ledger loses its rows and a lease of them meets set 1's new requests in
    one round: the round is rolled back and written again without set 3, whose cursor stays. Set 1
    failing the same way leaves nothing: the process ends with every set's line. A rebuild of sets 1
    and 3 and a restart project them again; set 2 stays stopped."""
    sets = await facade(gapped_stores)
    attempts: list[tuple[list[int], str]] = []
    write_round = ledger_writer.write_round

    async def recorded(connection: asyncpg.Connection, batches: list[ledger_writer.SetBatch], *, owner: str) -> None:
        ids = [b.set_id for b in batches]
        try:
            await write_round(connection, batches, owner=owner)
        except ledger_writer.SetStopped as error:
            attempts.append((ids, type(error).__name__))
            raise
        attempts.append((ids, "ok"))

    monkeypatch.setattr(ledger_writer, "write_round", recorded)
    caplog.set_level(logging.ERROR, logger="services.projector.runner")
    try:
        queues = sets.clients
        await Traffic(queues[2], seed=5).enqueue(3)
        await asyncio.sleep(0.3)
        assert (await queues[2].purge()).events_purged == 6, "set 2's log starts at event 7"
        traffic = {s: Traffic(queues[s], seed=40 + s) for s in (1, 3)}
        for each in traffic.values():
            await each.enqueue(6)
        built = projector(sets, pg_dsn, round_gather_s=0.5)  # sets 1 and 3 busy together meet in one round
        stop = asyncio.Event()
        run = asyncio.create_task(built.run(stop))
        await until(lambda: _stopped_and_caught_up(built, sets, {2}, 1, 3), "set 2 stopped, sets 1 and 3 projected")
        for _ in range(3):
            for each in traffic.values():
                await each.round()
        await until(lambda: caught_up(built, sets, 1, 3), "sets 1 and 3 projected after set 2 stopped")
        assert not run.done()
        assert built.stopped[2].startswith("set 2: projection stopped at event 0: events 1..6 were purged")
        samples = built.metrics.registry.get_sample_value
        assert [samples("compensator_projector_lane_stopped", {"set": str(s)}) for s in (1, 2, 3)] == [0, 1, 0]
        assert samples("compensator_projector_active", {"set": "2"}) == 1, "the stopped set's lock is kept"
        assert await _cursor_rows(pg_dsn, 2) == (0, built.stopped[2], 0)

        # Set 3's ledger loses its rows; a lease of them and set 1's new requests, at once.
        cursor_3 = built.lanes[3].cursor
        await execute(pg_dsn, "DELETE FROM compensation_requests WHERE set_id = 3")
        attempts.clear()
        await asyncio.gather(queues[3].lease("w", count_max=3, lease_ms=30_000), traffic[1].enqueue(2))
        await until(lambda: _stopped_and_caught_up(built, sets, {2, 3}, 1), "set 3 stopped, set 1 projected")
        assert ([1, 3], "LedgerMismatch") in attempts and ([1], "ok") in attempts, attempts
        assert attempts.index(([1, 3], "LedgerMismatch")) + 1 == attempts.index(([1], "ok")), "written again without 3"
        assert await _cursor_rows(pg_dsn, 3) == (cursor_3, built.stopped[3], 0), "set 3: cursor kept, nothing written"
        assert built.stopped[3].startswith(f"set 3: projection stopped at event {cursor_3}: events change ")
        assert "the ledger lost rows behind its cursor" in built.stopped[3]
        with pytest.raises(RebuildRefused, match="another projector is active"):
            await rebuild(queues[3], pg_dsn, 3)  # the stopped set's lock is kept: stop the process first
        for _ in range(2):
            await traffic[1].round()
        await until(lambda: caught_up(built, sets, 1), "set 1 still projected")
        assert not run.done()
        await assert_ledger_matches_store(queues[1], pg_dsn, 1)
        stopped_lines = [r.getMessage() for r in caplog.records if "projection stopped" in r.getMessage()]
        assert [line.split(":")[0] for line in stopped_lines] == ["set 2", "set 3"], "each logged once"
        assert all("\n" not in line and "docs/ledger.md" in line for line in stopped_lines)

        # Set 1 the same way: no set left, the process ends with every set's line.
        await execute(pg_dsn, "DELETE FROM compensation_requests WHERE set_id = 1")
        await queues[1].lease("w", count_max=3, lease_ms=30_000)
        with pytest.raises(EveryLaneStopped) as ended:
            await asyncio.wait_for(run, WAIT_S)
        message = str(ended.value)
        assert "\n" not in message and all(f"set {s}: projection stopped at event" in message for s in (1, 2, 3))
        assert len(caplog.records) == 2, "the last one is the process's line, not logged twice"

        # The operator's way back: rebuild what the log can give again, restart.
        for set_id in (1, 3):
            await rebuild(queues[set_id], pg_dsn, set_id)
        again = projector(sets, pg_dsn)
        async with running(again):
            await until(lambda: _stopped_and_caught_up(again, sets, {2}, 1, 3), "sets 1 and 3 rebuilt, set 2 not")
        for set_id in (1, 3):
            await assert_ledger_matches_store(queues[set_id], pg_dsn, set_id)
            assert (await _cursor_rows(pg_dsn, set_id))[1] is None, "the stop is cleared once it projects again"
        assert (await _cursor_rows(pg_dsn, 2))[1] == again.stopped[2]
    finally:
        await sets.close()


async def _stopped_and_caught_up(built: Projector, sets: SetsClient, stopped: set[int], *set_ids: int) -> bool:
    return set(built.stopped) == stopped and await caught_up(built, sets, *set_ids)


async def _cursor_rows(dsn: str, set_id: int) -> tuple[int, str | None, int]:
    """The set's cursor, why it stopped, and its requests in the ledger (0, None, 0 before its row)."""
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow(
            "SELECT last_seq, stopped_reason FROM projector_cursors WHERE set_id = $1", set_id
        )
        count = await connection.fetchval("SELECT count(*) FROM compensation_requests WHERE set_id = $1", set_id)
        return (0, None, int(count)) if row is None else (int(row["last_seq"]), row["stopped_reason"], int(count))
    finally:
        await connection.close()


@pytest.fixture
def shared_secret_stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-3 behind one cluster secret, as a deployment's sets are, so
    that one `compensator project` process (one `store.secret_file`) reads them all."""
    folders = {s: tmp_path / f"set{s}" for s in range(4)}
    with running_store(folders[0] / "store", machine_factory) as first:
        for s in (1, 2, 3):
            folders[s].mkdir()
            shutil.copy(first.secret_file, folders[s] / first.secret_file.name)
        with contextlib.ExitStack() as stack:
            yield {0: first} | {s: stack.enter_context(running_store(folders[s] / "store", machine_factory))
                                for s in (1, 2, 3)}  # fmt: skip


@pytest.mark.slow
async def test_the_process_goes_on_with_the_other_sets_and_ends_with_one_line_when_none_is_left(
    shared_secret_stores: dict[int, StoreThread], pg_dsn: str
) -> None:
    """`compensator project` over three sets: set 2's ledger loses its rows, a lease of them stops
    set 2 (one stderr line, the metric on its endpoint), sets 1 and 3 keep reaching the ledger, and
    SIGTERM exits 0 naming the stopped set. Started again without a fix, set 2 stops again; sets 1
    and 3 failing the same way leave the process nothing: one line, exit 1. About 8 s."""
    stores = shared_secret_stores
    sets = await facade(stores)
    (metrics_port,) = free_ports(1)
    environ = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    environ.update(stores[1].service_settings() | {
        "COMPENSATOR_STORE__CONTROL_ADDRESSES": stores[0].addresses, "COMPENSATOR_PG_DSN": pg_dsn,
        "COMPENSATOR_STORE__DEADLINE_S": "3", "COMPENSATOR_PROJECTOR__IDLE_POLL_MS": "50",
        "COMPENSATOR_PROJECTOR__METRICS_PORT": str(metrics_port),
    })  # fmt: skip

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "compensator", "project", "--id", "multi"], cwd=ROOT,
                                env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    async def projected(process: subprocess.Popen[str], *set_ids: int) -> bool:
        assert process.poll() is None, process.communicate()[1]
        for set_id in set_ids:
            last = (await sets.clients[set_id].events_digest(0, 0)).value.last_seq
            if (await _cursor_rows(pg_dsn, set_id))[0] != last:
                return False
        return True

    async def stopped(process: subprocess.Popen[str], set_id: int) -> bool:
        assert process.poll() is None, process.communicate()[1]
        return (await _cursor_rows(pg_dsn, set_id))[1] is not None

    traffic = {s: Traffic(sets.clients[s], seed=50 + s) for s in (1, 2, 3)}
    try:
        for each in traffic.values():
            await each.enqueue(4)
        process = start()
        try:
            await until(lambda: projected(process, 1, 2, 3), "every set projected")
            await execute(pg_dsn, "DELETE FROM compensation_requests WHERE set_id = 2")
            await sets.clients[2].lease("w", count_max=2, lease_ms=30_000)
            await until(lambda: stopped(process, 2), "set 2 stopped")
            for s in (1, 3):
                await traffic[s].enqueue(3)
            await until(lambda: projected(process, 1, 3), "sets 1 and 3 projected after set 2 stopped")
            scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            assert re.search(r'^compensator_projector_lane_stopped\{set="2"\} 1\.0$', scraped, re.MULTILINE)
            assert re.search(r'^compensator_projector_lane_stopped\{set="1"\} 0\.0$', scraped, re.MULTILINE)
        finally:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert "(set 2 stopped on an error, see above)" in out.splitlines()[-1]
        assert len([line for line in err.splitlines() if "projection stopped" in line]) == 1, err
        assert "set 2: projection stopped at event" in err and "Traceback" not in err

        again = start()
        try:
            await until(lambda: stopped(again, 2), "set 2 stopped again")
            await until(lambda: projected(again, 1, 3), "sets 1 and 3 projected again")
            await execute(pg_dsn, "DELETE FROM compensation_requests WHERE set_id IN (1, 3)")
            for s in (1, 3):
                await sets.clients[s].lease("w", count_max=2, lease_ms=30_000)
            _, err = again.communicate(timeout=WAIT_S)
        finally:
            if again.poll() is None:
                again.kill()
                again.communicate()
        assert again.returncode == 1, err
        (line,) = [line for line in err.splitlines() if line.startswith("compensator project:")]
        assert line.startswith("compensator project: error: every set's projection stopped (set 1: projection stopped")
        assert all(f"set {s}: projection stopped at event" in line for s in (1, 2, 3)) and "Traceback" not in err
    finally:
        await sets.close()
