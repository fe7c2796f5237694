"""Classification as data: the default tables decide what they say, round-trip through JSON, and a
table an operator edits is refused when it does not decode or its rules contradict each other."""

from __future__ import annotations

import datetime as dt
from email.utils import format_datetime

import msgspec
import pytest

from handlers.answers import Answer, NotSent, NotSentClass, OutcomeUnknown, UnknownClass
from handlers.classification import (
    Action,
    ClassificationError,
    ClassificationTable,
    Rule,
    classify,
    code_of,
    decide,
    decode_table,
    encode_table,
    retry_after_s,
)
from handlers.contract import UNKNOWN_OUTCOME_CLASSES, Decision, Permanent, Retryable, Succeeded
from handlers.tables import CALLBACK_TABLE, DEFAULT_TABLES, PAYMENT_TABLE, RED_PACKET_TABLE

RECEIVED_UNIX_S = 1_800_000_000.0


def answer(status: int, code: str | None = None, *, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    body = msgspec.json.encode({"code": code}) if code else b"{}"
    return Answer(status=status, headers=headers, body=body, received_unix_s=RECEIVED_UNIX_S)


def shape(decision: Decision) -> tuple[str, str, bool]:
    """(decision type, error class or detail, outcome unknown): what a row of a table decides."""
    if isinstance(decision, Succeeded):
        return ("succeeded", decision.detail, False)
    if isinstance(decision, Retryable):
        return ("retryable", decision.error_class, decision.outcome_unknown)
    return ("permanent", decision.error_class, False)


PAYMENT_CASES = [
    (201, None, ("succeeded", "transferred", False)),
    (200, None, ("succeeded", "already transferred", False)),
    (409, "idempotency_conflict", ("permanent", "idempotency_conflict", False)),
    (409, None, ("permanent", "rejected", False)),
    (422, "insufficient_funds", ("permanent", "insufficient_funds", False)),
    (422, "account_closed", ("permanent", "account_closed", False)),
    (422, "something_new", ("permanent", "rejected", False)),
    (429, "rate_limited", ("retryable", "rate_limited", False)),
    (408, None, ("retryable", "request_timeout", False)),
    (500, None, ("retryable", "server_error", True)),
    (503, "outage", ("retryable", "server_error", True)),
    (302, None, ("permanent", "redirect_refused", False)),
    (204, None, ("permanent", "unexpected_status", False)),
    (101, None, ("permanent", "unexpected_status", False)),
]
RED_PACKET_CASES = [
    (200, None, ("succeeded", "applied", False)),
    (409, "stale_version", ("succeeded", "superseded by a newer version", False)),
    (409, "version_conflict", ("permanent", "version_conflict", False)),
    (422, "red_packet_closed", ("permanent", "red_packet_closed", False)),
    (429, None, ("retryable", "rate_limited", False)),
    (502, None, ("retryable", "server_error", True)),
    (307, None, ("permanent", "redirect_refused", False)),
    (400, "invalid_request", ("permanent", "rejected", False)),
]
CALLBACK_CASES = [
    (200, None, ("succeeded", "delivered", False)),
    (204, None, ("succeeded", "delivered", False)),
    (301, None, ("permanent", "redirect_refused", False)),
    (308, None, ("permanent", "redirect_refused", False)),
    (401, "bad_signature", ("permanent", "signature_refused", False)),
    (403, None, ("permanent", "forbidden", False)),
    (404, None, ("permanent", "not_found", False)),
    (409, None, ("permanent", "idempotency_conflict", False)),
    (410, "gone", ("permanent", "gone", False)),
    (408, None, ("retryable", "request_timeout", False)),
    (429, None, ("retryable", "rate_limited", False)),
    (504, None, ("retryable", "server_error", True)),
    (418, None, ("permanent", "rejected", False)),
]


@pytest.mark.parametrize(
    ("table", "status", "code", "expected"),
    [(PAYMENT_TABLE, *case) for case in PAYMENT_CASES]
    + [(RED_PACKET_TABLE, *case) for case in RED_PACKET_CASES]
    + [(CALLBACK_TABLE, *case) for case in CALLBACK_CASES],
)
def test_the_default_tables_decide_each_answer(
    table: ClassificationTable, status: int, code: str | None, expected: tuple[str, str, bool]
) -> None:
    assert shape(classify(table, answer(status, code))) == expected


@pytest.mark.parametrize("table", list(DEFAULT_TABLES.values()), ids=list(DEFAULT_TABLES))
def test_the_default_tables_validate_and_round_trip_through_json(table: ClassificationTable) -> None:
    assert table.problems() == []
    assert decode_table(encode_table(table)) == table


def test_retry_after_is_honoured_as_seconds_or_an_http_date() -> None:
    in_seconds = classify(PAYMENT_TABLE, answer(429, headers=(("retry-after", "7"),)))
    assert isinstance(in_seconds, Retryable) and in_seconds.retry_after_s == 7.0
    date = format_datetime(dt.datetime.fromtimestamp(RECEIVED_UNIX_S + 30, dt.UTC), usegmt=True)
    as_date = classify(PAYMENT_TABLE, answer(429, headers=(("retry-after", date),)))
    assert isinstance(as_date, Retryable) and as_date.retry_after_s == 30.0
    assert retry_after_s("soon", received_unix_s=RECEIVED_UNIX_S) is None
    assert retry_after_s(None, received_unix_s=RECEIVED_UNIX_S) is None
    past = format_datetime(dt.datetime.fromtimestamp(RECEIVED_UNIX_S - 30, dt.UTC), usegmt=True)
    assert retry_after_s(past, received_unix_s=RECEIVED_UNIX_S) == 0.0
    plain_retry = classify(PAYMENT_TABLE, answer(503, headers=(("retry-after", "7"),)))
    assert isinstance(plain_retry, Retryable) and plain_retry.retry_after_s is None  # only retry_after rules read it


def test_no_answer_is_retryable_and_says_whether_it_may_have_been_applied() -> None:
    not_sent = decide(PAYMENT_TABLE, NotSent(error_class=NotSentClass.CONNECT_FAILED, detail="refused", tries=3))
    unknown = decide(PAYMENT_TABLE, OutcomeUnknown(error_class=UnknownClass.TIMEOUT, detail="read timeout"))
    assert not_sent == Retryable(error_class="connect_failed", detail="refused", outcome_unknown=False)
    assert unknown == Retryable(error_class="timeout", detail="read timeout", outcome_unknown=True)
    assert {c.value for c in UnknownClass} <= UNKNOWN_OUTCOME_CLASSES
    assert not {c.value for c in NotSentClass} & UNKNOWN_OUTCOME_CLASSES


def test_the_excerpt_is_bounded_and_the_code_read_only_from_a_json_object() -> None:
    long = Answer(status=500, headers=(), body=b"x" * 10_000, received_unix_s=RECEIVED_UNIX_S)
    decision = classify(PAYMENT_TABLE, long)
    assert isinstance(decision, Retryable) and decision.excerpt == "x" * 500
    assert code_of(b'{"code": "insufficient_funds", "more": 1}') == "insufficient_funds"
    assert [code_of(body) for body in (b"[1]", b'{"code": 5}', b"not json", b"")] == [None, None, None, None]


def _table(*rules: Rule) -> ClassificationTable:
    return ClassificationTable(downstream="payment", rules=rules)


CATCH_ALL = Rule(status_min=100, status_max=599, action=Action.PERMANENT, error_class="unexpected_status")


def test_contradicting_rules_are_refused_with_a_reason_each() -> None:
    table = _table(
        Rule(status_min=500, status_max=599, action=Action.RETRY, error_class="unavailable"),
        Rule(status_min=503, status_max=503, action=Action.PERMANENT, error_class="down"),
        Rule(status_min=422, status_max=400, action=Action.PERMANENT, error_class="backwards"),
    )
    assert table.problems() == [
        "rule 1 (500-599 *): a retried 5xx may have taken effect; use one of "
        "['connection_lost', 'handler_error', 'interrupted', 'lease_expired', 'server_error', 'timeout',"
        " 'unknown_outcome']",
        "rule 2 (503-503 *): unreachable, rule 1 matches everything it does",
        "rule 3 (422-400 *): status_min is above status_max",
        "the last rule must match every status (100-599) with no code",
    ]
    with pytest.raises(ClassificationError, match=r"^payment: rule 1"):
        table.validate()
    a_code_after_its_status_is_reachable = _table(
        Rule(status_min=422, status_max=422, code="x", action=Action.PERMANENT, error_class="x"),
        Rule(status_min=422, status_max=422, action=Action.PERMANENT, error_class="other"),
        CATCH_ALL,
    )
    assert a_code_after_its_status_is_reachable.problems() == []
    shadowed_code = _table(Rule(status_min=400, status_max=499, action=Action.PERMANENT, error_class="rejected"),
                           Rule(status_min=422, status_max=422, code="x", action=Action.PERMANENT, error_class="x"),
                           CATCH_ALL)  # fmt: skip
    assert shadowed_code.problems() == ["rule 2 (422-422 x): unreachable, rule 1 matches everything it does"]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"downstream": "payment", "rules": []}', "Expected `array` of length >= 1"),
        (b'{"downstream": "payment", "rules": [{"status_min": 100, "status_max": 600, "action": "permanent",'
         b' "error_class": "x"}]}', "Expected `int` <= 599"),
        (b'{"downstream": "payment", "rules": [{"status_min": 100, "status_max": 599, "action": "explode",'
         b' "error_class": "x"}]}', "Invalid enum value 'explode'"),
        (b'{"downstream": "payment", "rules": [{"status_min": "100", "status_max": 599, "action": "permanent",'
         b' "error_class": "x"}]}', "Expected `int`, got `str`"),
        (b'{"downstream": "payment", "rules": [{"status_min": 100, "status_max": 599, "action": "permanent",'
         b' "error_class": "x", "colour": "red"}]}', "unknown field `colour`"),
        (b'{"downstream": "payment", "rules": [{"status_min": 100, "status_max": 599, "action": "permanent",'
         b' "error_class": "Not A Class"}]}', "Expected `str` matching regex"),
        (b'{"downstream": "payment"', "truncated"),
    ],
)  # fmt: skip
def test_an_edited_table_decodes_strictly(document: bytes, message: str) -> None:
    with pytest.raises(ClassificationError, match=message):
        decode_table(document)


def test_a_table_built_in_code_gets_the_decoders_checks_too() -> None:
    built = _table(Rule(status_min=100, status_max=700, action=Action.PERMANENT, error_class="x"))
    assert built.problems() == ["Expected `int` <= 599 - at `$.rules[0].status_max`"]


def test_an_answer_no_rule_matches_goes_to_a_person() -> None:
    unvalidated = _table(Rule(status_min=200, status_max=299, action=Action.SUCCESS, error_class="ok"))
    decision = classify(unvalidated, answer(500))
    assert isinstance(decision, Permanent) and decision.error_class == "unclassified"
