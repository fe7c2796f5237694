"""Pure pieces around the job: JDBC slicing, DSN parsing, parameters, fixes and their delivery, report."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from reconcile_http import recording_api

from ledger.pg import free_tcp_port
from spark_reconcile import fixes, report
from spark_reconcile.params import ReconcileParams
from spark_reconcile.schemas import Ledger
from spark_reconcile.sources import JdbcConnection, jdbc_predicates, time_slices

PARAMS = ReconcileParams(business_date=dt.date(2026, 11, 20))


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
    first = fixes.build_fixes([_row(), _row(business_id="g-2", recipient="u-2")])
    again = fixes.build_fixes([_row(business_id="g-2", recipient="u-2"), _row()])
    assert first == again and len({f.idempotency_key for f in first}) == 2
    assert fixes.build_fixes([_row(amount_minor=501)])[0].idempotency_key != first[0].idempotency_key
    assert first[0].document() == {
        "kind": "payout",
        "idempotency_key": fixes.idempotency_key(_row(business_id=first[0].ref_key, recipient="u-1")),
        "ref_key": "g-1",
        "payload": {
            "recipient": "u-1",
            "amount_minor": 500,
            "currency": "CNY",
            "reason": "reconciliation",
            "discrepancy_class": "missing_in_payment",
        },
    }


def test_only_fixable_breaks_with_a_recipient_become_requests() -> None:
    rows = [_row(fixable=False), _row(recipient=None), _row(discrepancy_class="duplicate_payout")]
    assert fixes.build_fixes(rows) == []


def test_post_sends_the_idempotency_key_and_treats_exists_as_delivered() -> None:
    fix = fixes.build_fixes([_row()])[0]
    with recording_api() as api:
        assert fixes.post(fix, api.url).status == 201
        repeated = fixes.post(fix, api.url)
        api.fail_next = 1
        failed = fixes.post(fix, api.url)
    assert repeated.status == 409 and repeated.accepted
    assert failed.status == 503 and not failed.accepted
    assert api.keys == [fix.idempotency_key, fix.idempotency_key]
    assert api.received[0][1] == fix.document()
    unreachable = fixes.post(fix, f"http://127.0.0.1:{free_tcp_port()}", timeout_s=2)
    assert unreachable.status is None and not unreachable.accepted


def test_report_money_uses_minor_units_per_currency() -> None:
    assert report.money(123456, "CNY") == "1,234.56 CNY"
    assert report.money(-5, "EUR") == "-0.05 EUR"
    assert report.money(1500, "JPY") == "1,500 JPY"


def test_report_charts_escape_labels() -> None:
    chart = report.bar_chart("<b>x</b>", {"<script>": 1.0})
    assert "<script>" not in chart and "&lt;script&gt;" in chart
