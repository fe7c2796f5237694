"""What the API's answer means for an outbox row: a value, decided here and executed by the relay.

Owns: the table of statuses (below), reading Retry-After, and the backoff between tries.

| answer | row | why |
|---|---|---|
| 201, 200 | sent | created, or a replay of the same key and body (the API has it) |
| 400, 409, 413, 415, 422, other 4xx | rejected, with the problem | the request itself is wrong: sending it again cannot help |
| 401, 403, 404 | pending, retried | the relay's token or URL is wrong, not the row: fix the relay and every row goes |
| 408, 429, 5xx | pending, retried after Retry-After or the backoff | the API is busy or cannot say |
| no answer | pending, retried after the backoff | the API is down or unreachable |

Must never: reject a row for a fault of the relay or the API (that would drop a failure nobody
fixed), or retry a row the API refused for what it is (that would retry forever).
"""

from __future__ import annotations

import dataclasses
import email.utils
import random
from collections.abc import Mapping
from typing import Any, Final

ACCEPTED: Final = frozenset({200, 201})
RELAY_FAULTS: Final = frozenset({401, 403, 404})
BUSY: Final = frozenset({408, 429})
PROBLEM_TEXT_MAX: Final = 500


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    status: int
    request_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Rejected:
    status: int
    problem: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    status: int | None  # None: no answer
    error: str
    retry_after_s: float | None = None

    @property
    def reason(self) -> str:
        """A metric label: never a value a producer chose."""
        if self.status is None:
            return "no_answer"
        if self.status in RELAY_FAULTS:
            return "relay_misconfigured"
        return "rate_limited" if self.status == 429 else "api_busy"


Outcome = Sent | Rejected | Retry


def parse_retry_after(value: str | None, *, now_s: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_s)


def classify(status: int, document: Any, *, text: str, retry_after_s: float | None) -> Outcome:
    """The row's fate from the API's status, its JSON document (or None) and its raw text."""
    if status in ACCEPTED:
        request_id = document.get("id") if isinstance(document, dict) else None
        return Sent(status, request_id if isinstance(request_id, str) else None)
    if status in BUSY or status >= 500:
        return Retry(status, f"HTTP {status}", retry_after_s)
    if status in RELAY_FAULTS:
        return Retry(status, f"HTTP {status}: check the relay's API URL and token")
    if 400 <= status < 500:
        problem = document if isinstance(document, dict) else {"status": status, "text": text[:PROBLEM_TEXT_MAX]}
        return Rejected(status, problem)
    return Retry(status, f"unexpected HTTP {status}")  # 1xx/3xx: not an answer the API gives


def backoff_s(*, failures: int, rng: random.Random, min_s: float, max_s: float) -> float:
    """Exponential backoff with jitter after ``failures`` failed rounds in a row (1 for the first)."""
    assert failures >= 1 and 0 < min_s <= max_s, (failures, min_s, max_s)
    ceiling = min(max_s, min_s * 2 ** min(failures - 1, 30))
    return rng.uniform(ceiling / 2, ceiling)
