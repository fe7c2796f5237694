"""The sets facade over real stores (one-node sets in this process, each on its own thread, the
real client protocol over TCP): intake routed by key, a fourth set added with the three steps,
replays reaching the set that holds the key, a router with an old table fenced and re-routed, and
a set that is down failing only its own keys (docs/sets.md)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from queues import ClientError, Code, ControlSet, Enqueue, EnqueueResult, QueueClient, RaftClient, SetsClient
from queues.replicated import machine_factory
from queues.sets import routing, table
from raft_store.testing.inprocess import StoreThread, running_store

SETS = 4  # sets 1-3 at first, 4 added


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1-4, each a started one-node store."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(running_store(tmp_path / f"set{s}", machine_factory)) for s in range(SETS + 1)}


def connector(stores: dict[int, StoreThread]) -> Callable[[int, tuple[str, ...]], QueueClient]:
    by_address = {thread.addresses: thread for thread in stores.values()}

    def connect(_set_id: int, addresses: tuple[str, ...]) -> QueueClient:
        thread = by_address[addresses[0]]
        return QueueClient(RaftClient([thread.address], auth=thread.auth, attempt_timeout_s=0.5, deadline_s=2))

    return connect


def control_of(stores: dict[int, StoreThread]) -> ControlSet:
    thread = stores[0]
    return ControlSet(QueueClient(RaftClient([thread.address], auth=thread.auth, deadline_s=5)))


def item(key: str, ref: str = "order-1") -> Enqueue:
    return Enqueue(kind="transfer", idempotency_key=key, ref_key=ref, payload=key.encode())


async def add_set(control: ControlSet, sets: SetsClient, addresses: str) -> int:
    """The three steps of `compensator sets add` (compensator/commands/sets.py): pending, fence, active."""
    found, version = await control.read()
    assert found is not None
    grown, epoch = table.with_new_sets(found, [(addresses,)])
    version = await control.write(grown, expected_version=version, actor="test", reason="grow")
    await sets.fence(found.newest_active().sets, epoch.epoch, actor="test", reason="grow")
    await control.write(table.activated(grown, epoch.epoch), expected_version=version, actor="test", reason="grow")
    return epoch.epoch


async def test_intake_spreads_replays_find_their_set_after_an_add_and_a_stale_router_is_fenced(
    stores: dict[int, StoreThread],
) -> None:
    control = control_of(stores)
    await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                        actor="test", reason="init")  # fmt: skip
    sets = await SetsClient.from_control(control, connect=connector(stores))
    stale = await SetsClient.from_control(control_of(stores), connect=connector(stores), refresh_s=3600)
    try:
        keys = [f"p:{n}" for n in range(600)]
        placed = await sets.enqueue_many([item(key) for key in keys])
        assert all(isinstance(r, EnqueueResult) and r.code is Code.OK for _, r in placed)
        spread = Counter(set_id for set_id, _ in placed)
        assert set(spread) == {1, 2, 3} and all(150 <= n <= 250 for n in spread.values()), spread
        first = {key: (set_id, result.message_id) for key, (set_id, result) in zip(keys, placed, strict=True)
                 if isinstance(result, EnqueueResult)}  # fmt: skip
        held = await sets.client(2).by_idempotency_keys([k for k, (s, _) in first.items() if s == 2])
        assert len(held.value) == spread[2]  # each key is in the set it was answered from

        assert await add_set(control, sets, stores[4].addresses) == 2
        await sets.refresh()
        again = await sets.enqueue_many([item(key) for key in keys])
        assert [(s, r.message_id) for s, r in again if isinstance(r, EnqueueResult)] == [first[k] for k in keys]
        assert all(isinstance(r, EnqueueResult) and r.code is Code.EXISTS for _, r in again)

        newest = sets.table.newest_active()
        moved = [f"n:{n}" for n in range(2000) if routing.candidate(f"n:{n}", newest) == 4][:40]
        placed_stale = await stale.enqueue_many([item(key) for key in moved])  # its table: epoch 1 only
        assert [s for s, _ in placed_stale] == [4] * len(moved), placed_stale
        assert stale.table.newest_active().epoch == 2  # the fence made it read the table again

        merged = await sets.by_ref_key("order-1")
        assert len(merged) == len(keys) + len(moved)
        assert [v.created_ms for _, v in merged] == sorted(v.created_ms for _, v in merged)
        assert sum(n for (_, state), n in (await sets.counts()).items() if state == "ready") == len(merged)
    finally:
        await sets.close()
        await stale.close()


async def test_a_set_that_is_down_fails_only_its_own_keys_within_the_deadline(stores: dict[int, StoreThread]) -> None:
    control = control_of(stores)
    await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                        actor="test", reason="init")  # fmt: skip
    sets = await SetsClient.from_control(control, connect=connector(stores))
    try:
        stores[2].stop()
        started = time.monotonic()
        placed = await sets.enqueue_many([item(f"d:{n}") for n in range(90)])
        assert time.monotonic() - started < 5  # the store deadline (2 s here), not a wait on the dead set
        failed = {s for s, r in placed if isinstance(r, ClientError)}
        stored = Counter(s for s, r in placed if isinstance(r, EnqueueResult) and r.code is Code.OK)
        assert failed == {2} and set(stored) == {1, 3}, placed
        statuses = {found.set_id: found.nodes for found in await sets.statuses()}
        assert "error" in statuses[2][0] and "error" not in statuses[1][0]
    finally:
        await sets.close()
