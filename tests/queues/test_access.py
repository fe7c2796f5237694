"""Tokens, kind views and a message's operator events, through apply_batch and the query server."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
from queue_node import T0, CountingView, Node

from delay.policy import RetryPolicy
from queues import codec
from queues import query_codec as qc
from queues.core import access
from queues.core import reads as queries
from queues.core.answers import answer_query
from queues.core.port import Table
from queues.model import (
    TOKENS_MAX,
    Code,
    Discard,
    EventType,
    KindResult,
    PauseKind,
    PutToken,
    Redrive,
    ResumeKind,
    RevokeToken,
    Role,
    SetPolicy,
    SetQuota,
    TokenResult,
)
from queues.replicated import ReplicatedQueueMachine


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _put(node: Node, name: str, secret: str, role: Role = Role.PRODUCER) -> TokenResult:
    result = node.apply(PutToken(name=name, role=role, secret_hash=_hash(secret), actor="admin", reason="onboard"))
    assert isinstance(result, TokenResult)
    return result


def test_put_rotate_revoke_and_quota_bump_the_version_and_are_events_without_secrets() -> None:
    node = Node()
    conn = node.machine.view
    assert access.version(conn) == 0
    created = _put(node, "red-packet", "secret-number-one")
    assert (created.code, created.role, created.revoked, created.version) == (Code.OK, Role.PRODUCER, False, 1)
    rotated = _put(node, "red-packet", "secret-number-two", Role.OPERATOR)
    assert (rotated.code, rotated.role, rotated.version) == (Code.OK, Role.OPERATOR, 2)
    (view,) = access.tokens(conn)
    assert view.secret_hash == _hash("secret-number-two") and view.created_ms == T0 and view.created_by == "admin"
    quota = node.apply(SetQuota(name="red-packet", actor="ops", rate_per_s=50, burst=100))
    assert isinstance(quota, TokenResult) and quota.version == 3
    revoked = node.apply(RevokeToken(name="red-packet", actor="ops", reason="leaked"))
    assert isinstance(revoked, TokenResult) and revoked.revoked and revoked.version == 4
    again = node.apply(RevokeToken(name="red-packet", actor="ops", reason="leaked"))
    assert isinstance(again, TokenResult) and again.code is Code.OK and again.version == 4  # nothing changed
    (view,) = access.tokens(conn)
    assert (view.revoked_ms, view.rate_per_s, view.burst) == (T0, 50, 100)
    _put(node, "red-packet", "secret-number-three")  # rotating a revoked token makes it live again
    (view,) = access.tokens(conn)
    assert view.revoked_ms is None and view.rate_per_s == 50
    events = queries.events_after(conn, 0)
    assert [e.type for e in events] == [
        EventType.TOKEN_PUT, EventType.TOKEN_PUT, EventType.QUOTA_SET, EventType.TOKEN_REVOKED, EventType.TOKEN_PUT,
    ]
    assert events[1].data["rotated"] is True and events[1].data["role_before"] == "producer"
    assert events[2].data == {
        "name": "red-packet", "actor": "ops", "rate_per_s": 50, "burst": 100, "rate_per_s_before": None,
        "burst_before": None,
    }
    stored = b"".join(value for _, value in conn.scan(Table.EVENTS))
    for secret in ("secret-number-one", "secret-number-two", "secret-number-three"):
        assert _hash(secret) not in stored and secret.encode() not in stored


def test_refusals_change_nothing() -> None:
    node = Node()
    _put(node, "a", "same")
    clash = node.apply(PutToken(name="b", role=Role.ADMIN, secret_hash=_hash("same"), actor="x"))
    assert isinstance(clash, TokenResult) and clash.code is Code.CONFLICT and clash.version == 1
    for command in (RevokeToken(name="nobody", actor="x"), SetQuota(name="nobody", actor="x", rate_per_s=1)):
        refused = node.apply(command)
        assert isinstance(refused, TokenResult) and refused.code is Code.NOT_FOUND and refused.version == 1
    assert [t.name for t in access.tokens(node.machine.view)] == ["a"]
    assert len(queries.events_after(node.machine.view, 0)) == 1
    bad = node.apply_raw(b"\x01" + msgspec.msgpack.encode({"t": "put_token", "name": "Upper Case", "role": "root"}))
    assert bad.code is Code.INVALID


def test_tokens_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "TOKENS_MAX", 2)
    node = Node()
    _put(node, "a", "1")
    _put(node, "b", "2")
    full = node.apply(PutToken(name="c", role=Role.PRODUCER, secret_hash=_hash("3"), actor="x"))
    assert isinstance(full, TokenResult) and full.code is Code.INVALID
    assert _put(node, "a", "4").code is Code.OK  # rotating an existing one still works
    assert TOKENS_MAX >= 1000


def test_tokens_query_answers_only_the_version_when_nothing_changed(tmp_path: object) -> None:
    machine = ReplicatedQueueMachine(":memory:", clock_ms=lambda: T0)
    node = Node.over(machine)
    _put(node, "a", "1")
    first = answer_query(machine.view, qc.Tokens(), T0)
    assert isinstance(first, qc.TokensAnswer) and first.changed and [t.name for t in first.tokens] == ["a"]
    same = answer_query(machine.view, qc.Tokens(known_version=first.version), T0)
    assert isinstance(same, qc.TokensAnswer) and not same.changed and same.tokens == () and same.version == 1
    decoded = qc.decode_answer(qc.encode_answer(first))
    assert decoded == first


def test_kinds_view_and_policy_before_after_with_actors() -> None:
    node = Node()
    fast = RetryPolicy(tiers_ms=(100,), tier_jitter_ratio=0.0, attempts_max=2)
    registered = node.apply(SetPolicy(kind="refund", policy=fast, actor="ops", reason="new kind"))
    assert isinstance(registered, KindResult) and registered.policy_before is None
    slower = RetryPolicy(tiers_ms=(1000,), tier_jitter_ratio=0.0, attempts_max=3)
    replaced = node.apply(SetPolicy(kind="refund", policy=slower, actor="ops"))
    assert isinstance(replaced, KindResult) and replaced.policy_before == fast
    node.apply(PauseKind(kind="refund", holder="breaker:pay", reason="payment down", actor=""))
    node.apply(PauseKind(kind="refund", holder="alice", reason="incident 42", actor="alice"))
    node.apply(ResumeKind(kind="refund", holder="alice", actor="alice"))
    views = {view.kind: view for view in queries.kinds(node.machine.view)}
    assert set(views) == {"callback", "list_update", "refund", "transfer"}
    assert views["refund"].policy == slower
    assert views["refund"].pauses == (qc.PauseView(holder="breaker:pay", reason="payment down", since_ms=T0),)
    events = queries.events_after(node.machine.view, 0)
    assert events[1].data["policy_before"] == msgspec.json.encode(fast).decode()
    assert events[1].data["actor"] == "ops"
    assert events[3].data == {"holder": "alice", "reason": "incident 42", "actor": "alice"}
    assert events[4].data == {"holder": "alice", "still_paused": True, "actor": "alice"}  # the breaker holds it


def test_message_events_are_the_operator_events_of_those_messages_through_the_partial_index() -> None:
    node = Node()
    first = node.enqueue("k1", ref="rp-1")
    second = node.enqueue("k2", ref="rp-1")
    other = node.enqueue("k3", ref="rp-2")
    for grant in node.lease().grants:
        node.kill(grant.message_id, grant.token)
    node.apply(Redrive(actor="alice", reason="funds topped up", ids=(first,)))
    node.apply(Discard(message_id=second, actor="bob", reason="duplicate"))
    conn = node.machine.view
    events = queries.message_events(conn, [first, second])
    assert [(e.message_id, e.type) for e in events] == [
        (first, EventType.DEAD_LETTERED), (second, EventType.DEAD_LETTERED),
        (first, EventType.REDRIVEN), (second, EventType.DISCARDED),
    ]  # fmt: skip
    assert events[2].data["actor"] == "alice" and events[3].data["reason"] == "duplicate"
    assert [e.message_id for e in queries.message_events(conn, [other])] == [other]
    counting = CountingView(conn)
    assert queries.message_events(counting, [first, second]) == events
    assert Table.EVENTS not in counting.scans  # through the operator events' index, never a scan of the log
    assert counting.scans == {Table.OPERATOR_EVENTS: 4} and counting.gets == {Table.EVENTS: 4}


def test_codec_round_trips_the_new_commands() -> None:
    for command in (
        PutToken(name="svc", role=Role.ADMIN, secret_hash=_hash("x"), actor="a", reason="r"),
        RevokeToken(name="svc", actor="a"),
        SetQuota(name="svc", actor="a", rate_per_s=10, burst=20),
    ):
        assert codec.decode_command(codec.encode_command(command)) == command
