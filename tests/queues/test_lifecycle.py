"""The lifecycle table: every (state, action) pair is either a listed transition or ILLEGAL_STATE,
and the machine answers an illegal pair with that code (never a crash, never a silent no-op)."""

from __future__ import annotations

import itertools

import pytest

from queues import codec
from queues.core.keys import u64
from queues.core.port import Table
from queues.lifecycle import GONE, TABLE, Action, is_legal, transition
from queues.machine import QueueMachine
from queues.model import (
    Ack,
    BatchResult,
    Code,
    Discard,
    Enqueue,
    ExtendLease,
    Fail,
    Lease,
    LeaseResult,
    Outcome,
    QueueCommand,
    QueueResult,
    Redrive,
    Release,
    State,
)
from raft_store.state_machine import Command

ALL_PAIRS = list(itertools.product(State, Action))


@pytest.mark.parametrize(("state", "action"), ALL_PAIRS)
def test_every_pair_is_a_transition_or_a_code(state: State, action: Action) -> None:
    outcome = transition(state, action)
    if is_legal(state, action):
        assert isinstance(outcome, frozenset)
        assert outcome == TABLE[(state, action)]
    else:
        assert outcome is Code.ILLEGAL_STATE


def test_table_shape() -> None:
    # Terminal states only leave by purge; dead letters are never purged, only redriven or discarded.
    for state in (State.DONE, State.DISCARDED):
        assert [a for a in Action if is_legal(state, a)] == [Action.PURGE]
        assert transition(state, Action.PURGE) == GONE
    assert not is_legal(State.DEAD, Action.PURGE)
    assert not is_legal(State.LEASED, Action.DISCARD)  # a worker holds it: wait for ack, fail or expiry
    assert transition(State.LEASED, Action.FAIL) == transition(State.LEASED, Action.EXPIRE)
    assert State.DONE not in transition(State.LEASED, Action.FAIL)  # type: ignore[operator]


class Driver:
    def __init__(self) -> None:
        self.machine = QueueMachine(":memory:")
        self.index = 0
        self.now_ms = 1_000_000

    def apply(self, command: QueueCommand) -> QueueResult:
        self.index += 1
        (data,) = self.machine.apply_batch(
            self.index, self.now_ms, [Command(0, 0, codec.encode_command(command))]
        )
        return codec.decode_result(data)

    def enqueue(self, key: str, delay_ms: int = 0) -> int:
        result = self.apply(
            Enqueue(kind="transfer", idempotency_key=key, ref_key="r", payload=b"p", delay_ms=delay_ms)
        )
        assert result.code is Code.OK
        return result.message_id  # type: ignore[union-attr]

    def lease_one(self) -> tuple[int, int]:
        result = self.apply(Lease(worker_id="w", count_max=1, lease_ms=60_000))
        assert isinstance(result, LeaseResult) and len(result.grants) == 1
        return result.grants[0].message_id, result.grants[0].token


def message_in(driver: Driver, state: State) -> tuple[int, int]:
    """A message in `state` and the last token it was granted (0 if never leased)."""
    key = f"k-{driver.index}"
    if state is State.DELAYED:
        return driver.enqueue(key, delay_ms=3_600_000), 0
    message_id = driver.enqueue(key)
    if state is State.READY:
        return message_id, 0
    leased, token = driver.lease_one()
    assert leased == message_id
    if state is State.LEASED:
        return message_id, token
    if state is State.DONE:
        assert driver.apply(Ack(message_id=message_id, token=token)).code is Code.OK
    elif state is State.DEAD:
        fail = Fail(message_id=message_id, token=token, error_class="x", permanent=True)
        assert driver.apply(fail).code is Code.OK
    else:
        assert (
            driver.apply(Fail(message_id=message_id, token=token, error_class="x", permanent=True)).code
            is Code.OK
        )
        assert driver.apply(Discard(message_id=message_id, actor="a", reason="r")).code is Code.OK
    return message_id, token


def command_for(action: Action, message_id: int, token: int) -> QueueCommand:
    token = max(token, 1)
    commands: dict[Action, QueueCommand] = {
        Action.EXTEND: ExtendLease(message_id=message_id, token=token, lease_ms=1000),
        Action.ACK: Ack(message_id=message_id, token=token),
        Action.FAIL: Fail(message_id=message_id, token=token, error_class="timeout"),
        Action.RELEASE: Release(message_id=message_id, token=token),
        Action.REDRIVE: Redrive(actor="ops", reason="r", ids=(message_id,)),
        Action.DISCARD: Discard(message_id=message_id, actor="ops", reason="r"),
    }
    return commands[action]


# Lease, expire and purge pick messages through an index by state, so they cannot address an
# illegal message at all; the other actions name a message and must refuse it.
ADDRESSED = (Action.EXTEND, Action.ACK, Action.FAIL, Action.RELEASE, Action.REDRIVE, Action.DISCARD)


@pytest.mark.parametrize(
    ("state", "action"), [p for p in ALL_PAIRS if not is_legal(*p) and p[1] in ADDRESSED]
)
def test_machine_refuses_illegal_pairs_with_a_code(state: State, action: Action) -> None:
    driver = Driver()
    message_id, token = message_in(driver, state)
    command = command_for(action, message_id, token)
    before = driver.machine.view.get(Table.MESSAGES, u64(message_id))
    result = driver.apply(command)
    if isinstance(result, BatchResult):
        assert result.refused == ((message_id, Code.ILLEGAL_STATE),)
    elif state is State.DONE and action is Action.ACK:
        assert result.code is Code.ALREADY_ACKED  # a repeated ack gets the first ack's answer
    else:
        assert isinstance(result, Outcome)
        assert result.code is Code.ILLEGAL_STATE
        assert result.state is state
    after = driver.machine.view.get(Table.MESSAGES, u64(message_id))
    assert after == before, "an illegal command changed the message"
