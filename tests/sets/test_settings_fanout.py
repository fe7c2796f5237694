"""Cluster-wide settings over several sets (queues/sets/settings.py, docs/sets.md): a pause, a
policy and a breaker's mode written through the facade hold in every set (a lease in each set
skips the paused kind); a set that is down makes the write answer which sets applied and which did
not, and the repair brings it in line once it is back; a set added later is given the settings
before its epoch is active. In-process one-node stores, the real client protocol over TCP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from delay.policy import RetryPolicy
from queues import Code, ControlSet, EnqueueResult, QueueClient, RaftClient, Read, SetsClient, cluster_settings
from queues.model import DocumentResult
from queues.query_codec import DocumentsAnswer
from queues.sets import table
from queues.sets.settings import REPAIR_ACTOR, Document, Pause, Policy, Resume
from raft_store.testing.inprocess import StoreThread
from tests.sets.test_sets_client import add_set, control_of, item
from tests.sets.test_sets_client import stores as stores  # the fixture, re-exported

KIND = "transfer"


def connector(stores: dict[int, StoreThread]) -> Callable[[int, tuple[str, ...]], QueueClient]:
    """Clients that give up on a set that is down after 1 s (the store deadline's role)."""
    by_address = {thread.addresses: thread for thread in stores.values()}

    def connect(_set_id: int, addresses: tuple[str, ...]) -> QueueClient:
        thread = by_address[addresses[0]]
        return QueueClient(RaftClient([thread.address], auth=thread.auth, attempt_timeout_s=0.5, deadline_s=1))

    return connect


async def facade(stores: dict[int, StoreThread]) -> tuple[ControlSet, SetsClient]:
    control = control_of(stores)
    await control.write(table.first_table({s: (stores[s].addresses,) for s in (1, 2, 3)}), expected_version=0,
                        actor="test", reason="init")  # fmt: skip
    return control, await SetsClient.from_control(control, connect=connector(stores))


async def leased_kinds(queue: QueueClient) -> set[str]:
    return {grant.kind for grant in (await queue.lease("w", count_max=100, lease_ms=60_000)).grants}


async def holders(queue: QueueClient, kind: str = KIND) -> list[str]:
    return [p.holder for view in (await queue.kinds()).value if view.kind == kind for p in view.pauses]


async def test_a_pause_policy_and_breaker_mode_hold_in_every_set(stores: dict[int, StoreThread]) -> None:
    _, sets = await facade(stores)
    try:
        keys = [f"k:{n}" for n in range(60)]
        placed = await sets.enqueue_many([item(key) for key in keys])
        assert {s for s, r in placed if isinstance(r, EnqueueResult)} == {1, 2, 3}

        outcome = await sets.broadcast(Pause(kind=KIND, holder="ops:alice", reason="payment outage"), actor="alice")
        assert outcome.applied == [1, 2, 3] and outcome.unreachable == [] and not outcome.already
        for set_id in (1, 2, 3):
            assert await leased_kinds(sets.client(set_id)) == set()  # the paused kind is skipped in every set
            audit = (await sets.client(set_id).audit_log(limit=5)).value.entries
            assert any(entry.actor == "alice" and entry.action == "paused" for entry in audit), audit
        again = await sets.broadcast(Pause(kind=KIND, holder="ops:alice", reason="payment outage"), actor="alice")
        assert again.already and again.applied == [1, 2, 3]  # held twice: the caller's 409, nothing changed

        policy = RetryPolicy(attempts_max=7)
        assert (await sets.broadcast(Policy(kind=KIND, policy=policy), actor="alice")).applied == [1, 2, 3]
        mode = Document(namespace="breakers", name="payment", body=b'{"mode":"open","reason":"r"}', reason="r")
        assert (await sets.broadcast(mode, actor="alice")).applied == [1, 2, 3]
        for set_id in (1, 2, 3):
            kinds = {view.kind: view for view in (await sets.client(set_id).kinds()).value}
            assert kinds[KIND].policy == policy
            documents = (await sets.client(set_id).documents("breakers")).value.documents
            assert [(d.name, d.body) for d in documents] == [("payment", mode.body)]

        assert (await sets.broadcast(Resume(kind=KIND, holder="ops:alice"), actor="alice")).applied == [1, 2, 3]
        assert all([await leased_kinds(sets.client(s)) == {KIND} for s in (1, 2, 3)])
        assert await sets.repair_settings() == {}  # every set holds what is intended
    finally:
        await sets.close()


async def test_a_set_that_is_down_is_named_and_repaired_and_a_set_added_later_gets_the_settings(
    stores: dict[int, StoreThread],
) -> None:
    control, sets = await facade(stores)
    try:
        stores[2].stop_node()
        outcome = await sets.broadcast(Pause(kind=KIND, holder="ops:bob", reason="outage"), actor="bob")
        assert outcome.applied == [1, 3] and outcome.unreachable == [2]
        assert "not applied in sets 2" in outcome.summary()
        policy = RetryPolicy(attempts_max=9)
        assert (await sets.broadcast(Policy(kind=KIND, policy=policy), actor="bob")).unreachable == [2]
        report = await sets.repair_settings()
        assert set(report) == {2} and isinstance(report[2], Exception)  # still down: tried by the next pass

        stores[2].start_node()
        assert await holders(sets.client(2)) == []  # it missed the pause
        report = await sets.repair_settings()
        assert set(report) == {2} and [type(s) for s in report[2]] == [Pause, Policy]  # type: ignore[union-attr]
        assert await holders(sets.client(2)) == ["ops:bob"]
        assert {v.kind: v.policy for v in (await sets.client(2).kinds()).value}[KIND] == policy
        audit = (await sets.client(2).audit_log(limit=5)).value.entries
        assert any(e.actor == REPAIR_ACTOR and e.action == "paused" and "bob" in e.reason for e in audit), audit
        assert await sets.repair_settings() == {}  # in line: nothing more to do

        # A set added later: `compensator sets add` copies the intent before activating the epoch.
        found, _ = await control.read()
        assert found is not None
        grown, _ = table.with_new_sets(found, [(stores[4].addresses,)])
        copy = SetsClient(grown, connect=connector(stores))
        try:
            copied = await cluster_settings.repair(control.queue, {4: copy.client(4)})
        finally:
            await copy.close()
        assert [type(s) for s in copied[4]] == [Pause, Policy]  # type: ignore[union-attr]
        assert await add_set(control, sets, stores[4].addresses) == 2
        await sets.refresh()
        assert await holders(sets.client(4)) == ["ops:bob"]
        placed = await sets.enqueue_many([item(f"new:{n}") for n in range(200)])
        assert 4 in {s for s, r in placed if isinstance(r, EnqueueResult) and r.code is Code.OK}
        assert await leased_kinds(sets.client(4)) == set()  # paused there too
    finally:
        await sets.close()


class OperatorBetween:
    """The control set's client, except that an operator's write lands right before the first
    write through it: after `prune` read the intents and compared the sets, before it deletes."""

    def __init__(self, queue: QueueClient, write: Callable[[], Awaitable[object]]) -> None:
        self._queue = queue
        self._write: Callable[[], Awaitable[object]] | None = write

    async def documents(self, namespace: str) -> Read[DocumentsAnswer]:
        return await self._queue.documents(namespace)

    async def put_document(self, *args: Any, **kwargs: Any) -> DocumentResult:
        write, self._write = self._write, None
        if write is not None:
            await write()
        return await self._queue.put_document(*args, **kwargs)


async def test_a_resume_or_reset_is_pruned_from_the_intents_only_when_old_held_by_every_set_and_unchanged(
    stores: dict[int, StoreThread],
) -> None:
    control, sets = await facade(stores)
    try:
        for holder in ("ops:a", "ops:b"):
            await sets.broadcast(Pause(kind=KIND, holder=holder, reason="outage"), actor="alice")
            await sets.broadcast(Resume(kind=KIND, holder=holder), actor="alice")
        await sets.broadcast(Document(namespace="test", name="d", body=b'{"mode": "open"}'), actor="alice")
        await sets.broadcast(Document(namespace="test", name="d", body=None), actor="alice")
        await sets.broadcast(Policy(kind=KIND, policy=RetryPolicy(attempts_max=9)), actor="alice")
        # a late pause of ops:b reached set 2 only: it does not hold that absence
        assert (await sets.client(2).pause(KIND, "ops:b", "late", actor="alice")).code is Code.OK
        names = {"pause/transfer/ops:a", "pause/transfer/ops:b", "document/test/d", "policy/transfer"}

        async def intent_names() -> set[str]:
            return {d.name for d in (await control.queue.documents(cluster_settings.NAMESPACE)).value.documents}

        assert await intent_names() == names
        assert await sets.prune_settings() == []  # all younger than a day
        assert await sets.prune_settings(keep_ms=0) == ["document/test/d", "pause/transfer/ops:a"]
        assert await intent_names() == names - {"document/test/d", "pause/transfer/ops:a"}
        audit = (await control.queue.audit_log(limit=5)).value.entries
        assert any(e.actor == REPAIR_ACTOR and "ops:a" in e.target for e in audit), audit

        # set 2 is repaired from the absence the prune kept, which can go after that
        assert set(await sets.repair_settings()) == {2} and await holders(sets.client(2)) == []

        async def paused_again() -> None:
            await sets.broadcast(Pause(kind=KIND, holder="ops:b", reason="again"), actor="bob")

        racing = OperatorBetween(control.queue, paused_again)
        clients = {s: sets.client(s) for s in (1, 2, 3)}
        assert await cluster_settings.prune(cast(QueueClient, racing), clients, keep_ms=0) == []
        wanted, _ = await cluster_settings.intended(control.queue)
        assert Pause(kind=KIND, holder="ops:b", reason="again", actor="bob") in wanted  # the operator's write kept
        assert [await holders(sets.client(s)) for s in (1, 2, 3)] == [["ops:b"]] * 3
        assert await sets.prune_settings(keep_ms=0) == []  # a pause is no absence
        assert await intent_names() == {"pause/transfer/ops:b", "policy/transfer"}
    finally:
        await sets.close()


async def test_the_repair_loop_prunes_an_absence_once_a_pass_compared_every_set(stores: dict[int, StoreThread]) -> None:
    control, sets = await facade(stores)
    try:
        await sets.broadcast(Pause(kind=KIND, holder="ops:c", reason="outage"), actor="carol")
        await sets.broadcast(Resume(kind=KIND, holder="ops:c"), actor="carol")
        passes: list[int] = []
        loop = asyncio.create_task(sets.repair_settings_forever(0.05, lambda ids, _report: passes.append(len(ids)),
                                                                keep_ms=0))  # fmt: skip
        try:
            for _ in range(200):
                names = {d.name for d in (await control.queue.documents(cluster_settings.NAMESPACE)).value.documents}
                if not names:
                    break
                await asyncio.sleep(0.05)
        finally:
            loop.cancel()
        assert names == set() and passes and set(passes) == {3}
    finally:
        await sets.close()
