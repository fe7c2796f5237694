"""The faults a stand-in injects, and the pure draw that decides them for one request.

Settings are the same for the three stand-ins. At runtime ``PUT /_faults`` replaces them whole (a
field left out is back at its default), and ``PATCH /_faults`` changes only the fields it names, as a
JSON merge patch (RFC 7396: null puts a field back at its default), so adding an outage keeps the
error rate already set. Either is checked whole, by the same rules, and refused whole (422):
- `error_rate`: answer 503 ``unavailable`` before doing anything (nothing applied);
- `latency_ms`: wait this long before handling the request;
- `throttle_rate`: answer 429 ``rate_limited`` with ``Retry-After: retry_after_s`` (nothing applied);
- `outage_s`: every request answers 503 ``outage`` for this long from the moment it is set;
- `permanent_rate`: the service's own permanent refusal (the payment system's insufficient funds,
  the red-packet service's closed red packet, the callback receiver's 410), nothing applied;
- `apply_then_timeout_rate`: apply and commit, then withhold the answer for `withhold_ms` (past the
  client's read timeout): the dangerous case, an effect the caller cannot see;
- `apply_then_drop_rate`: apply and commit, then cut the connection before the answer is complete;
- `seed`: reseed the stand-in's generator, so a run of draws can be replayed.

Precedence when several are drawn: outage, then unavailable, then throttled, then permanent; the two
"apply then" faults exclude each other (their rates add up to at most 1).

Must never: read a clock or use the global random generator (the caller owns both).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

LATENCY_MS_MAX: Final = 60_000
WITHHOLD_MS_MAX: Final = 600_000
RETRY_AFTER_S_MAX: Final = 86_400
OUTAGE_S_MAX: Final = 86_400.0
DRAWS_PER_REQUEST: Final = 4
"""Uniforms drawn for every request whatever the settings, so one seed replays one sequence."""

Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class FaultSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    error_rate: Rate = 0.0
    latency_ms: Annotated[int, msgspec.Meta(ge=0, le=LATENCY_MS_MAX)] = 0
    throttle_rate: Rate = 0.0
    retry_after_s: Annotated[int, msgspec.Meta(ge=0, le=RETRY_AFTER_S_MAX)] = 1
    outage_s: Annotated[float, msgspec.Meta(ge=0.0, le=OUTAGE_S_MAX)] = 0.0
    permanent_rate: Rate = 0.0
    apply_then_timeout_rate: Rate = 0.0
    withhold_ms: Annotated[int, msgspec.Meta(ge=0, le=WITHHOLD_MS_MAX)] = 30_000
    apply_then_drop_rate: Rate = 0.0
    seed: int | None = None

    def problems(self) -> list[str]:
        if self.apply_then_timeout_rate + self.apply_then_drop_rate > 1.0:
            return ["apply_then_timeout_rate + apply_then_drop_rate must be at most 1"]
        return []


class FaultsError(ValueError):
    """Settings that do not decode or contradict each other; the message is for the caller."""


def decode_settings(data: bytes) -> FaultSettings:
    try:
        settings = msgspec.json.decode(data, type=FaultSettings, strict=True)
    except msgspec.DecodeError as error:
        raise FaultsError(str(error)) from None
    problems = settings.problems()
    if problems:
        raise FaultsError("; ".join(problems))
    return settings


def patched(settings: FaultSettings, data: bytes) -> tuple[FaultSettings, frozenset[str]]:
    """`settings` with a merge patch applied, checked as a whole document is, and the fields the
    patch named (the caller restarts an outage, or reseeds, only when the patch says so)."""
    try:
        patch = msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise FaultsError(str(error)) from None
    if not isinstance(patch, dict):
        raise FaultsError("a patch is a JSON object of the fields to change (null: back to the default)")
    merged = {name: value for name, value in {**msgspec.to_builtins(settings), **patch}.items() if value is not None}
    return decode_settings(msgspec.json.encode(merged)), frozenset(patch)


class Refusal(enum.Enum):
    OUTAGE = "outage"
    UNAVAILABLE = "unavailable"
    THROTTLED = "throttled"


class After(enum.Enum):
    """What happens to the answer of a request that was handled."""

    ANSWER = "answer"
    WITHHOLD = "withhold"
    DROP = "drop"


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The faults of one request, decided before it is handled."""

    latency_s: float
    refusal: Refusal | None
    permanent: bool
    """The route refuses with its service's permanent error instead of applying."""
    after: After


def draw(settings: FaultSettings, rng: random.Random, *, in_outage: bool) -> Plan:
    error, throttle, permanent, after = (rng.random() for _ in range(DRAWS_PER_REQUEST))
    refusal = (
        Refusal.OUTAGE if in_outage
        else Refusal.UNAVAILABLE if error < settings.error_rate
        else Refusal.THROTTLED if throttle < settings.throttle_rate
        else None
    )  # fmt: skip
    fate = (
        After.WITHHOLD if after < settings.apply_then_timeout_rate
        else After.DROP if after < settings.apply_then_timeout_rate + settings.apply_then_drop_rate
        else After.ANSWER
    )  # fmt: skip
    return Plan(
        latency_s=settings.latency_ms / 1000, refusal=refusal, permanent=permanent < settings.permanent_rate, after=fate
    )
