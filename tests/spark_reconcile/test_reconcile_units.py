"""Pure pieces around the job: JDBC slicing, DSN parsing, parameters, fixes and their delivery, report."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
from pathlib import Path

import asyncpg
import pytest
from pydantic import ValidationError
from reconcile_http import recording_api

from ledger.kinds import Kind, TransferPayload, decode_payload, encode_payload
from spark_reconcile import delivery, fixes, report
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import Ledger
from spark_reconcile.sources import JdbcConnection, jdbc_predicates, time_slices

PARAMS = ReconcileParams(business_date=dt.date(2026, 11, 20))
PAYER = "red-packet-escrow"


def _row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "discrepancy_class": "missing_in_payment",
        "business_id": "g-1",
        "recipient": "u-1",
        "amount_minor": 500,
        "currency": "CNY",
        "fixable": True,
    }
    return row | overrides


def test_params_derive_the_windows_from_the_date() -> None:
    day = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    assert (PARAMS.read_start, PARAMS.day_start, PARAMS.sla_deadline, PARAMS.day_end, PARAMS.read_end) == (
        day - dt.timedelta(hours=6),
        day,
        day + dt.timedelta(hours=20),
        day + dt.timedelta(days=1),
        day + dt.timedelta(days=1, hours=6),
    )
    with pytest.raises(ValueError, match="pending SLA"):
        ReconcileParams(business_date=PARAMS.business_date, pending_sla=dt.timedelta(0))


def test_time_slices_cover_the_interval_exactly() -> None:
    slices = time_slices(PARAMS.read_start, PARAMS.read_end, 7)
    assert slices[0][0] == PARAMS.read_start and slices[-1][1] == PARAMS.read_end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))


def test_jdbc_predicates_add_old_open_requests_only_for_the_compensation_ledger() -> None:
    assert len(jdbc_predicates(Ledger.PAYMENT, PARAMS, 4)) == 4
    requests = jdbc_predicates(Ledger.COMPENSATION, PARAMS, 4)
    assert len(requests) == 5 and "DEAD_LETTERED" in requests[-1]
    assert "TIMESTAMPTZ '2026-11-19 18:00:00+00:00'" in requests[0]


def test_jdbc_connection_keeps_credentials_out_of_the_url() -> None:
    connection = JdbcConnection.from_dsn("postgresql://finance:s%40cret@db.internal:6543/ledgers")
    assert connection == JdbcConnection(
        url="jdbc:postgresql://db.internal:6543/ledgers", user="finance", password="s@cret"
    )
    with pytest.raises(ValueError, match="TCP DSN"):
        JdbcConnection.from_dsn("postgresql:///postgres?host=/tmp")


def test_fix_keys_depend_on_the_break_only() -> None:
    first = fixes.build_fixes([_row(), _row(business_id="g-2", recipient="u-2")], payer_account=PAYER).proposed
    again = fixes.build_fixes([_row(business_id="g-2", recipient="u-2"), _row()], payer_account=PAYER).proposed
    assert first == again and len({f.idempotency_key for f in first}) == 2
    other_amount = fixes.build_fixes([_row(amount_minor=501)], payer_account=PAYER).proposed
    assert other_amount[0].idempotency_key != first[0].idempotency_key
    key = fixes.idempotency_key(_row(business_id=first[0].ref_key, recipient="u-1"))
    assert first[0].body() == {
        "kind": "transfer",
        "ref_key": "g-1",
        "payload": {
            "transfer_id": key,
            "payer": PAYER,
            "payee": "u-1",
            "amount_minor": 500,
            "currency": "CNY",
            "memo": "reconciliation: missing_in_payment",
        },
    }
    assert first[0].record() == {"idempotency_key": key, **first[0].body()}


def test_every_proposed_fix_is_a_transfer_the_api_accepts() -> None:
    rows = [_row(business_id=f"g-{n}", recipient=f"u-{n}", amount_minor=100 + n) for n in range(20)]
    plan = fixes.build_fixes(rows, payer_account=PAYER)
    assert len(plan.proposed) == 20 and plan.refused == ()
    for fix in plan.proposed:
        body = fix.body()
        assert body["kind"] == Kind.TRANSFER.value and "idempotency_key" not in body
        payload = decode_payload(Kind.TRANSFER, json.dumps(body["payload"]).encode())
        assert payload == TransferPayload.model_validate_json(encode_payload(fix.payload))
        assert isinstance(payload, TransferPayload) and payload.transfer_id == fix.idempotency_key


def test_only_fixable_breaks_become_requests_and_invalid_transfers_are_refused_with_a_reason() -> None:
    skipped = [_row(fixable=False), _row(discrepancy_class="duplicate_payout")]
    assert fixes.build_fixes(skipped, payer_account=PAYER) == fixes.FixPlan(proposed=(), refused=())
    invalid = [
        _row(business_id="g-no-recipient", recipient=None),
        _row(business_id="g-gold", currency="XAU"),
        _row(business_id="g-zero", amount_minor=0),
        _row(business_id="g-self", recipient=PAYER),
        _row(business_id="g-spaces", recipient="user one"),
    ]
    plan = fixes.build_fixes(invalid, payer_account=PAYER)
    assert plan.proposed == ()
    reasons = {refusal.business_id: refusal.reason for refusal in plan.refused}
    assert sorted(reasons) == sorted(row["business_id"] for row in invalid)
    assert "payee" in reasons["g-no-recipient"] and "ISO 4217" in reasons["g-gold"]
    assert "amount_minor" in reasons["g-zero"] and "payer and payee must differ" in reasons["g-self"]
    with pytest.raises(ValueError, match="account id"):
        fixes.build_fixes([_row()], payer_account="not an account")


def test_fixes_jsonl_round_trips_and_refuses_what_is_not_a_transfer(tmp_path: Path) -> None:
    proposed = fixes.build_fixes([_row(), _row(business_id="g-2")], payer_account=PAYER).proposed
    path = tmp_path / "fixes.jsonl"
    assert fixes.write_jsonl(proposed, path) == 2
    assert fixes.read_jsonl(path) == list(proposed)
    edited = json.loads(path.read_text().splitlines()[0])
    path.write_text(json.dumps(edited | {"payload": edited["payload"] | {"amount_minor": "500"}}) + "\n")
    with pytest.raises(ValidationError):
        fixes.read_jsonl(path)


def test_fixes_go_through_the_outbox_once_and_a_rerun_adds_nothing(pg_dsn: str) -> None:
    """Keys and token in headers, a replay counts as delivered, a failed send waits in the outbox."""
    proposed = list(fixes.build_fixes([_row(), _row(business_id="g-2")], payer_account=PAYER).proposed)
    without_api = delivery.enqueue(pg_dsn, proposed, api=None)
    assert (without_api.added, without_api.already, without_api.relayed, without_api.after.pending) == (2, 0, None, 2)
    assert without_api.complete
    with recording_api() as api:
        target = delivery.ApiTarget(url=api.url, token=api.token)
        api.fail_next = 1  # the first send is answered 503: the round stops, the rows wait
        failed = delivery.enqueue(pg_dsn, proposed, api=target)
        assert (failed.added, failed.already, failed.after.pending + failed.after.sent) == (0, 2, 2)
        assert failed.after.pending >= 1 and not failed.complete  # the 503'd one waits; a parallel one may have gone
        asyncio.run(_make_due(pg_dsn))
        sent = delivery.enqueue(pg_dsn, proposed, api=target)
        assert (sent.after.pending, sent.after.sent) == (0, 2) and sent.complete
        rerun = delivery.enqueue(pg_dsn, proposed, api=target)
        assert (rerun.added, rerun.already, rerun.relayed and rerun.relayed.claimed) == (0, 2, 0)
        other_payer = list(fixes.build_fixes([_row()], payer_account="treasury-2").proposed)
        conflict = delivery.enqueue(pg_dsn, other_payer, api=target)
        assert conflict.conflicts == (other_payer[0].idempotency_key,) and not conflict.complete
    assert sorted(api.keys) == sorted(f.idempotency_key for f in proposed)  # each once
    assert sorted(body["ref_key"] for _, body in api.received) == ["g-1", "g-2"]
    assert {key: body for key, body in api.received} == {f.idempotency_key: f.body() for f in proposed}


async def _make_due(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("UPDATE compensator_outbox SET next_attempt_at = now()")
    finally:
        await connection.close()


def test_a_wrong_token_leaves_the_fixes_pending(pg_dsn: str) -> None:
    proposed = list(fixes.build_fixes([_row()], payer_account=PAYER).proposed)
    with recording_api() as api:
        result = delivery.enqueue(pg_dsn, proposed, api=delivery.ApiTarget(url=api.url, token="wrong"))
    assert (result.after.pending, result.after.rejected, api.keys) == (1, 0, [])


def test_the_api_token_never_shows() -> None:
    target = delivery.ApiTarget(url="http://api:8080", token="s3cret-token")
    assert "s3cret-token" not in repr(target) and "s3cret-token" not in str(target)
    with pytest.raises(ValueError, match="bearer token"):
        delivery.ApiTarget(url="http://api:8080", token="")


def test_report_money_uses_minor_units_per_currency() -> None:
    assert report.money(123456, "CNY") == "1,234.56 CNY"
    assert report.money(-5, "EUR") == "-0.05 EUR"
    assert report.money(1500, "JPY") == "1,500 JPY"


def test_report_charts_escape_labels() -> None:
    chart = report.bar_chart("<b>x</b>", {"<script>": 1.0})
    assert "<script>" not in chart and "&lt;script&gt;" in chart
