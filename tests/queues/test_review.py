"""Finance review in the state machine: edit-and-redrive as a new version, four-eyes proposals and
their approval in one command, and the audit hash chain every operator command writes.

In process, through `apply_batch` bytes (tests/queues/queue_node.py). The command line's verify
over a copied store file and over a running store is in tests/compensator/test_audit_command.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from queue_node import Node

from delay.policy import DEFAULT_POLICY
from queues import codec
from queues import query_codec as qc
from queues.audit_filter import AuditFilter
from queues.core import audit_chain, operator, proposals
from queues.core import reads as queries
from queues.core.answers import answer_query
from queues.core.keys import u64
from queues.core.port import KvWrite, Table
from queues.core.records import audit_decoder, encode
from queues.machine import QueueMachine
from queues.model import (
    Ack,
    Approve,
    AuditEntry,
    BatchResult,
    Code,
    DeadLetterFilter,
    Discard,
    EditRedrive,
    Enqueue,
    EnqueueResult,
    MessageView,
    Outcome,
    PauseKind,
    ProposalState,
    Propose,
    PutDocument,
    PutToken,
    QueueCommand,
    Redrive,
    Reject,
    ResumeKind,
    ReviewResult,
    RevokeToken,
    Role,
    SetPolicy,
    SetQuota,
    SetRetention,
    State,
)
from queues.replicated import ReplicatedQueueMachine
from queues.stores.lmdb_store import LmdbStore

HOUR_MS = 3_600_000


def dead(node: Node, *keys: str) -> list[int]:
    """Messages enqueued and dead-lettered by a permanent failure, in key order."""
    ids = [node.enqueue(key) for key in keys]
    for grant in node.lease(len(keys)).grants:
        node.kill(grant.message_id, grant.token)
    return ids


def review(node: Node, command: QueueCommand) -> ReviewResult:
    result = node.apply(command)
    assert isinstance(result, ReviewResult), result
    return result


def chain(node: Node) -> list[AuditEntry]:
    return audit_chain.entries_after(node.machine.view, 0)


def dump(node: Node) -> dict[str, object]:
    """The whole state but the applied index (which every command moves, refused or not)."""
    state = node.machine.canonical()
    del state["applied_index"]
    return state


def message(node: Node, message_id: int) -> MessageView:
    view = queries.get_message(node.machine.view, message_id, now_ms=node.now_ms)
    assert view is not None
    return view


# ---- edit and redrive ---------------------------------------------------------------------------
def test_an_edit_goes_out_as_a_new_version_and_the_original_is_kept_unchanged() -> None:
    node = Node()
    (original,) = dead(node, "req-1")
    before = message(node, original)
    result = review(node, EditRedrive(message_id=original, payload=b'{"amount": 5}', actor="alice", reason="typo"))
    assert result.code is Code.OK and result.ids == (original,)
    (new_id,) = result.new_ids
    kept, new = message(node, original), message(node, new_id)
    assert kept.payload == before.payload == b"req-1" and kept.history == before.history
    assert (kept.state, kept.superseded_by, kept.version) == (State.DISCARDED, new_id, 1)
    assert (new.state, new.payload, new.version, new.previous_id) == (State.READY, b'{"amount": 5}', 2, original)
    assert (new.kind, new.ref_key, new.idempotency_key, new.attempts) == (kept.kind, kept.ref_key, "req-1#v2", 0)
    grant = node.lease().grants[0]
    assert (grant.message_id, grant.payload, grant.idempotency_key) == (new_id, b'{"amount": 5}', "req-1#v2")
    node.kill(grant.message_id, grant.token)
    third = review(node, EditRedrive(message_id=new_id, payload=b'{"amount": 6}', actor="bob", reason="again"))
    assert message(node, third.new_ids[0]).idempotency_key == "req-1#v3"  # never req-1#v2#v3
    assert message(node, third.new_ids[0]).version == 3
    (entry,) = [e for e in chain(node) if e.action == "edit_redrive" and e.actor == "alice"]
    assert '"payload":"req-1"' in entry.before and '"payload":"{\\"amount\\": 5}"' in entry.after
    timeline = audit_chain.message_entries(node.machine.view, [new_id])
    assert [e.seq for e in timeline] == [entry.seq, *(e.seq for e in chain(node) if e.actor == "bob")]


def test_an_edit_that_cannot_be_applied_is_refused_and_changes_nothing() -> None:
    node = Node()
    first, second = dead(node, "a", "b")
    node.enqueue("a#v2")  # a request whose key is the one the edit of "a" would take
    done = node.enqueue("c")
    grant = next(g for g in node.lease(10).grants if g.message_id == done)
    assert node.apply(Ack(message_id=done, token=grant.token)).code is Code.OK
    snapshot = dump(node)
    cases = [
        (EditRedrive(message_id=first, payload=b"new", actor="x", reason="r"), Code.CONFLICT),
        (EditRedrive(message_id=second, payload=b"b", actor="x", reason="same payload"), Code.INVALID),
        (EditRedrive(message_id=done, payload=b"new", actor="x", reason="done already"), Code.ILLEGAL_STATE),
        (EditRedrive(message_id=999, payload=b"new", actor="x", reason="no such"), Code.NOT_FOUND),
    ]
    for command, code in cases:
        result = review(node, command)
        assert result.code is code and result.new_ids == () and result.refused == ((command.message_id, code),)
    assert dump(node) == snapshot


# ---- four eyes ----------------------------------------------------------------------------------
def test_the_proposer_cannot_approve_their_own_and_a_second_person_releases_it_in_one_command() -> None:
    node = Node()
    ids = dead(node, "a", "b")
    proposal = review(node, Propose(action=Redrive(actor="alice", reason="fixed", ids=tuple(ids)), ttl_ms=HOUR_MS))
    assert (proposal.code, proposal.proposal_state, proposal.ids) == (Code.OK, ProposalState.PENDING, tuple(ids))
    assert all(message(node, i).state is State.DEAD for i in ids)  # a proposal does nothing yet
    entries = len(chain(node))
    snapshot = dump(node)
    own = review(node, Approve(proposal_id=proposal.proposal_id, approver="alice"))
    assert own.code is Code.OWN_PROPOSAL and own.proposal_state is ProposalState.PENDING
    assert dump(node) == snapshot
    approved = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob", reason="checked"))
    assert (approved.code, approved.proposal_state, approved.ids) == (Code.OK, ProposalState.APPROVED, tuple(ids))
    assert all(message(node, i).state is State.READY for i in ids)
    added = chain(node)[entries:]
    assert [(e.actor, e.action) for e in added] == [("bob", "approve"), ("alice", "redriven"), ("alice", "redriven")]
    assert len({e.log_index for e in added}) == 1  # the approval and its action: one log entry
    assert all('"approved_by":"bob"' in e.after and '"proposal":1' in e.after for e in added[1:])
    again = review(node, Approve(proposal_id=proposal.proposal_id, approver="carol"))
    assert again.code is Code.ILLEGAL_STATE and again.proposal_state is ProposalState.APPROVED


def test_an_expired_proposal_is_refused_recorded_as_expired_and_nothing_is_done() -> None:
    node = Node()
    (target,) = dead(node, "a")
    action = Discard(message_id=target, actor="alice", reason="duplicate of 7", reason_code="duplicate")
    proposal = review(node, Propose(action=action, ttl_ms=HOUR_MS))
    node.now_ms += HOUR_MS
    late = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert (late.code, late.proposal_state) == (Code.EXPIRED, ProposalState.EXPIRED)
    assert message(node, target).state is State.DEAD
    assert chain(node)[-1].action == "expire" and chain(node)[-1].target == f"proposal:{proposal.proposal_id}"
    (view,) = proposals.get(node.machine.view, [proposal.proposal_id], now_ms=node.now_ms)
    assert view.state is ProposalState.EXPIRED
    assert review(node, Reject(proposal_id=1, actor="bob", reason="late")).code is Code.EXPIRED


def test_an_approval_is_refused_whole_when_no_target_can_be_acted_on_any_more() -> None:
    node = Node()
    (target,) = dead(node, "a")
    proposal = review(node, Propose(action=Redrive(actor="alice", reason="r", ids=(target,)), ttl_ms=HOUR_MS))
    assert isinstance(node.apply(Discard(message_id=target, actor="carol", reason="paid by hand")), Outcome)
    entries = len(chain(node))
    refused = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert refused.code is Code.ILLEGAL_STATE and refused.refused == ((target, Code.ILLEGAL_STATE),)
    assert refused.proposal_state is ProposalState.PENDING and len(chain(node)) == entries
    withdrawn = review(node, Reject(proposal_id=proposal.proposal_id, actor="alice", reason="moot"))
    assert withdrawn.proposal_state is ProposalState.REJECTED and chain(node)[-1].action == "withdraw"


def test_a_filter_proposal_keeps_the_ids_shown_and_never_what_matches_later() -> None:
    node = Node()
    shown = dead(node, "a", "b")
    redrive = Redrive(actor="alice", reason="bulk", filter=DeadLetterFilter(kind="transfer"), limit=100)
    proposal = review(node, Propose(action=redrive, ttl_ms=HOUR_MS))
    assert proposal.ids == tuple(shown)
    (later,) = dead(node, "c")
    approved = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert approved.ids == tuple(shown) and message(node, later).state is State.DEAD


def test_the_approval_and_its_action_roll_back_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = str(tmp_path / "queue.lmdb")
    node = Node.over(QueueMachine(path))
    (target,) = dead(node, "a")
    proposal = review(node, Propose(action=Redrive(actor="alice", reason="r", ids=(target,)), ttl_ms=HOUR_MS))
    node.machine.checkpoint()

    def crash(*_: object, **__: object) -> BatchResult:
        raise RuntimeError("crash between the approval and its action")

    monkeypatch.setattr(operator, "redrive", crash)
    with pytest.raises(RuntimeError):
        node.apply(Approve(proposal_id=proposal.proposal_id, approver="bob"))
    monkeypatch.undo()
    (view,) = proposals.get(node.machine.view, [proposal.proposal_id], now_ms=node.now_ms)
    assert view.state is ProposalState.PENDING and message(node, target).state is State.DEAD
    assert [e.action for e in chain(node)] == ["propose"]
    # A crash after the apply but before the store's next checkpoint: the restart has neither,
    # and the replayed entry does both.
    committed = node.machine.applied_index()
    assert review(node, Approve(proposal_id=proposal.proposal_id, approver="bob")).code is Code.OK
    store = node.machine.store
    assert isinstance(store, LmdbStore)
    store.abandon()  # no checkpoint, no clean stop: what a kill -9 leaves
    restarted = Node.over(QueueMachine(path))
    restarted.index = restarted.machine.applied_index()
    assert restarted.index == committed
    assert message(restarted, target).state is State.DEAD and [e.action for e in chain(restarted)] == ["propose"]
    replay = review(restarted, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert replay.code is Code.OK and message(restarted, target).state is State.READY
    assert [e.action for e in chain(restarted)] == ["propose", "approve", "redriven"]
    restarted.machine.close()


# ---- the audit chain ----------------------------------------------------------------------------
def operator_commands(ids: list[int]) -> list[QueueCommand]:
    return [
        PauseKind(kind="transfer", holder="op", reason="outage", actor="carol"),
        ResumeKind(kind="transfer", holder="op", actor="carol"),
        SetPolicy(kind="transfer", policy=DEFAULT_POLICY, actor="carol", reason="same"),
        SetRetention(actor="carol", reason="longer", retention_ms=10 * 86_400_000),
        PutToken(name="svc", role=Role.PRODUCER, secret_hash=bytes(32), actor="carol"),
        SetQuota(name="svc", actor="carol", rate_per_s=5),
        RevokeToken(name="svc", actor="carol", reason="leaked"),
        PutDocument(namespace="breakers", name="payment", body=b'{"mode": "open"}', actor="carol", reason="r"),
        Redrive(actor="alice", reason="retry", ids=(ids[0],)),
        Discard(message_id=ids[1], actor="alice", reason="dup", reason_code="duplicate"),
        EditRedrive(message_id=ids[2], payload=b"edited", actor="alice", reason="fix"),
        Propose(action=Redrive(actor="alice", reason="r", ids=(ids[3],)), ttl_ms=HOUR_MS),
        Approve(proposal_id=1, approver="bob"),
    ]


def test_every_operator_command_writes_its_entry_in_the_same_apply_and_refusals_write_none() -> None:
    node = Node()
    ids = dead(node, "a", "b", "c", "d")
    expected = ["paused", "resumed", "policy_set", "retention_set", "token_put", "quota_set", "token_revoked",
                "document_put", "redriven", "discarded", "edit_redrive", "propose", "approve"]  # fmt: skip
    for command, action in zip(operator_commands(ids), expected, strict=True):
        before = len(chain(node))
        assert node.apply(command).code is Code.OK
        added = chain(node)[before:]
        assert added[0].action == action and added[0].log_index == node.index, (command, added)
    assert chain(node)[-1].action == "redriven"  # the approved action, after its approval
    discard = next(e for e in chain(node) if e.action == "discarded")
    assert (discard.actor, discard.target, discard.reason) == ("alice", f"message:{ids[1]}", "dup")
    assert discard.before == '{"state":"dead"}' and discard.after == '{"reason_code":"duplicate","state":"discarded"}'
    before = len(chain(node))
    for refused in (Discard(message_id=ids[1], actor="x", reason="again"), ResumeKind(kind="transfer", holder="op"),
                    RevokeToken(name="nobody", actor="x"), Approve(proposal_id=1, approver="carol")):  # fmt: skip
        assert node.apply(refused).code is not Code.OK
    assert len(chain(node)) == before
    assert audit_chain.verify(node.machine.view) == (len(chain(node)), None)


def test_the_chain_is_identical_on_three_replicas() -> None:
    replicas = [Node() for _ in range(3)]

    def everywhere(command: QueueCommand) -> None:
        answers = {codec.encode_result(node.apply(command)) for node in replicas}
        assert len(answers) == 1

    for key in ("a", "b", "c", "d"):
        everywhere(Enqueue(kind="transfer", idempotency_key=key, ref_key="r", payload=key.encode()))
    lease = replicas[0].lease(4)
    for node in replicas[1:]:
        assert node.lease(4) == lease
    for grant in lease.grants:
        for node in replicas:
            node.kill(grant.message_id, grant.token)
    for command in operator_commands([g.message_id for g in lease.grants]):
        everywhere(command)
        for node in replicas:
            node.now_ms += 17
    heads = {audit_chain.head(node.machine.view) for node in replicas}
    assert len(heads) == 1 and next(iter(heads)).count == 14
    assert chain(replicas[0]) == chain(replicas[1]) == chain(replicas[2])


def test_verify_names_the_first_broken_entry_of_a_tampered_copy(tmp_path: Path) -> None:
    path = tmp_path / "queue.lmdb"
    node = Node.over(QueueMachine(str(path)))
    for command in operator_commands(dead(node, "a", "b", "c", "d")):
        node.apply(command)
    node.machine.close()

    def tampered(name: str, change: Callable[[KvWrite], None]) -> audit_chain.Broken | None:
        copy = tmp_path / f"copy-{name}.lmdb"
        copy.write_bytes(path.read_bytes())
        store = LmdbStore(copy)
        with store.write() as tx:
            change(tx)
        try:
            return audit_chain.verify(store.read())[1]
        finally:
            store.close()

    def altered(seq: int, **fields: object) -> Callable[[KvWrite], None]:
        def change(tx: KvWrite) -> None:
            row = audit_decoder.decode(tx.get(Table.AUDIT, u64(seq)) or b"")
            tx.put(Table.AUDIT, u64(seq), encode(msgspec.structs.replace(row, **fields)))

        return change

    def removed(seq: int) -> Callable[[KvWrite], None]:
        def change(tx: KvWrite) -> None:
            assert tx.delete(Table.AUDIT, u64(seq))

        return change

    store = LmdbStore(path, readonly=True)
    assert audit_chain.verify(store.read()) == (14, None)
    entry = audit_chain.entries_after(store.read(), 3, limit=1)[0]
    store.close()
    content = tampered("content", altered(9, reason="nothing to see"))
    assert content is not None and content.seq == 9 and "content does not match its hash" in content.describe()
    forged = audit_chain.entry_hash(
        seq=4, log_index=entry.log_index, ts_ms=entry.ts_ms, actor="mallory", action=entry.action, target=entry.target,
        reason=entry.reason, before=entry.before, after=entry.after, prev_hash=entry.prev_hash,
    )  # fmt: skip
    rehashed = tampered("rehashed", altered(4, actor="mallory", hash=forged))
    assert rehashed is not None and rehashed.seq == 5 and "entry 4 or this link was altered" in rehashed.problem
    relinked = tampered("relinked", altered(5, prev_hash=bytes(32)))
    assert relinked is not None and relinked.seq == 5 and "previous hash" in relinked.problem
    gone = tampered("removed", removed(6))
    assert gone is not None and gone.seq == 6 and "missing" in gone.problem
    cut = tampered("cut", removed(14))
    assert cut is not None and cut.seq == 14 and "head says 14" in cut.problem


# ---- reads and the wire -------------------------------------------------------------------------
def test_queries_answer_the_audit_log_a_message_timeline_and_proposals() -> None:
    node = Node.over(ReplicatedQueueMachine(":memory:"))
    ids = dead(node, "a", "b")
    review(node, Propose(action=Discard(message_id=ids[0], actor="alice", reason="r", reason_code="other"),
                         ttl_ms=HOUR_MS))  # fmt: skip
    review(node, Propose(action=Redrive(actor="alice", reason="r", ids=(ids[1],)), ttl_ms=2 * HOUR_MS))
    review(node, Approve(proposal_id=2, approver="bob"))
    conn, now_ms = node.machine.view, node.now_ms

    def ask(query: qc.QueueQuery) -> qc.QueryAnswer:
        answer = qc.decode_answer(qc.encode_answer(answer_query(conn, query, now_ms)))
        assert qc.decode_query(qc.encode_query(query)) == query
        return answer

    forward = ask(qc.AuditLog(after=0, limit=2))
    assert isinstance(forward, qc.AuditAnswer) and [e.seq for e in forward.entries] == [1, 2]
    assert forward.count == 4 and forward.head == audit_chain.head(conn).hash
    newest = ask(qc.AuditLog(limit=2))
    assert isinstance(newest, qc.AuditAnswer) and [e.seq for e in newest.entries] == [4, 3]
    timeline = ask(qc.MessageAudit(ids=(ids[1],)))
    assert isinstance(timeline, qc.AuditAnswer) and [e.action for e in timeline.entries] == ["propose", "approve",
                                                                                          "redriven"]  # fmt: skip
    pending = ask(qc.Proposals(pending_only=True))
    assert isinstance(pending, qc.ProposalsAnswer) and [p.proposal_id for p in pending.proposals] == [1]
    everything = ask(qc.Proposals())
    assert isinstance(everything, qc.ProposalsAnswer)
    assert [(p.proposal_id, p.state, p.decided_by) for p in everything.proposals] == [
        (2, ProposalState.APPROVED, "bob"), (1, ProposalState.PENDING, None)]  # fmt: skip
    later = answer_query(conn, qc.Proposals(ids=(1,)), now_ms + HOUR_MS)
    assert isinstance(later, qc.ProposalsAnswer) and later.proposals[0].state is ProposalState.EXPIRED
    key = ask(qc.ByIdempotencyKeys(keys=("a" * 128 + "#v2",)))
    assert isinstance(key, qc.MessagesAnswer) and key.messages == ()


def test_the_audit_log_is_filtered_in_the_store_and_its_pages_stay_full() -> None:
    node = Node.over(ReplicatedQueueMachine(":memory:"))
    ids = dead(node, "a", "b", "c")
    for name in ("s1", "s2", "s3"):  # what every login writes: a session and the login record
        node.apply(PutDocument(namespace="sessions", name=name, body=b"{}", actor="ann", reason="login"))
        node.apply(PutDocument(namespace="logins", name="ann", body=b"{}", actor="ann", reason="login"))
    node.apply(PutDocument(namespace="users", name="bob", body=b"{}", actor="admin", reason="user added"))
    node.now_ms += HOUR_MS
    later = node.now_ms
    review(node, Propose(action=Discard(message_id=ids[0], actor="ann", reason="r", reason_code="other"),
                         ttl_ms=HOUR_MS))  # fmt: skip
    review(node, Approve(proposal_id=1, approver="bob"))
    node.apply(Redrive(actor="ann", reason="r", ids=(ids[1], ids[2])))
    conn = node.machine.view
    sign_ins = ("document:sessions/", "document:logins/")

    def page(before: int | None = None, limit: int = 100, **fields: object) -> list[tuple[int, str, str, str]]:
        query = qc.AuditLog(before=before, limit=limit, filter=AuditFilter(**fields))  # type: ignore[arg-type]
        answer = qc.decode_answer(qc.encode_answer(answer_query(conn, query, node.now_ms)))
        assert isinstance(answer, qc.AuditAnswer) and answer.count == 12
        return [(e.seq, e.actor, e.action, e.target) for e in answer.entries]

    assert len(page()) == 12
    ann = page(actor="ann", exclude_target_prefixes=sign_ins)
    assert [(a, b, c) for _, a, b, c in ann] == [
        ("ann", "redriven", f"message:{ids[2]}"), ("ann", "redriven", f"message:{ids[1]}"),
        ("ann", "discarded", f"message:{ids[0]}"), ("ann", "propose", "proposal:1")]  # the approved action is ann's
    assert [e[2] for e in page(actor="ann")].count("document_put") == 6  # sign-ins shown when asked
    assert [e[2:] for e in page(exclude_target_prefixes=sign_ins, limit=2)] == [
        ("redriven", f"message:{ids[2]}"), ("redriven", f"message:{ids[1]}")]  # fmt: skip
    first = page(exclude_target_prefixes=sign_ins, limit=2)
    rest = page(before=first[-1][0], exclude_target_prefixes=sign_ins, limit=3)  # full, not thinned by the filter
    assert [e[2:] for e in rest] == [("discarded", f"message:{ids[0]}"), ("approve", "proposal:1"),
                                     ("propose", "proposal:1")]  # fmt: skip
    assert [e[2] for e in page(actions=("approve", "propose"))] == ["approve", "propose"]
    assert [e[3] for e in page(target="proposal:1")] == ["proposal:1", "proposal:1"]
    assert [e[3] for e in page(target_prefix="document:users/")] == ["document:users/bob"]
    assert [e[2] for e in page(target_prefix="document:logins/")] == ["document_put"] * 3
    assert [e[2] for e in page(message_id=ids[0])] == ["discarded", "approve", "propose"]
    assert len(page(from_ms=later)) == 5 and len(page(to_ms=later)) == 7
    assert page(from_ms=later, to_ms=later + 1, actor="bob") == page(actor="bob")[:1]

    # the wire: an unfiltered query is the bytes it was before filters, and an old client's decodes the same
    old = b"\x01" + msgspec.msgpack.encode({"q": "audit", "now_ms": None, "after": None, "before": None, "limit": 5})
    assert qc.decode_query(old) == qc.AuditLog(limit=5)
    assert msgspec.msgpack.decode(qc.encode_query(qc.AuditLog(limit=5))[1:]) == {"q": "audit", "limit": 5}
    unknown = b"\x01" + msgspec.msgpack.encode({"q": "audit", "filter": {"actor": "ann", "colour": "red"}})
    empty = b"\x01" + msgspec.msgpack.encode({"q": "audit", "filter": {"from_ms": 5, "to_ms": 5}})
    for refused in (unknown, empty):
        answer = qc.decode_query(refused)
        assert isinstance(answer, qc.QueryError) and answer.code is qc.QueryErrorCode.INVALID, answer


def test_the_codec_round_trips_the_review_commands_and_refuses_bad_ones() -> None:
    commands: list[QueueCommand] = [
        EditRedrive(message_id=1, payload=b"{}", actor="a", reason="r", headers={"traceparent": "x"}),
        Propose(action=Discard(message_id=1, actor="a", reason="r", reason_code="duplicate"), ttl_ms=HOUR_MS),
        Propose(action=Redrive(actor="a", reason="r", filter=DeadLetterFilter(kind="transfer")), ttl_ms=HOUR_MS),
        Approve(proposal_id=3, approver="b"),
        Reject(proposal_id=3, actor="b", reason="no"),
    ]
    for command in commands:
        assert codec.decode_command(codec.encode_command(command)) == command
    for bad in (
        {"t": "propose", "action": {"t": "enqueue"}, "ttl_ms": HOUR_MS},
        {"t": "propose", "action": {"t": "discard", "message_id": 1, "actor": "a", "reason": "r"}, "ttl_ms": 1},
        {"t": "reject", "proposal_id": 1, "actor": "b", "reason": ""},
        {"t": "edit_redrive", "message_id": 1, "payload": b"x", "actor": "a", "reason": ""},
    ):
        decoded = codec.decode_command(bytes([codec.CODEC_VERSION]) + msgspec.msgpack.encode(bad))
        assert not isinstance(decoded, Enqueue) and getattr(decoded, "code", None) is Code.INVALID


def test_an_enqueue_result_is_unaffected() -> None:
    node = Node()
    result = node.apply(Enqueue(kind="transfer", idempotency_key="k", ref_key="r", payload=b"p"))
    assert isinstance(result, EnqueueResult) and result.code is Code.OK
    assert chain(node) == []  # only operators' actions are audited
