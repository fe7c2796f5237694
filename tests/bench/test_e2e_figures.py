"""The end-to-end benchmark's pure parts: its requests, and the figures it reads from the store and ledgers."""

from __future__ import annotations

import msgspec

from bench.e2e_figures import Ledgers, effects, outcomes, percentile, timings, worker_metrics
from bench.e2e_load import MIX_DEFAULT, Planned, batch_bodies, kind_at, submission
from ledger.kinds import Kind
from queues import MessageView, State
from queues.model import AttemptView
from submission.models import SUBMISSION


def _planned(count: int) -> list[Planned]:
    return [submission(i, nonce="n0", mix=MIX_DEFAULT, callback_target="merchant") for i in range(count)]


def _view(
    message_id: int, *, state: State, created_ms: int, leased_ms: tuple[int, ...], terminal_ms: int | None
) -> MessageView:
    history = tuple(
        AttemptView(attempt=n, token=n, worker_id="w", leased_ms=at, ended_ms=None, outcome=None, error_class=None,
                    error_text=None)
        for n, at in enumerate(leased_ms, 1)
    )  # fmt: skip
    return MessageView(
        message_id=message_id, kind="transfer", idempotency_key=f"bench:k{message_id}", ref_key="r", payload=b"{}",
        edited_payload=None, headers={}, created_ms=created_ms, state=state, due_ms=created_ms,
        attempts=len(leased_ms), last_error_class=None, last_error_text=None, token=len(leased_ms), lease_worker=None,
        lease_deadline_ms=None, dead_ms=None, dead_reason=None, terminal_ms=terminal_ms, history=history,
    )  # fmt: skip


def test_the_mix_is_interleaved_and_every_request_is_one_the_api_takes() -> None:
    planned = _planned(20)
    assert [p.kind for p in planned[:10]] == [Kind.TRANSFER] * 7 + [Kind.LIST_UPDATE] * 2 + [Kind.CALLBACK]
    assert [kind_at(i, MIX_DEFAULT) for i in range(10, 20)] == [p.kind for p in planned[:10]]
    assert len({p.key for p in planned}) == len({p.effect for p in planned}) == 20
    for p in planned:
        SUBMISSION.validate_json(msgspec.json.encode(p.request))
    (items, body), *rest = batch_bodies(planned, 8)
    assert [len(batch) for batch, _ in rest] == [8, 4]
    sent = msgspec.json.decode(body)["items"]
    assert [item["idempotency_key"] for item in sent] == [p.key for p in items]


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (50.0, 99.0, 100.0)
    assert percentile([], 0.5) is None


def test_times_split_into_first_try_and_retried_with_queue_wait_and_handling() -> None:
    views = [
        _view(1, state=State.DONE, created_ms=1000, leased_ms=(1010,), terminal_ms=1050),
        _view(2, state=State.DONE, created_ms=1000, leased_ms=(1100, 1400), terminal_ms=1450),
        _view(3, state=State.READY, created_ms=1000, leased_ms=(1100,), terminal_ms=None),
    ]
    found = timings(views)
    assert (found.first_try, found.retried) == ([50.0], [450.0])
    assert (found.waited, found.handled) == ([10.0, 100.0], [40.0, 50.0])


def test_a_request_acknowledged_but_not_done_is_lost_and_pending_ones_are_named() -> None:
    planned = _planned(3)
    acknowledged = {1: planned[0], 2: planned[1], 3: planned[2]}
    views = {
        1: _view(1, state=State.DONE, created_ms=0, leased_ms=(5,), terminal_ms=9),
        2: _view(2, state=State.DELAYED, created_ms=0, leased_ms=(5,), terminal_ms=None),
    }
    found = outcomes(acknowledged, views)
    assert (found["lost"], found["pending_at_end"], found["missing"]) == (2, 1, 1)
    assert found["states"] == {"delayed": 1, "done": 1, "missing": 1}


def test_a_transfer_parked_as_unknown_outcome_is_finances_not_lost_and_must_not_have_been_paid() -> None:
    planned = _planned(3)  # transfers
    acknowledged = {1: planned[0], 2: planned[1], 3: planned[2]}
    dead = _view(2, state=State.DEAD, created_ms=0, leased_ms=(5, 6), terminal_ms=None)
    views = {
        1: _view(1, state=State.DONE, created_ms=0, leased_ms=(5,), terminal_ms=9),
        2: msgspec.structs.replace(dead, last_error_class="unknown_outcome"),
        3: msgspec.structs.replace(dead, message_id=3, last_error_class="attempts_exhausted"),
    }
    found = outcomes(acknowledged, views)
    assert (found["lost"], found["parked_unknown_outcome"]) == (1, 1)
    ledgers = Ledgers(payment_transfers={planned[0].effect: 1, planned[1].effect: 1}, red_packet_versions={},
                      callback_deliveries={})  # fmt: skip
    assert effects(acknowledged, views, ledgers, store_key_prefix="bench:")["parked_but_paid"] == 1


def test_double_payments_unrequested_rows_and_missing_effects_are_counted() -> None:
    planned = _planned(10)  # seven transfers, two list updates, one callback
    acknowledged = {i + 1: p for i, p in enumerate(planned)}
    views = {i: _view(i, state=State.DONE, created_ms=0, leased_ms=(1,), terminal_ms=2) for i in acknowledged}
    transfers = {p.effect: 1 for p in planned if p.kind is Kind.TRANSFER}
    transfers[planned[0].effect] = 2
    transfers["tr-someone-else"] = 1
    del transfers[planned[1].effect]
    ledgers = Ledgers(
        payment_transfers=transfers,
        red_packet_versions={p.effect: 1 for p in planned if p.kind is Kind.LIST_UPDATE},
        callback_deliveries={f"bench:{p.key}": 3 for p in planned if p.kind is Kind.CALLBACK},
    )
    found = effects(acknowledged, views, ledgers, store_key_prefix="bench:")
    assert found["double_paid"] == 2
    assert found["payment_rows_unrequested"] == 1
    assert found["done_without_effect"] == {"transfer": 1, "list_update": 0, "callback": 0}
    assert found["callback_repeats"] == 2


def test_worker_metrics_are_summed_across_workers() -> None:
    page = "\n".join([
        '# HELP compensator_worker_handler_seconds Time a handler took.',
        'compensator_worker_handler_seconds_bucket{kind="transfer",le="0.01"} 1.0',
        'compensator_worker_handler_seconds_bucket{kind="transfer",le="0.1"} 3.0',
        'compensator_worker_handler_seconds_bucket{kind="transfer",le="+Inf"} 4.0',
        'compensator_worker_handler_seconds_sum{kind="transfer"} 2.0',
        'compensator_worker_handler_seconds_count{kind="transfer"} 4.0',
        'compensator_worker_attempts_total{kind="transfer",outcome="succeeded"} 4.0',
        'compensator_worker_handler_events_total{downstream="payment",event="lookup"} 2.0',
    ])  # fmt: skip
    found = worker_metrics([page, page])
    assert found["handler"] == {"transfer": {"mean_ms": 500.0, "p50_at_most_ms": 100.0, "p99_at_most_ms": None}}
    assert found["attempts"] == {"transfer/succeeded": 8}
    assert found["handler_events"] == {"payment/lookup": 4}
