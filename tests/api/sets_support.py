"""What the tests of the API and the review pages with several sets share: the control set (0) and
sets 1-3 as one-node stores in this process, one cluster secret for all (as a deployment has), the
set table written, and dead letters made in whichever set each request was routed to.

Imported by name (tests/web/conftest.py puts tests/api on the path)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import Api

from ledger.request_ids import RequestId
from queues import QueueClient, RaftClient, Role
from queues.replicated import machine_factory
from queues.sets import table
from queues.sets.client import ControlSet
from raft_store.auth import write_secret_file
from raft_store.testing.inprocess import StoreThread

SET_OVERRIDES = {"store__sets_refresh_s": "1", "store__deadline_s": "1", "store__attempt_timeout_s": "0.5"}
"""The API's settings with several sets in these tests: a set that is down costs a second."""


@contextlib.contextmanager
def set_stores(tmp_path: Path, count: int = 4) -> Iterator[dict[int, StoreThread]]:
    """The control set (0) and sets 1..count-1, started."""
    secret = tmp_path / "secret"
    write_secret_file(secret)
    started: dict[int, StoreThread] = {}
    try:
        for set_id in range(count):
            folder = tmp_path / f"s{set_id}"
            folder.mkdir()
            shutil.copy(secret, folder / "store.secret")
            started[set_id] = StoreThread(folder / "store", machine_factory)
            started[set_id].start()
        yield started
    finally:
        for thread in started.values():
            thread.stop()


def client(thread: StoreThread) -> QueueClient:
    return QueueClient(RaftClient([thread.address], auth=thread.auth, attempt_timeout_s=0.5, deadline_s=2))


async def write_table(stores: dict[int, StoreThread], set_ids: tuple[int, ...] = (1, 2, 3)) -> dict[str, str]:
    """The set table of these sets written to the control set; the API's overrides that use it."""
    control = ControlSet(client(stores[0]))
    try:
        await control.write(table.first_table({s: (stores[s].addresses,) for s in set_ids}), expected_version=0,
                            actor="test", reason="init")  # fmt: skip
    finally:
        await control.queue.raft.close()
    return {"store__control_addresses": stores[0].addresses, **SET_OVERRIDES}


async def dead_in_sets(api: Api, stores: dict[int, StoreThread], *bodies: dict[str, Any], prefix: str = "k",
                       error_class: str = "insufficient_funds") -> list[str]:  # fmt: skip
    """Requests submitted through the API (routed by key), then dead-lettered in their own sets by a
    worker's permanent failure."""
    ids = []
    for index, body in enumerate(bodies):
        answer = await api.client.post("/v1/requests", json=body, headers={
            **api.auth(Role.PRODUCER), "Idempotency-Key": f"{prefix}-{body['ref_key']}-{index}"})  # fmt: skip
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    parsed = [RequestId.parse(request_id) for request_id in ids]
    for set_id in sorted({p.set_id for p in parsed if p is not None}):
        ours = {p.message_id for p in parsed if p is not None and p.set_id == set_id}
        queue = client(stores[set_id])
        try:
            for grant in (await queue.lease("w", count_max=1000, lease_ms=30_000)).grants:
                if grant.message_id in ours:
                    await queue.fail(grant.message_id, grant.token, error_class, "HTTP 402 from payment", permanent=True)
                else:
                    await queue.release(grant.message_id, grant.token)
        finally:
            await queue.raft.close()
    return ids


def list_update(key: str, amount_minor: int) -> dict[str, Any]:
    """A list update of `amount_minor` CNY, keyed `rp-{key}`."""
    return {"kind": "list_update", "ref_key": f"rp-{key}",
            "payload": {"red_packet_id": f"rp-{key}", "receiver": "user-700042", "version": 1,
                        "amount_minor": amount_minor, "currency": "CNY"}}  # fmt: skip


def stop_after(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, store: StoreThread) -> None:
    """`store`'s node stops right after `owner.name` (a step reading what a request acts on)
    answers: a set lost between reading its targets and acting on them. `monkeypatch.undo()` ends it."""
    original = getattr(owner, name)

    async def then_stop(*args: Any) -> Any:
        found = await original(*args)
        await asyncio.to_thread(store.stop_node)
        return found

    monkeypatch.setattr(owner, name, then_stop)
