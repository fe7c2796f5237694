"""What workers need from the machine beyond lease and ack: a lease handed back unstarted, a late
ack told apart from a lifecycle error, and how the last delivery ended."""

from __future__ import annotations

import msgspec
from queue_node import Node

from delay.policy import RetryPolicy
from queues.core import documents
from queues.core import reads as queries
from queues.model import (
    Ack,
    Code,
    DocumentResult,
    EditRedrive,
    EventType,
    ExtendLease,
    Fail,
    Lease,
    LeaseResult,
    Outcome,
    PauseKind,
    PutDocument,
    Redrive,
    Release,
    ReviewResult,
    SetPolicy,
    State,
)


def test_a_released_lease_is_ready_at_once_and_does_not_spend_the_budget() -> None:
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(1000,), tier_jitter_ratio=0.0, attempts_max=2)))
    message_id = node.enqueue("k")
    for _ in range(3):  # three deliveries handed back: none of them counts
        (grant,) = node.lease().grants
        released = node.apply(Release(message_id=message_id, token=grant.token))
        assert released == Outcome(code=Code.OK, message_id=message_id, state=State.READY, due_ms=node.now_ms)
    (grant,) = node.lease().grants
    assert grant.attempt == 4  # every delivery is in the history
    failed = node.apply(Fail(message_id=message_id, token=grant.token, error_class="timeout"))
    assert isinstance(failed, Outcome) and failed.state is State.DELAYED  # the budget of 2 is not spent
    node.now_ms += 1000
    (grant,) = node.lease().grants
    dead = node.apply(Fail(message_id=message_id, token=grant.token, error_class="timeout"))
    assert isinstance(dead, Outcome) and dead.state is State.DEAD
    view = queries.get_message(node.machine.view, message_id, now_ms=node.now_ms)
    assert view is not None
    assert [a.outcome for a in view.history] == ["released", "released", "released", "failed", "failed"]
    events = [e.type for e in queries.events_after(node.machine.view, 0)]
    assert events.count(EventType.RELEASED) == 3


def test_an_interrupted_release_tells_the_next_delivery_its_outcome_is_unknown() -> None:
    node = Node()
    message_id = node.enqueue("k")
    (grant,) = node.lease().grants
    assert node.apply(Release(message_id=message_id, token=grant.token, interrupted=True)).code is Code.OK
    (again,) = node.lease().grants
    assert again.previous_error_class == "interrupted" and again.attempt == 2
    view = queries.get_message(node.machine.view, message_id, now_ms=node.now_ms)
    assert view is not None and view.history[0].outcome == "interrupted"


def test_release_is_refused_like_any_worker_action() -> None:
    node = Node()
    message_id = node.enqueue("k")
    (grant,) = node.lease().grants
    assert node.apply(Release(message_id=message_id, token=grant.token + 1)).code is Code.STALE_TOKEN
    node.now_ms += 60_000  # the lease expired
    assert node.apply(Release(message_id=message_id, token=grant.token)).code is Code.LEASE_EXPIRED
    assert node.apply(Release(message_id=999, token=1)).code is Code.NOT_FOUND


def test_work_finished_under_another_lease_is_done_elsewhere_not_illegal() -> None:
    node = Node()
    message_id = node.enqueue("k")
    (first,) = node.lease().grants
    node.now_ms += 60_000  # worker 1 stalls past its lease, which expires; worker 2 takes over
    assert node.lease().grants == ()  # expired now, due again after the first tier
    node.now_ms += 60_000
    (second,) = node.lease().grants
    assert node.apply(Ack(message_id=message_id, token=second.token)).code is Code.OK
    for late in (
        Ack(message_id=message_id, token=first.token),
        Fail(message_id=message_id, token=first.token, error_class="timeout"),
        ExtendLease(message_id=message_id, token=first.token, lease_ms=1000),
        Release(message_id=message_id, token=first.token),
    ):
        refused = node.apply(late)
        assert refused == Outcome(code=Code.DONE_ELSEWHERE, message_id=message_id, state=State.DONE), late
    assert node.apply(Ack(message_id=message_id, token=second.token)).code is Code.ALREADY_ACKED


def test_a_grant_says_how_the_delivery_before_it_ended() -> None:
    node = Node()
    message_id = node.enqueue("k")
    (first,) = node.lease().grants
    assert first.previous_error_class is None
    node.apply(Fail(message_id=message_id, token=first.token, error_class="timeout"))
    node.now_ms += 10 * 60_000
    (second,) = node.lease().grants
    assert second.previous_error_class == "timeout"
    node.now_ms += 10 * 60_000  # this one expires
    assert node.lease().grants == ()
    node.now_ms += 10 * 60_000
    (third,) = node.lease().grants
    assert third.previous_error_class == "lease_expired"


def test_work_due_names_ready_kinds_the_next_due_time_and_the_pause_holders() -> None:
    node = Node()
    conn = node.machine.view
    now = node.now_ms
    empty = queries.work_due(conn, (), now_ms=now)
    assert (empty.ready, empty.next_due_ms, empty.paused, empty.paused_ready) == ({}, None, {}, ())
    node.enqueue("a", kind="transfer")
    node.enqueue("b", kind="list_update", delay_ms=5000)
    node.enqueue("c", kind="callback", delay_ms=2000)
    node.enqueue("d", kind="callback")
    due = queries.work_due(conn, (), now_ms=now)
    assert (due.ready, due.next_due_ms) == ({"callback": now, "transfer": now}, now + 2000)
    assert queries.work_due(conn, ("list_update",), now_ms=now).next_due_ms == now + 5000
    node.apply(PauseKind(kind="callback", holder="breaker:callback", reason="failing"))
    due = queries.work_due(conn, (), now_ms=now)
    assert (due.ready, due.next_due_ms) == ({"transfer": now}, now + 5000)
    assert (due.paused, due.paused_ready) == ({"callback": ("breaker:callback",)}, ("callback",))


def test_a_probe_leases_a_kind_only_its_breaker_holds() -> None:
    node = Node()
    node.enqueue("a", kind="callback")
    node.apply(PauseKind(kind="callback", holder="breaker:callback", reason="failing"))
    assert node.lease().grants == ()
    probe = node.apply(Lease(worker_id="w", count_max=1, lease_ms=1000, probe="breaker:callback"))
    assert isinstance(probe, LeaseResult) and len(probe.grants) == 1
    node.enqueue("b", kind="callback")
    node.apply(PauseKind(kind="callback", holder="alice", reason="incident"))  # an operator holds it too
    held = node.apply(Lease(worker_id="w", count_max=1, lease_ms=1000, probe="breaker:callback"))
    assert isinstance(held, LeaseResult) and held.grants == ()


def test_documents_are_replaced_versioned_and_audited() -> None:
    node = Node()
    conn = node.machine.view
    assert documents.version(conn, "breakers") == 0
    first = node.apply(PutDocument(namespace="breakers", name="payment", body=b'{"mode":"open"}', actor="ops", reason="x"))
    assert first == DocumentResult(code=Code.OK, version=1)
    node.apply(PutDocument(namespace="breakers", name="payment", body=b'{"mode":"auto"}', actor="ops"))
    (view,) = documents.documents(conn, "breakers")
    assert (view.name, view.body, view.updated_by) == ("payment", b'{"mode":"auto"}', "ops")
    refused = node.apply(PutDocument(namespace="breakers", name="x", body=b"[1]", actor="ops"))
    assert refused == DocumentResult(code=Code.INVALID, version=2)
    assert node.apply(PutDocument(namespace="breakers", name="payment", body=None, actor="ops")).code is Code.OK
    assert documents.documents(conn, "breakers") == [] and documents.version(conn, "breakers") == 3
    events = [e for e in queries.events_after(conn, 0) if e.type is EventType.DOCUMENT_PUT]
    assert [(e.data["before"], e.data["after"]) for e in events] == [
        (None, '{"mode":"open"}'), ('{"mode":"open"}', '{"mode":"auto"}'), ('{"mode":"auto"}', None)]


def test_maintenance_due_is_the_next_deadline_purge_and_oldest_event() -> None:
    node = Node()
    conn = node.machine.view
    assert queries.maintenance_due(conn) == (None, None, None)
    message_id = node.enqueue("a")
    (grant,) = node.lease().grants
    assert queries.maintenance_due(conn) == (grant.deadline_ms, None, node.now_ms)
    node.apply(Ack(message_id=message_id, token=grant.token))
    deadline, purge, oldest = queries.maintenance_due(conn)
    assert deadline is None and purge is not None and purge > node.now_ms and oldest == node.now_ms


# ---- the in-doubt deadline: how long an earlier delivery's requests may still take effect ----------


def test_a_first_grant_has_no_in_doubt_deadline_and_counts_its_budget() -> None:
    node = Node()
    node.enqueue("k")
    (grant,) = node.lease().grants
    assert (grant.in_doubt_ms, grant.attempt, grant.budget_attempt) == (None, 1, 1)


def test_an_expired_lease_leaves_its_deadline_as_the_in_doubt_deadline() -> None:
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(1000,), tier_jitter_ratio=0.0)))
    message_id = node.enqueue("k")
    (first,) = node.lease().grants
    node.now_ms += 30_000  # the worker died: its lease expires, the retry is due a tier later
    assert node.lease().grants == ()
    node.now_ms += 1000
    (second,) = node.lease().grants
    assert second.message_id == message_id and second.previous_error_class == "lease_expired"
    assert second.in_doubt_ms == first.deadline_ms - node.now_ms == -1000  # passed a second ago
    assert second.budget_attempt == 2


def test_a_reported_in_doubt_time_holds_the_retry_back_and_reaches_the_next_grant() -> None:
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(100,), tier_jitter_ratio=0.0)))
    message_id = node.enqueue("k")
    (grant,) = node.lease().grants
    failed = node.apply(Fail(message_id=message_id, token=grant.token, error_class="timeout", in_doubt_ms=4000))
    assert failed == Outcome(code=Code.OK, message_id=message_id, state=State.DELAYED, due_ms=node.now_ms + 4000)
    node.now_ms += 3999
    assert node.lease().grants == ()
    node.now_ms += 1
    (again,) = node.lease().grants
    assert again.in_doubt_ms == 0
    # A known outcome (0) moves the deadline neither back nor on; an unreported one assumes the lease's end.
    node.now_ms += 50
    node.apply(Fail(message_id=message_id, token=again.token, error_class="rate_limited", in_doubt_ms=0))
    node.now_ms += 100
    (third,) = node.lease().grants
    assert third.in_doubt_ms == -150
    node.apply(Fail(message_id=message_id, token=third.token, error_class="timeout"))
    node.now_ms += 100
    (fourth,) = node.lease().grants
    assert fourth.in_doubt_ms == third.deadline_ms - node.now_ms == 30_000 - 100


def test_a_reported_in_doubt_time_never_outlasts_the_lease() -> None:
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(10,), tier_jitter_ratio=0.0)))
    message_id = node.enqueue("k")
    (grant,) = node.lease().grants
    node.now_ms += 29_000
    failed = node.apply(Fail(message_id=message_id, token=grant.token, error_class="timeout", in_doubt_ms=600_000))
    assert isinstance(failed, Outcome) and failed.due_ms == grant.deadline_ms


def test_an_interrupted_release_waits_for_its_requests_and_a_plain_one_changes_nothing() -> None:
    node = Node()
    message_id = node.enqueue("k")
    (grant,) = node.lease().grants
    released = node.apply(Release(message_id=message_id, token=grant.token, interrupted=True, in_doubt_ms=2000))
    assert released == Outcome(code=Code.OK, message_id=message_id, state=State.DELAYED, due_ms=node.now_ms + 2000)
    node.now_ms += 2000
    (again,) = node.lease().grants
    assert (again.in_doubt_ms, again.budget_attempt) == (0, 1)  # a release is not counted
    node.now_ms += 500
    plain = node.apply(Release(message_id=message_id, token=again.token, in_doubt_ms=9000))  # nothing was sent
    assert plain == Outcome(code=Code.OK, message_id=message_id, state=State.READY, due_ms=node.now_ms)
    (third,) = node.lease().grants
    assert third.in_doubt_ms == -500


def test_a_redriven_dead_letter_starts_a_new_budget_and_keeps_its_in_doubt_deadline() -> None:
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(100,), tier_jitter_ratio=0.0, attempts_max=2)))
    message_id = node.enqueue("k")
    (first,) = node.lease().grants
    node.apply(Fail(message_id=message_id, token=first.token, error_class="timeout", in_doubt_ms=1000))
    node.now_ms += 1000
    (second,) = node.lease().grants
    assert second.budget_attempt == 2
    node.apply(Fail(message_id=message_id, token=second.token, error_class="unknown_outcome", permanent=True,
                    in_doubt_ms=0))  # fmt: skip
    node.now_ms += 60_000
    assert node.apply(Redrive(actor="finance", reason="paid by hand? no: send", ids=(message_id,))).code is Code.OK
    (third,) = node.lease().grants
    assert (third.previous_error_class, third.attempt, third.budget_attempt) == ("unknown_outcome", 3, 1)
    assert third.in_doubt_ms == -60_000


def test_an_edited_version_inherits_what_its_predecessors_still_have_in_doubt() -> None:
    """A transfer dead after a timeout, edited at once: the new version is a new message, but the
    old request may still land; its first grant says for how long (issue 20's edited redrive)."""
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(100,), tier_jitter_ratio=0.0, attempts_max=1)))
    message_id = node.enqueue("k")
    (first,) = node.lease().grants
    node.apply(Fail(message_id=message_id, token=first.token, error_class="timeout", in_doubt_ms=5000))
    node.now_ms += 1000
    edited = node.apply(EditRedrive(message_id=message_id, payload=b'{"v": 2}', actor="finance", reason="amount"))
    assert isinstance(edited, ReviewResult) and edited.code is Code.OK
    (v2_id,) = edited.new_ids
    (v2,) = node.lease().grants
    assert (v2.message_id, v2.attempt, v2.in_doubt_ms) == (v2_id, 1, 4000)
    node.apply(Fail(message_id=v2_id, token=v2.token, error_class="invalid_account", permanent=True, in_doubt_ms=0))
    node.now_ms += 1000
    edited = node.apply(EditRedrive(message_id=v2_id, payload=b'{"v": 3}', actor="finance", reason="account"))
    assert isinstance(edited, ReviewResult) and edited.code is Code.OK
    (v3,) = node.lease().grants
    assert (v3.attempt, v3.in_doubt_ms) == (1, 3000)  # the first version's request, two edits back
    node.apply(Fail(message_id=v3.message_id, token=v3.token, error_class="invalid_account", permanent=True,
                    in_doubt_ms=0))  # fmt: skip
    node.now_ms += 10_000
    edited = node.apply(EditRedrive(message_id=v3.message_id, payload=b'{"v": 4}', actor="finance", reason="again"))
    assert isinstance(edited, ReviewResult) and edited.code is Code.OK
    (v4,) = node.lease().grants
    assert (v4.attempt, v4.in_doubt_ms) == (1, None)  # every earlier request's deadline has passed


def test_retry_after_is_a_duration_the_store_adds_to_its_own_time() -> None:
    """Whatever the worker's clock says: the retry is due the entry's time plus the Retry-After.
    An old entry's absolute `not_before_ms` still applies as it did (a replayed log ends the same)."""
    node = Node()
    node.apply(SetPolicy(kind="transfer", policy=RetryPolicy(tiers_ms=(1000,), tier_jitter_ratio=0.0,
                                                             retry_after_max_ms=60_000)))  # fmt: skip
    first, second = node.enqueue("a"), node.enqueue("b")
    by_id = {grant.message_id: grant for grant in node.lease(count_max=2).grants}
    now_ms = node.now_ms
    throttled = node.apply(Fail(message_id=first, token=by_id[first].token, error_class="rate_limited",
                                retry_after_ms=3000))  # fmt: skip
    assert throttled == Outcome(code=Code.OK, message_id=first, state=State.DELAYED, due_ms=now_ms + 3000)
    legacy = node.apply(Fail(message_id=second, token=by_id[second].token, error_class="rate_limited",
                             not_before_ms=now_ms + 7000))  # fmt: skip
    assert legacy == Outcome(code=Code.OK, message_id=second, state=State.DELAYED, due_ms=now_ms + 7000)


def test_a_document_written_with_an_expected_version_is_a_compare_and_set() -> None:
    """Two writers read version 1; the first write wins, the second changes nothing and learns
    the version now; a write without an expected version is unconditional, as before."""
    node = Node()
    conn = node.machine.view
    node.apply(PutDocument(namespace="sets", name="table", body=b'{"epochs":1}', actor="ops"))
    first = node.apply(PutDocument(namespace="sets", name="table", body=b'{"epochs":2}', actor="alice",
                                   expected_version=1))  # fmt: skip
    assert first == DocumentResult(code=Code.OK, version=2)
    second = node.apply(PutDocument(namespace="sets", name="table", body=b'{"epochs":3}', actor="bob",
                                    expected_version=1))  # fmt: skip
    assert second == DocumentResult(code=Code.CONFLICT, version=2)
    (view,) = documents.documents(conn, "sets")
    assert (view.body, view.updated_by, documents.version(conn, "sets")) == (b'{"epochs":2}', "alice", 2)
    events = [e for e in queries.events_after(conn, 0) if e.type is EventType.DOCUMENT_PUT]
    assert [e.data["actor"] for e in events] == ["ops", "alice"]  # the refused write left no trace
    assert node.apply(PutDocument(namespace="sets", name="table", body=b"{}", actor="ops")).code is Code.OK
    old = msgspec.msgpack.encode(PutDocument(namespace="sets", name="t", body=b"{}", actor="ops", reason="r"))
    assert b"expected_version" not in old  # a command without one encodes as the version before's did
