"""The ledger's states against the queue's: every queue state has exactly one ledger state."""

from __future__ import annotations

from ledger.states import LEDGER_STATE_OF, OPEN_STATES, LedgerState
from queues.model import State


def test_every_queue_state_maps_to_a_ledger_state() -> None:
    assert set(LEDGER_STATE_OF) == {state.value for state in State}  # by the queue state's name
    assert all(isinstance(ledger_state, LedgerState) for ledger_state in LEDGER_STATE_OF.values())


def test_every_ledger_state_is_reached_and_open_means_not_finished_in_the_queue() -> None:
    assert set(LEDGER_STATE_OF.values()) == set(LedgerState)
    open_queue_states = {State.DELAYED, State.READY, State.LEASED}
    assert {LEDGER_STATE_OF[state.value] for state in open_queue_states} == OPEN_STATES
    assert not {LEDGER_STATE_OF[state.value] for state in set(State) - open_queue_states} & OPEN_STATES
