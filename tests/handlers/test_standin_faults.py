"""The fault draw, alone: each setting produces its fault, the precedence between them holds, and a
seed replays the same plans whatever the settings (a fixed number of draws per request)."""

from __future__ import annotations

import random

import pytest

from handlers.standins.faults import (
    DRAWS_PER_REQUEST,
    After,
    FaultsError,
    FaultSettings,
    Plan,
    Refusal,
    decode_settings,
    draw,
    patched,
)


def plans(settings: FaultSettings, *, count: int = 200, in_outage: bool = False, seed: int = 3) -> list[Plan]:
    rng = random.Random(seed)
    return [draw(settings, rng, in_outage=in_outage) for _ in range(count)]


def test_no_settings_no_faults() -> None:
    assert set(plans(FaultSettings())) == {Plan(latency_s=0.0, refusal=None, permanent=False, after=After.ANSWER)}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (FaultSettings(error_rate=1.0), {"refusal": Refusal.UNAVAILABLE}),
        (FaultSettings(throttle_rate=1.0), {"refusal": Refusal.THROTTLED}),
        (FaultSettings(permanent_rate=1.0), {"permanent": True}),
        (FaultSettings(apply_then_timeout_rate=1.0), {"after": After.WITHHOLD}),
        (FaultSettings(apply_then_drop_rate=1.0), {"after": After.DROP}),
        (FaultSettings(latency_ms=250), {"latency_s": 0.25}),
        (FaultSettings(error_rate=1.0, throttle_rate=1.0), {"refusal": Refusal.UNAVAILABLE}),
    ],
)
def test_each_setting_at_rate_one_gives_its_fault_every_time(settings: FaultSettings, expected: dict[str, object]) -> None:
    for plan in plans(settings):
        assert {name: getattr(plan, name) for name in expected} == expected


def test_an_outage_refuses_everything_before_any_other_fault() -> None:
    assert {p.refusal for p in plans(FaultSettings(throttle_rate=1.0), in_outage=True)} == {Refusal.OUTAGE}


def test_rates_are_rates_and_a_seed_replays_the_same_plans() -> None:
    drawn = plans(FaultSettings(error_rate=0.25, apply_then_timeout_rate=0.1, apply_then_drop_rate=0.1), count=4000)
    unavailable = sum(p.refusal is Refusal.UNAVAILABLE for p in drawn) / len(drawn)
    withheld = sum(p.after is After.WITHHOLD for p in drawn) / len(drawn)
    dropped = sum(p.after is After.DROP for p in drawn) / len(drawn)
    assert (0.22 < unavailable < 0.28, 0.08 < withheld < 0.12, 0.08 < dropped < 0.12) == (True, True, True)
    assert drawn == plans(FaultSettings(error_rate=0.25, apply_then_timeout_rate=0.1, apply_then_drop_rate=0.1), count=4000)
    rng = random.Random(5)
    draw(FaultSettings(error_rate=1.0), rng, in_outage=True)
    after_one = rng.random()
    rng = random.Random(5)
    [rng.random() for _ in range(DRAWS_PER_REQUEST)]
    assert rng.random() == after_one  # four draws, whatever the settings and the outage


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"error_rate": 1.5}', r"Expected `float` <= 1.0 - at `\$.error_rate`"),
        (b'{"latency_ms": -1}', r"Expected `int` >= 0 - at `\$.latency_ms`"),
        (b'{"latency_ms": "5"}', r"Expected `int`, got `str`"),
        (b'{"outage": 5}', r"unknown field `outage`"),
        (b'{"apply_then_timeout_rate": 0.7, "apply_then_drop_rate": 0.7}', r"must be at most 1"),
    ],
)
def test_settings_decode_strictly(document: bytes, message: str) -> None:
    with pytest.raises(FaultsError, match=message):
        decode_settings(document)


def test_a_patch_changes_what_it_names_and_null_puts_a_field_back_at_its_default() -> None:
    current = FaultSettings(permanent_rate=1.0, error_rate=0.5, seed=7)
    settings, named = patched(current, b'{"outage_s": 30, "error_rate": null}')
    assert settings == FaultSettings(permanent_rate=1.0, outage_s=30.0, seed=7)
    assert named == {"outage_s", "error_rate"}
    assert patched(current, b"{}") == (current, frozenset())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"error_rate": 1.5}', r"Expected `float` <= 1.0 - at `\$.error_rate`"),
        (b'{"outage": 5}', r"unknown field `outage`"),
        (b'{"apply_then_drop_rate": 0.7}', r"must be at most 1"),  # with the timeout rate already set
        (b'[{"error_rate": 0.5}]', r"a patch is a JSON object"),
        (b'{"error_rate": ', r"truncated"),
    ],
)
def test_a_patch_is_checked_with_the_settings_it_leaves(document: bytes, message: str) -> None:
    with pytest.raises(FaultsError, match=message):
        patched(FaultSettings(apply_then_timeout_rate=0.5), document)
