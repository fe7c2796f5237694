"""The route fence in the queue's core: a set fenced at epoch N refuses a new key routed by an
older epoch, answers a key it holds as always, and a set never fenced behaves as before
(docs/sets.md, "Fencing"). In process, through `apply_batch` bytes (tests/queues/queue_node.py)."""

from __future__ import annotations

from queue_node import Node

from queues import codec
from queues.core import audit_chain
from queues.core.port import Table
from queues.model import Code, Enqueue, EnqueueResult, RouteFence, RouteResult


def enqueue(key: str, route_epoch: int = 0, payload: bytes = b"p") -> Enqueue:
    return Enqueue(kind="transfer", idempotency_key=key, ref_key="r", payload=payload, route_epoch=route_epoch)


def test_a_fenced_set_refuses_new_keys_of_older_epochs_and_still_answers_the_keys_it_holds() -> None:
    node = Node()
    held = node.apply(enqueue("held", route_epoch=1))
    assert isinstance(held, EnqueueResult) and held.code is Code.OK
    assert node.apply(RouteFence(epoch=2, actor="ops", reason="set 2 added")) == RouteResult(
        code=Code.OK, min_route_epoch=2
    )
    keys_before = list(node.machine.view.scan(Table.KEYS))
    assert node.apply(enqueue("new", route_epoch=1)) == RouteResult(code=Code.ROUTE_STALE, min_route_epoch=2)
    assert node.apply(enqueue("new")) == RouteResult(code=Code.ROUTE_STALE, min_route_epoch=2)  # unrouted too
    assert list(node.machine.view.scan(Table.KEYS)) == keys_before  # the key refused is left unclaimed
    replay = node.apply(enqueue("held", route_epoch=1))
    assert isinstance(replay, EnqueueResult) and (replay.code, replay.message_id) == (Code.EXISTS, held.message_id)
    conflict = node.apply(enqueue("held", route_epoch=1, payload=b"other"))
    assert isinstance(conflict, EnqueueResult) and conflict.code is Code.CONFLICT
    fresh = node.apply(enqueue("new", route_epoch=2))
    assert isinstance(fresh, EnqueueResult) and fresh.code is Code.OK


def test_a_fence_never_goes_back_and_only_a_raise_is_audited() -> None:
    node = Node()
    assert node.apply(RouteFence(epoch=3, actor="ops", reason="r")) == RouteResult(code=Code.OK, min_route_epoch=3)
    entries = audit_chain.entries_after(node.machine.view, 0)
    assert [(e.actor, e.action, e.target, e.before, e.after) for e in entries] == [
        ("ops", "route_fenced", "route_epoch", '{"min_route_epoch":0}', '{"min_route_epoch":3}')
    ]
    for lower in (3, 2, 1):
        assert node.apply(RouteFence(epoch=lower, actor="ops")) == RouteResult(code=Code.OK, min_route_epoch=3)
    assert len(audit_chain.entries_after(node.machine.view, 0)) == 1
    refused = node.apply(enqueue("k", route_epoch=2))
    assert isinstance(refused, RouteResult) and refused.min_route_epoch == 3


def test_the_fence_survives_a_rollback_and_a_restart(tmp_path: object) -> None:
    path = f"{tmp_path}/m"
    node = Node(path)
    node.apply(RouteFence(epoch=2, actor="ops"))
    node.machine.commit()
    node.machine.close()
    again = Node(path)
    again.index = node.index
    assert again.apply(enqueue("k", route_epoch=1)) == RouteResult(code=Code.ROUTE_STALE, min_route_epoch=2)


def test_an_enqueue_of_an_older_log_decodes_unrouted_and_an_unfenced_set_takes_every_epoch() -> None:
    old = codec.encode_command(enqueue("k")).replace(b"\xabroute_epoch\x00", b"").replace(b"\x8a", b"\x89", 1)
    assert codec.decode_command(old) == enqueue("k")  # the field's default: what every recorded log holds
    node = Node()
    for epoch in (0, 1, 7):
        result = node.apply(enqueue(f"k{epoch}", route_epoch=epoch))
        assert isinstance(result, EnqueueResult) and result.code is Code.OK
