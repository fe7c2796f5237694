"""The relay's decisions as values: each status's fate, Retry-After, the backoff's bounds, and what
a request must be before it may enter the outbox."""

from __future__ import annotations

import random

import pytest

import outbox
from outbox.outcome import Rejected, Retry, Sent, backoff_s, classify, parse_retry_after
from outbox.schema import check_table


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (201, Sent(201, "1-5")), (200, Sent(200, "1-5")),
        (422, Rejected(422, {"id": "1-5"})), (400, Rejected(400, {"id": "1-5"})), (413, Rejected(413, {"id": "1-5"})),
        (401, Retry(401, "HTTP 401: check the relay's API URL and token")),
        (403, Retry(403, "HTTP 403: check the relay's API URL and token")),
        (404, Retry(404, "HTTP 404: check the relay's API URL and token")),
        (429, Retry(429, "HTTP 429", 7.0)), (503, Retry(503, "HTTP 503", 7.0)), (500, Retry(500, "HTTP 500", 7.0)),
        (408, Retry(408, "HTTP 408", 7.0)),
    ],
)  # fmt: skip
def test_each_status_has_one_fate(status: int, expected: object) -> None:
    assert classify(status, {"id": "1-5"}, text="", retry_after_s=7.0) == expected


def test_a_refusal_without_a_json_problem_keeps_its_text() -> None:
    assert classify(400, None, text="bad" * 500, retry_after_s=None) == Rejected(
        400, {"status": 400, "text": "bad" * 166 + "ba"}
    )


def test_retry_reasons_are_labels_a_producer_never_chose() -> None:
    assert [Retry(s, "").reason for s in (None, 401, 429, 503)] == [
        "no_answer", "relay_misconfigured", "rate_limited", "api_busy"
    ]  # fmt: skip


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert parse_retry_after("3", now_s=0) == 3.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now_s=4.0) == 6.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now_s=40.0) == 0.0
    assert parse_retry_after("soon", now_s=0) is None
    assert parse_retry_after(None, now_s=0) is None


def test_backoff_doubles_within_its_bounds() -> None:
    rng = random.Random(3)
    for failures in range(1, 40):
        ceiling = min(60.0, 0.5 * 2 ** (failures - 1))
        for _ in range(20):
            assert ceiling / 2 <= backoff_s(failures=failures, rng=rng, min_s=0.5, max_s=60.0) <= ceiling


@pytest.mark.parametrize(
    ("key", "body"),
    [
        ("", {"kind": "transfer", "payload": {}}),
        (" padded", {"kind": "transfer", "payload": {}}),
        ("k" * 96, {"kind": "transfer", "payload": {}}),
        ("naïve", {"kind": "transfer", "payload": {}}),
        ("k", {"payload": {}}),
        ("k", {"kind": "transfer", "payload": "not an object"}),
        ("k", {"kind": "transfer", "payload": {"blob": "x" * 300_000}}),
        ("k", {"kind": "transfer", "payload": {"amount": float("nan")}}),
    ],
)
def test_a_request_the_api_could_never_take_is_refused_at_once(key: str, body: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        outbox.OutboxRequest(key=key, body=body)


def test_settings_and_table_names_are_checked() -> None:
    for bad in ("Outbox", "drop table x", "1outbox", "a" * 49):
        with pytest.raises(ValueError):
            check_table(bad)
    with pytest.raises(ValueError):
        outbox.RelaySettings(backoff_min_s=5, backoff_max_s=1).validate()
    with pytest.raises(ValueError):
        outbox.ApiTarget(url="api:8080", token="t")
    assert "secret-token" not in repr(outbox.ApiTarget(url="http://api", token="secret-token"))
