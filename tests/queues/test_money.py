"""A payload's amount and currency, held to SQLite's JSON functions (which first defined them).

The dead-letter filters and summaries mean the current payload's top-level `amount_minor` (an
integer) and `currency` (a string), as the SQL store read them with `json_valid`, `json_extract` and
`typeof` over the payload cast to text. `queues.core.money.money_of` must give the same answer for
any payload: generated JSON-ish bytes, and the cases that differ between JSON parsers.

Three differences are kept on purpose (docs/queue.md, "Upgrading from the SQL store"): SQLite's
`typeof` calls an array or object `text`, so the SQL store took a `"currency": [...]` as a currency
spelled in JSON, where the core takes it as no currency; a currency holding a NUL character
(`"\u0000"`) came back from SQLite cut at the NUL, where the core keeps it whole; and a currency
with a lone surrogate (`"\ud800"`) came back as bytes that are not UTF-8, which failed the SQL
store's reads, where the core takes it as no currency. No currency filter can match any of them
(it is three upper-case letters), so only a summary's grouping of such payloads differs.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queues.core.money import money_of

_SQL = (
    "SELECT iif(typeof(json_extract(money, '$[0]')) = 'integer', json_extract(money, '$[0]'), NULL),"
    " iif(typeof(json_extract(money, '$[1]')) = 'text', json_extract(money, '$[1]'), NULL)"
    " FROM (SELECT iif(json_valid(CAST(? AS TEXT)), json_extract(CAST(? AS TEXT), '$.amount_minor', '$.currency'),"
    " NULL) AS money)"
)
_CONN = sqlite3.connect(":memory:")


def sqlite_money(payload: bytes) -> tuple[int | None, str | None]:
    amount, currency = _CONN.execute(_SQL, (payload, payload)).fetchone()
    return amount, currency


CASES = [
    b'{"amount_minor": 100, "currency": "CNY"}', b'{"currency":"A","currency":"B"}',
    b'{"amount_minor":5,"amount_minor":7}', b'{"amount_minor": 9223372036854775807}',
    b'{"amount_minor": 9223372036854775808}', b'{"amount_minor": -9223372036854775808}',
    b'{"amount_minor": -9223372036854775809}', b'{"amount_minor": -0}', b'{"amount_minor": 1e3}',
    b'{"amount_minor": 10.0}', b'{"amount_minor": 12E1}', b'{"amount_minor": true, "currency": false}',
    b'{"amount_minor": false}', b'{"amount_minor": null, "currency": null}', b'{"amount_minor": "100"}',
    b'[1, 2, {"currency": "CNY"}]', b"5", b'"text"', b"", b"not json", b'{"amount_minor": 01}',
    b'{"currency": "x", }', b'{"currency":"A"}\x00garbage', b'\x00{"currency":"A"}', b'{"currency":"A\x00B"}',
    b'\xef\xbb\xbf{"currency":"A"}', b'{"currency":"x\ty"}', b'{"currency":"a\\"b"}', b'{"currency":"\\/x"}',
    b'{"amount_minor": NaN}', b'{"amount_minor": Infinity}', b'{"amount_minor": .5}', b'{"amount_minor": 5.}',
    b'\t{"currency":"A"}\n', b'{"currency": "\xc3\xa9"}', b'{"x":{"currency":"B"},"currency":"A"}',
    b'{"amount_minor": 1 }', b'{"amount_minor": 1e400}', b'{"a":[1,2,}',
]  # fmt: skip


def test_the_cases_that_differ_between_parsers() -> None:
    for payload in CASES:
        assert money_of(payload) == sqlite_money(payload), payload


def test_the_differences_kept_on_purpose() -> None:
    payload = b'{"amount_minor": 5, "currency": ["CNY"]}'
    assert money_of(payload) == (5, None) and sqlite_money(payload) == (5, '["CNY"]')
    payload = b'{"amount_minor": 5, "currency": "C\\u0000NY"}'
    assert money_of(payload) == (5, "C\x00NY") and sqlite_money(payload) == (5, "C")
    payload = b'{"amount_minor": 5, "currency": "\\ud800"}'
    assert money_of(payload) == (5, None)
    with pytest.raises(sqlite3.OperationalError, match="UTF-8"):
        sqlite_money(payload)


_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=8)
)  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    amount=_values, currency=_scalars, extra=st.dictionaries(st.sampled_from(["n", "amount_minor"]), _values),
    first=st.booleans(),
)
def test_any_object_payload(amount: object, currency: object, extra: dict[str, object], first: bool) -> None:
    fields = [f'"amount_minor": {json.dumps(amount)}', f'"currency": {json.dumps(currency)}']
    fields += [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items()]  # duplicates of the two, too
    if not first:
        fields.reverse()
    payload = ("{" + ", ".join(fields) + "}").encode()
    assert money_of(payload) == sqlite_money(payload), payload


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes(payload: bytes) -> None:
    try:
        payload.decode()
    except UnicodeDecodeError:
        return  # SQLite hands invalid UTF-8 back as text Python cannot read: the old query failed on it
    assert money_of(payload) == sqlite_money(payload), payload
