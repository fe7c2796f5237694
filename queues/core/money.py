"""A payload's amount and currency, as the dead-letter filters and summaries read them.

The review's money filters mean the current payload's top-level JSON fields `amount_minor` (an
integer) and `currency` (a string); any other payload matches no filter on them. The rules were
first written as SQLite JSON functions, and the replicated behaviour they define is kept exactly:
the payload is read up to its first NUL byte; it must be strict JSON (no NaN, no BOM, no control
characters in strings); of duplicated keys the first counts; `true` and `false` are the integers 1
and 0; a number is an integer only without a fraction or exponent and within 64 bits
(tests/queues/test_money.py holds this function to SQLite's own answers).

Computed when a message enters the dead-letter tier, never on the enqueue path: parsing every
payload would cost more than the enqueue.

Must never: read state, clocks or anything but its argument.
"""

from __future__ import annotations

import json
from typing import Any, Final

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


def _first(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in pairs:
        found.setdefault(name, value)
    return found


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def money_of(payload: bytes) -> tuple[int | None, str | None]:
    """(amount_minor, currency) of a payload; each None when absent or of another type."""
    text = payload.split(b"\x00", 1)[0]
    try:
        value = json.loads(text.decode(), object_pairs_hook=_first, parse_constant=_refuse)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None, None
    if not isinstance(value, dict):
        return None, None
    amount = value.get("amount_minor")
    currency = value.get("currency")
    if isinstance(amount, bool):
        amount = int(amount)
    elif not isinstance(amount, int) or not _INT64_MIN <= amount <= _INT64_MAX:
        amount = None
    return amount, currency if isinstance(currency, str) and _unicode(currency) else None


def _unicode(text: str) -> bool:
    """Not a lone surrogate (`"\\ud800"` in the JSON): text that has no UTF-8, which no key or
    record could hold (SQLite stored such bytes, and its reads then failed on them)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
