"""The list-update handler against the red-packet stand-in: versions sent out of order, one by one
and all at once, never move a receiver's entry backwards, and an update overtaken by a newer one
is a success ("superseded by version N")."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from handlers_support import PATIENT, SECRETS, Standins, attempt_of, handler_settings

from handlers.contract import Decision, Permanent, Retryable, Succeeded
from handlers.registry import Registry, build_registry
from ledger.kinds import Kind, ListUpdatePayload


def update(version: int, *, amount_minor: int | None = None, receiver: str = "u-1") -> ListUpdatePayload:
    return ListUpdatePayload(red_packet_id="rp-1", receiver=receiver, version=version,
                             amount_minor=amount_minor or 100 + version, currency="CNY")  # fmt: skip


def shape(decision: Decision) -> tuple[Any, ...]:
    if isinstance(decision, Succeeded):
        return ("succeeded", decision.detail)
    if isinstance(decision, Retryable):
        return ("retryable", decision.error_class, decision.retry_after_s, decision.outcome_unknown)
    return ("permanent", decision.error_class)


def went_backwards(history: list[dict[str, Any]]) -> list[str]:
    """Every applied version that is not above the one applied before it, per receiver, in the
    order the service applied them. Must be empty."""
    last: dict[str, int] = {}
    found = []
    for row in history:
        if row["version"] <= last.get(row["receiver"], 0):
            found.append(f"{row['receiver']}: {last[row['receiver']]} then {row['version']}")
        last[row["receiver"]] = row["version"]
    return found


async def history(standins: Standins) -> list[dict[str, Any]]:
    return await standins.rows("SELECT receiver, version FROM red_packet_versions ORDER BY seq")


async def test_versions_out_of_order_apply_only_forwards(standins: Standins, registry: Registry) -> None:
    handler = registry.handler(Kind.LIST_UPDATE)
    decisions = [shape(await handler.handle(attempt_of(update(v), key=f"k-{v}"))) for v in (3, 1, 2, 5, 5, 4)]
    assert decisions == [
        ("succeeded", "applied version 3"),
        ("succeeded", "superseded by version 3"),
        ("succeeded", "superseded by version 3"),
        ("succeeded", "applied version 5"),
        ("succeeded", "version 5 already applied"),
        ("succeeded", "superseded by version 5"),
    ]
    assert await history(standins) == [{"receiver": "u-1", "version": 3}, {"receiver": "u-1", "version": 5}]
    assert await standins.rows("SELECT version, amount_minor FROM red_packet_receivers") == [
        {"version": 5, "amount_minor": 105}]
    assert await standins.rows("SELECT grant_id, amount_minor, state FROM red_packet_grants") == [
        {"grant_id": "rp-1:u-1", "amount_minor": 105, "state": "GRANTED"}]


async def test_versions_sent_all_at_once_never_go_backwards(standins: Standins) -> None:
    versions = [(receiver, v) for receiver in ("u-1", "u-2", "u-3") for v in range(1, 13)]
    random.Random(4).shuffle(versions)
    async with build_registry(handler_settings(standins, gateway=PATIENT), secrets=SECRETS) as patient:
        handler = patient.handler(Kind.LIST_UPDATE)
        decisions = await asyncio.gather(*(
            handler.handle(attempt_of(update(v, receiver=r), key=f"{r}-{v}")) for r, v in versions))  # fmt: skip
    assert all(isinstance(d, Succeeded) for d in decisions), [d for d in decisions if not isinstance(d, Succeeded)]
    applied = await history(standins)
    assert went_backwards(applied) == []
    assert await standins.rows("SELECT receiver, version FROM red_packet_receivers ORDER BY receiver") == [
        {"receiver": r, "version": 12} for r in ("u-1", "u-2", "u-3")]
    assert sum(d.detail.startswith("applied") for d in decisions if isinstance(d, Succeeded)) == len(applied)
    assert (await standins.stats("red_packet"))["applied"] == len(applied)


async def test_the_checker_catches_a_version_that_went_backwards(standins: Standins, registry: Registry) -> None:
    """The check above must be able to fail: plant a regression the service would never write."""
    await registry.handler(Kind.LIST_UPDATE).handle(attempt_of(update(4)))
    await standins.rows("INSERT INTO red_packet_versions (red_packet_id, receiver, version, amount_minor, currency,"
                        " idempotency_key, applied_at) VALUES ('rp-1', 'u-1', 2, 1, 'CNY', 'planted', now())"
                        " RETURNING seq")  # fmt: skip
    assert went_backwards(await history(standins)) == ["u-1: 4 then 2"]


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"error_rate": 1.0}, ("retryable", "server_error", None, True)),
        ({"throttle_rate": 1.0, "retry_after_s": 3}, ("retryable", "rate_limited", 3.0, False)),
        ({"permanent_rate": 1.0}, ("permanent", "red_packet_closed")),
        ({"apply_then_drop_rate": 1.0}, ("retryable", "connection_lost", None, True)),
    ],
    ids=["unavailable", "throttled", "closed", "apply-then-drop"],
)
async def test_each_fault_gives_its_decision(
    standins: Standins, registry: Registry, faults: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    await standins.faults("red_packet", **faults)
    assert shape(await registry.handler(Kind.LIST_UPDATE).handle(attempt_of(update(1)))) == expected


async def test_a_version_with_other_content_is_permanent(standins: Standins, registry: Registry) -> None:
    handler = registry.handler(Kind.LIST_UPDATE)
    await handler.handle(attempt_of(update(2)))
    conflict = await handler.handle(attempt_of(update(2, amount_minor=999)))
    assert isinstance(conflict, Permanent) and (conflict.error_class, conflict.status) == ("version_conflict", 409)
