"""Redrive jobs in the state machine: a result per item written with its redrive, the rate kept by
the leader's time, pause, resume and cancel, refusals of items that changed, four eyes that start
the job in the approval's apply, the audit entries, and a replayed entry after a crash.

In process, through `apply_batch` bytes (tests/queues/queue_node.py), with the helpers of
test_review.py. The driver and three processes: test_jobs_replicated.py.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from queue_node import Node
from test_review import chain, dead, dump, message, review

from queues import codec
from queues import query_codec as qc
from queues.core import audit_chain, jobs, proposals
from queues.core.answers import answer_query
from queues.machine import QueueMachine
from queues.model import (
    Approve,
    Code,
    ControlJob,
    Discard,
    ErrorResult,
    ItemResult,
    JobAction,
    JobItem,
    JobState,
    JobStepResult,
    JobView,
    Propose,
    QueueCommand,
    Redrive,
    RedriveJob,
    ReviewResult,
    State,
    StepJob,
)
from queues.replicated import ReplicatedQueueMachine
from queues.stores.lmdb_store import LmdbStore

HOUR_MS = 3_600_000


def step(node: Node, job_id: int = 1, limit: int = 1000) -> JobStepResult:
    result = node.apply(StepJob(job_id=job_id, limit=limit))
    assert isinstance(result, JobStepResult), result
    return result


def job(node: Node, job_id: int = 1) -> JobView:
    (view,) = jobs.listing(node.machine.view, ids=(job_id,))
    return view


def items(node: Node, job_id: int = 1, result: ItemResult | None = None) -> list[JobItem]:
    return jobs.items(node.machine.view, job_id, limit=1000, result=result)


def control(node: Node, action: JobAction, job_id: int = 1) -> ReviewResult:
    return review(node, ControlJob(job_id=job_id, action=action, actor="carol", reason=f"{action.value} it"))


def unchanged(node: Node) -> list[str]:
    """The store but its clock (the time of the last entry applied, which every entry moves)."""
    return [line for line in dump(node) if "queue_meta" not in line]


def keys(count: int) -> list[str]:
    return [f"k{i:03}" for i in range(count)]


def test_each_item_is_redriven_in_id_order_with_its_result_and_the_job_ends_done() -> None:
    node = Node()
    ids = dead(node, *keys(5))
    started = review(node, RedriveJob(actor="alice", reason="funds back", ids=tuple(reversed(ids)), rate_per_s=10))
    assert (started.code, started.job_id, started.refused, started.ids) == (Code.OK, 1, (), ())
    created = chain(node)[-1]
    assert (created.actor, created.action, created.target) == ("alice", "redrive_job", "job:1")
    assert '"count":5' in created.after and '"rate_per_s":10' in created.after
    view = job(node)
    assert (view.state, view.total, view.pending, view.rate_per_s, view.last_step_ms) == (JobState.RUNNING, 5, 5, 10,
                                                                                         None)  # fmt: skip
    node.now_ms += 300  # 10 a second: three items
    first = step(node)
    assert (first.redriven, first.pending, first.state) == (tuple(ids[:3]), 2, JobState.RUNNING)
    assert [message(node, i).state for i in ids] == [State.READY] * 3 + [State.DEAD] * 2
    for item in items(node)[:3]:
        assert (item.result, item.code, item.done_ms) == (ItemResult.REDRIVEN, "", node.now_ms)
    entries = [e for e in chain(node) if e.action == "redriven"]
    assert [e.target for e in entries] == [f"message:{i}" for i in ids[:3]]
    assert all('"job":1' in e.after and e.actor == "alice" and e.log_index == node.index for e in entries)
    node.now_ms += 1000
    last = step(node)
    assert (last.redriven, last.pending, last.state, last.next_step_ms) == (tuple(ids[3:]), 0, JobState.DONE, None)
    view = job(node)
    assert (view.state, view.redriven, view.pending, view.finished_ms) == (JobState.DONE, 5, 0, node.now_ms)
    assert chain(node)[-1].action == "job_done"
    after_done = step(node)
    assert (after_done.code, after_done.redriven) == (Code.ILLEGAL_STATE, ())
    assert audit_chain.verify(node.machine.view) == (len(chain(node)), None)


def test_the_rate_is_the_machines_by_leader_time_whoever_steps_and_however_often() -> None:
    node = Node()
    ids = dead(node, *keys(40))
    review(node, RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=5))
    assert step(node).redriven == ()  # no time has passed since it was created: nothing allowed yet
    done: list[int] = []
    for _ in range(20):  # two drivers every 150 ms for 3 s: 5 a second is 15 items, whoever asks
        node.now_ms += 150
        for _driver in range(2):
            result = step(node, limit=300)
            done += result.redriven
            if not result.redriven:
                assert result.next_step_ms is not None and result.next_step_ms > node.now_ms
    assert done == ids[:15]  # the fraction of each 150 ms is kept, not lost at every step
    node.now_ms += 60_000  # a long quiet spell allows one second's worth at most (the burst)
    assert len(step(node, limit=300).redriven) == 5
    node.now_ms += 10_000
    assert len(step(node, limit=2).redriven) == 2  # and never more than the limit
    assert job(node).redriven == 22


def test_a_cancel_halfway_leaves_the_rest_dead_and_reported_not_redriven() -> None:
    node = Node()
    ids = dead(node, *keys(10))
    review(node, RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=4))
    node.now_ms += 1000
    assert step(node).redriven == tuple(ids[:4])
    cancelled = control(node, JobAction.CANCEL)
    assert (cancelled.code, cancelled.job_id) == (Code.OK, 1)
    entry = chain(node)[-1]
    assert (entry.actor, entry.action, entry.before) == ("carol", "cancel_job", '{"state":"running"}')
    assert entry.after == '{"not_redriven":6,"state":"cancelled"}'
    view = job(node)
    assert (view.state, view.redriven, view.not_redriven, view.pending, view.controlled_by) == (
        JobState.CANCELLED, 4, 6, 0, "carol")  # fmt: skip
    rest = items(node, result=ItemResult.NOT_REDRIVEN)
    assert [i.message_id for i in rest] == ids[4:] and {(i.code, i.done_ms) for i in rest} == {("cancelled",
                                                                                                 node.now_ms)}  # fmt: skip
    assert [message(node, i).state for i in ids[4:]] == [State.DEAD] * 6
    assert [i.message_id for i in items(node, result=ItemResult.REDRIVEN)] == ids[:4]
    snapshot = unchanged(node)
    node.now_ms += 5000
    assert step(node).code is Code.ILLEGAL_STATE
    for action in JobAction:  # nothing moves a cancelled job, and refusals write nothing
        assert control(node, action).code is Code.ILLEGAL_STATE
    assert unchanged(node) == snapshot


def test_pause_stops_the_steps_and_resume_continues_where_it_stopped() -> None:
    node = Node()
    ids = dead(node, *keys(6))
    review(node, RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=2))
    node.now_ms += 1000
    assert step(node).redriven == tuple(ids[:2])
    assert control(node, JobAction.PAUSE).code is Code.OK and job(node).next_step_ms is None
    snapshot = unchanged(node)
    assert control(node, JobAction.PAUSE).code is Code.ILLEGAL_STATE
    node.now_ms += 10_000
    paused = step(node)
    assert (paused.code, paused.state, paused.redriven) == (Code.ILLEGAL_STATE, JobState.PAUSED, ())
    assert unchanged(node) == snapshot
    assert control(node, JobAction.RESUME).code is Code.OK
    assert control(node, JobAction.RESUME).code is Code.ILLEGAL_STATE
    assert step(node).redriven == tuple(ids[2:4])  # one second's worth, however long the pause was
    assert [e.action for e in chain(node)][-4:] == ["pause_job", "resume_job", "redriven", "redriven"]


def test_an_item_whose_message_changed_is_refused_with_its_code_and_never_counted() -> None:
    node = Node()
    ids = dead(node, *keys(4))
    missing = 999
    started = review(node, RedriveJob(actor="alice", reason="r", ids=(*ids, missing), rate_per_s=100))
    assert started.refused == ((missing, Code.NOT_FOUND),)  # judged at once: recorded, not pending
    assert node.apply(Discard(message_id=ids[0], actor="bob", reason="paid by hand")).code is Code.OK
    assert node.apply(Redrive(actor="bob", reason="mine", ids=(ids[1],))).code is Code.OK
    node.now_ms += 1000
    result = step(node)
    assert result.redriven == tuple(ids[2:]) and result.state is JobState.DONE
    assert result.refused == ((ids[0], Code.ILLEGAL_STATE), (ids[1], Code.ILLEGAL_STATE))
    by_id = {i.message_id: (i.result, i.code) for i in items(node)}
    assert by_id == {ids[0]: (ItemResult.REFUSED, "ILLEGAL_STATE"), ids[1]: (ItemResult.REFUSED, "ILLEGAL_STATE"),
                     ids[2]: (ItemResult.REDRIVEN, ""), ids[3]: (ItemResult.REDRIVEN, ""),
                     missing: (ItemResult.REFUSED, "NOT_FOUND")}  # fmt: skip
    view = job(node)
    assert (view.total, view.redriven, view.refused, view.not_redriven) == (5, 2, 3, 0)
    assert message(node, ids[0]).state is State.DISCARDED  # left as it was
    nothing = review(node, RedriveJob(actor="alice", reason="again", ids=tuple(ids), rate_per_s=1))
    assert nothing.code is Code.ILLEGAL_STATE and nothing.job_id is None and len(jobs.listing(
        node.machine.view)) == 1  # fmt: skip


def test_an_approval_starts_the_job_in_its_own_apply_and_each_redrive_names_it() -> None:
    node = Node()
    ids = dead(node, *keys(3))
    action = RedriveJob(actor="alice", reason="bulk", ids=(ids[2], ids[0], ids[1], ids[0]), rate_per_s=50)
    proposal = review(node, Propose(action=action, ttl_ms=HOUR_MS))
    assert (proposal.code, proposal.proposal_state, proposal.ids) == (Code.OK, proposal.proposal_state, ())
    (view,) = proposals.get(node.machine.view, [proposal.proposal_id], now_ms=node.now_ms)
    assert view.action == "redrive_job" and view.targets == tuple(ids)
    shown = proposals.proposal_action(view)
    assert isinstance(shown, RedriveJob) and shown.ids == tuple(ids) and shown.rate_per_s == 50
    assert jobs.listing(node.machine.view) == []  # proposed: no job yet
    assert review(node, Approve(proposal_id=proposal.proposal_id, approver="alice")).code is Code.OWN_PROPOSAL
    approved = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob", reason="ok"))
    assert (approved.code, approved.job_id, approved.proposal_state.value) == (Code.OK, 1, "approved")  # type: ignore[union-attr]
    added = [e for e in chain(node) if e.log_index == node.index]
    assert [e.action for e in added] == ["approve", "redrive_job"]  # one apply: never approved-but-not-started
    assert '"approved_by":"bob"' in added[1].after and '"proposal":1' in added[1].after
    started = job(node)
    assert (started.proposal_id, started.approved_by, started.state, started.total) == (1, "bob", JobState.RUNNING, 3)
    node.now_ms += 1000
    step(node)
    redriven = [e for e in chain(node) if e.action == "redriven"]
    assert len(redriven) == 3 and all('"approved_by":"bob"' in e.after and '"job":1' in e.after
                                      and '"proposal":1' in e.after for e in redriven)  # fmt: skip
    timeline = audit_chain.message_entries(node.machine.view, [ids[0]])
    assert [e.action for e in timeline] == ["redriven"]  # a job's proposal is not indexed 100,000 times


def test_a_replayed_step_after_a_crash_does_the_same_once(tmp_path: Path) -> None:
    path = str(tmp_path / "queue.lmdb")
    node = Node.over(QueueMachine(path))
    ids = dead(node, *keys(6))
    review(node, RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=3))
    node.machine.checkpoint()
    committed = node.machine.applied_index()
    node.now_ms += 1000
    assert step(node).redriven == tuple(ids[:3])
    store = node.machine.store
    assert isinstance(store, LmdbStore)
    store.abandon()  # no checkpoint, no clean stop: what a kill -9 leaves
    restarted = Node.over(QueueMachine(path))
    restarted.index, restarted.now_ms = restarted.machine.applied_index(), node.now_ms
    assert restarted.index == committed
    assert job(restarted).pending == 6 and message(restarted, ids[0]).state is State.DEAD
    replay = step(restarted)
    assert replay.redriven == tuple(ids[:3]) and job(restarted).redriven == 3
    assert [i.result for i in items(restarted)] == [ItemResult.REDRIVEN] * 3 + [ItemResult.PENDING] * 3
    assert len([e for e in chain(restarted) if e.action == "redriven"]) == 3
    restarted.machine.close()


def test_replicas_agree_and_the_wire_carries_the_commands_queries_and_answers() -> None:
    replicas = [Node.over(ReplicatedQueueMachine(":memory:")) for _ in range(3)]
    ids = dead(replicas[0], *keys(8))
    assert all(dead(node, *keys(8)) == ids for node in replicas[1:])
    commands: list[QueueCommand] = [
        RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=7), StepJob(job_id=1),
        ControlJob(job_id=1, action=JobAction.PAUSE, actor="c", reason="wait"), StepJob(job_id=1),
        ControlJob(job_id=1, action=JobAction.RESUME, actor="c", reason="go"), StepJob(job_id=1, limit=2),
        ControlJob(job_id=1, action=JobAction.CANCEL, actor="c", reason="stop"),
    ]  # fmt: skip
    for command in commands:
        assert codec.decode_command(codec.encode_command(command)) == command
        for node in replicas:
            node.now_ms += 400
        assert len({codec.encode_result(node.apply(command)) for node in replicas}) == 1
    assert dump(replicas[0]) == dump(replicas[1]) == dump(replicas[2])
    conn, now_ms = replicas[0].machine.view, replicas[0].now_ms
    for query in (qc.Jobs(active_only=False), qc.Jobs(ids=(1,)), qc.JobItems(job_id=1, result=ItemResult.REDRIVEN)):
        assert qc.decode_query(qc.encode_query(query)) == query
        answer = qc.decode_answer(qc.encode_answer(answer_query(conn, query, now_ms)))
        assert isinstance(answer, qc.JobsAnswer | qc.JobItemsAnswer) and answer != qc.JobsAnswer()
    assert answer_query(conn, qc.Jobs(active_only=True), now_ms) == qc.JobsAnswer(now_ms=now_ms)
    page = answer_query(conn, qc.JobItems(job_id=1, after_message_id=ids[1], limit=2), now_ms)
    assert isinstance(page, qc.JobItemsAnswer) and [i.message_id for i in page.items] == ids[2:4]
    for bad in ({"t": "redrive_job", "actor": "a", "reason": "r", "ids": [], "rate_per_s": 1},
                {"t": "redrive_job", "actor": "a", "reason": "r", "ids": [1], "rate_per_s": 10_001},
                {"t": "redrive_job", "actor": "a", "reason": "", "ids": [1], "rate_per_s": 1},
                {"t": "redrive_job", "actor": "a", "reason": "r", "ids": [1] * 100_001, "rate_per_s": 1},
                {"t": "step_job", "job_id": 1, "limit": 1001},
                {"t": "control_job", "job_id": 1, "action": "restart", "actor": "a", "reason": "r"}):  # fmt: skip
        refused = codec.decode_command(bytes([codec.CODEC_VERSION]) + msgspec.msgpack.encode(bad))
        assert isinstance(refused, ErrorResult) and refused.code is Code.INVALID, bad
    assert step(replicas[0], job_id=7).code is Code.NOT_FOUND
    assert control(replicas[0], JobAction.PAUSE, job_id=7).code is Code.NOT_FOUND


GROUP = "0123456789abcdef0123456789abcdef"


def test_a_groups_part_is_created_once_per_set_and_named_in_its_audit_entries() -> None:
    """Several sets: a bulk action is one job or proposal per set sharing a group id; a repeated
    creation (a set that answered late, an API retry) answers the part the set holds."""
    node = Node()
    ids = dead(node, *keys(4))
    plain = RedriveJob(actor="alice", reason="r", ids=tuple(ids[:1]), rate_per_s=5)
    assert codec.encode_command(plain) == codec.encode_command(plain) and b"group" not in codec.encode_command(plain)
    grouped = RedriveJob(actor="alice", reason="r", ids=tuple(ids[:2]), rate_per_s=5, group=GROUP)
    assert codec.decode_command(codec.encode_command(grouped)) == grouped
    first = review(node, grouped)
    assert (first.code, first.job_id) == (Code.OK, 1)
    before = dump(node)
    again = review(node, grouped)
    assert (again.code, again.job_id) == (Code.OK, 1) and "already" in again.detail
    assert dump(node) == {**before, "meta": dump(node)["meta"]}  # nothing stored twice
    entry = [e for e in chain(node) if e.action == "redrive_job"][-1]
    assert f'"group":"{GROUP}"' in entry.after
    answer = answer_query(node.machine.view, qc.JobGroup(group=GROUP), node.now_ms)
    assert answer == qc.JobGroupAnswer(job_id=1, proposal_id=None, now_ms=node.now_ms)
    other = "f" * 32
    proposal = review(node, Propose(action=RedriveJob(actor="alice", reason="r", ids=tuple(ids[2:]), rate_per_s=5,
                                                      group=other), ttl_ms=HOUR_MS))  # fmt: skip
    repeat = review(node, Propose(action=RedriveJob(actor="alice", reason="r", ids=tuple(ids[2:]), rate_per_s=5,
                                                    group=other), ttl_ms=HOUR_MS))  # fmt: skip
    assert repeat.proposal_id == proposal.proposal_id and "already" in repeat.detail
    approved = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert approved.code is Code.OK and approved.job_id == 2
    again_approved = review(node, Approve(proposal_id=proposal.proposal_id, approver="bob"))
    assert again_approved.code is Code.ILLEGAL_STATE  # the API reads the part to see it approved already
    after_approval = review(node, Propose(action=RedriveJob(actor="alice", reason="r", ids=tuple(ids[2:]), rate_per_s=5,
                                                            group=other), ttl_ms=HOUR_MS))  # fmt: skip
    assert after_approval.proposal_id == proposal.proposal_id and after_approval.proposal_state is not None
    assert after_approval.proposal_state.value == "approved"
    assert answer_query(node.machine.view, qc.JobGroup(group=other), node.now_ms) == qc.JobGroupAnswer(
        job_id=2, proposal_id=proposal.proposal_id, now_ms=node.now_ms)
    actions = {e.action: e.after for e in chain(node) if f'"group":"{other}"' in e.after}
    assert set(actions) == {"propose", "approve", "redrive_job"}
    third = RedriveJob(actor="alice", reason="r", ids=tuple(ids[3:]), rate_per_s=5, group="e" * 32)
    assert review(node, Propose(action=third, ttl_ms=HOUR_MS)).code is Code.OK
    direct = review(node, third)
    assert direct.code is Code.INVALID and direct.job_id is None  # a proposed part never starts unapproved
    proposed = review(node, Propose(action=grouped, ttl_ms=HOUR_MS))
    assert proposed.code is Code.INVALID and proposed.proposal_id == 0  # nor is a started one proposed again
    assert "job_groups" in dump(node) and "job_groups" not in dump(Node())
    bad = {"t": "redrive_job", "actor": "a", "reason": "r", "ids": [1], "rate_per_s": 1, "group": "not-hex"}
    refused = codec.decode_command(bytes([codec.CODEC_VERSION]) + msgspec.msgpack.encode(bad))
    assert isinstance(refused, ErrorResult) and refused.code is Code.INVALID


def test_an_expired_part_of_a_group_is_proposed_again_in_its_place_once() -> None:
    """A part whose proposal expired (its set was down until then) is proposed again with `renews`
    naming it: a new proposal held as the group's part, audited; a repeat answers the new one; a
    part that did not expire, or a set with no part, is refused."""
    node = Node()
    ids = dead(node, *keys(2))
    part = RedriveJob(actor="alice", reason="r", ids=tuple(ids), rate_per_s=5, group=GROUP)
    assert b"renews" not in codec.encode_command(part)  # every job and proposal without it encodes as before
    first = review(node, Propose(action=part, ttl_ms=HOUR_MS))
    assert first.code is Code.OK
    renewal = msgspec.structs.replace(part, actor="carol", reason="set 2 was down", renews=first.proposal_id)
    early = review(node, Propose(action=renewal, ttl_ms=HOUR_MS))
    assert early.code is Code.INVALID and early.proposal_id == first.proposal_id  # still pending: approve it
    node.now_ms += 2 * HOUR_MS
    again = review(node, Propose(action=renewal, ttl_ms=HOUR_MS))
    assert again.code is Code.OK and again.proposal_id != first.proposal_id
    assert answer_query(node.machine.view, qc.JobGroup(group=GROUP), node.now_ms) == qc.JobGroupAnswer(
        job_id=None, proposal_id=again.proposal_id, now_ms=node.now_ms)
    repeat = review(node, Propose(action=renewal, ttl_ms=HOUR_MS))
    assert (repeat.code, repeat.proposal_id) == (Code.OK, again.proposal_id)  # held now: answered, not made twice
    entry = [e for e in chain(node) if e.action == "propose"][-1]
    assert entry.actor == "carol" and f'"renews":{first.proposal_id}' in entry.after and GROUP in entry.after
    assert review(node, Approve(proposal_id=again.proposal_id, approver="bob")).code is Code.OK
    nothing = msgspec.structs.replace(renewal, group="d" * 32)
    assert review(node, Propose(action=nothing, ttl_ms=HOUR_MS)).code is Code.NOT_FOUND
    assert review(node, msgspec.structs.replace(renewal, group="d" * 32)).code is Code.INVALID  # a job is never a renewal
    assert review(node, Propose(action=msgspec.structs.replace(renewal, group=""), ttl_ms=HOUR_MS)).code is Code.INVALID
