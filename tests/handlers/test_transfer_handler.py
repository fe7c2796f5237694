"""The transfer handler against the payment stand-in: each fault gives the decision it should, and
whatever happens to the answers, ``payment_transfers`` ends with exactly one transfer per id."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from handlers_support import PATIENT, SECRETS, WITHHOLD_MS, Standins, attempt_of, handler_settings

from handlers.contract import Decision, Permanent, Retryable, Succeeded
from handlers.registry import Registry, build_registry
from ledger.kinds import Kind, TransferPayload

PAYLOAD = TransferPayload(transfer_id="t-1", payer="escrow", payee="u-1", amount_minor=888, currency="CNY", memo="rp")


def shape(decision: Decision) -> tuple[Any, ...]:
    """What a test compares: type, error class (or detail), status, Retry-After, outcome unknown."""
    if isinstance(decision, Succeeded):
        return ("succeeded", decision.detail, decision.status)
    if isinstance(decision, Retryable):
        return ("retryable", decision.error_class, decision.status, decision.retry_after_s, decision.outcome_unknown)
    return ("permanent", decision.error_class, decision.status)


async def transfers(standins: Standins) -> list[dict[str, Any]]:
    return await standins.rows("SELECT transfer_id, business_id, amount_minor, status FROM payment_transfers")


ONE_TRANSFER = [{"transfer_id": "t-1", "business_id": "grant-1", "amount_minor": 888, "status": "SUCCEEDED"}]


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({}, ("succeeded", "transferred", 201)),
        ({"latency_ms": 100}, ("succeeded", "transferred", 201)),
        ({"error_rate": 1.0}, ("retryable", "server_error", 503, None, True)),
        ({"outage_s": 30}, ("retryable", "server_error", 503, None, True)),
        ({"throttle_rate": 1.0, "retry_after_s": 2}, ("retryable", "rate_limited", 429, 2.0, False)),
        ({"permanent_rate": 1.0}, ("permanent", "insufficient_funds", 422)),
        ({"apply_then_timeout_rate": 1.0, "withhold_ms": WITHHOLD_MS}, ("retryable", "timeout", None, None, True)),
        ({"apply_then_drop_rate": 1.0}, ("retryable", "connection_lost", None, None, True)),
    ],
    ids=["none", "latency", "unavailable", "outage", "throttled", "insufficient-funds", "apply-then-timeout",
         "apply-then-drop"],
)  # fmt: skip
async def test_each_fault_gives_its_decision(
    standins: Standins, registry: Registry, faults: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    await standins.faults("payment", **faults)
    assert shape(await registry.handler(Kind.TRANSFER).handle(attempt_of(PAYLOAD))) == expected


@pytest.mark.parametrize(
    ("fault", "unknown_class"),
    [({"apply_then_timeout_rate": 1.0, "withhold_ms": WITHHOLD_MS}, "timeout"),
     ({"apply_then_drop_rate": 1.0}, "connection_lost")],
    ids=["withheld", "dropped"],
)  # fmt: skip
async def test_applied_then_no_answer_then_a_retry_pays_exactly_once(
    standins: Standins, registry: Registry, fault: dict[str, Any], unknown_class: str
) -> None:
    handler = registry.handler(Kind.TRANSFER)
    await standins.faults("payment", **fault)
    first = await handler.handle(attempt_of(PAYLOAD))
    await standins.faults("payment")
    second = await handler.handle(attempt_of(PAYLOAD, number=2, previous=unknown_class))
    third = await handler.handle(attempt_of(PAYLOAD, number=3, previous="lease_expired"))
    assert shape(first) == ("retryable", unknown_class, None, None, True)
    assert shape(second) == shape(third) == ("succeeded", "already transferred", 200)
    assert await transfers(standins) == ONE_TRANSFER
    stats = await standins.stats("payment")
    assert stats["by_outcome"] == {"created": 1, "found": 2}  # the retries looked; they never posted again
    assert stats["applied"] == 1


async def test_after_an_unknown_outcome_that_made_nothing_the_transfer_is_sent(
    standins: Standins, registry: Registry
) -> None:
    handler = registry.handler(Kind.TRANSFER)
    await standins.faults("payment", error_rate=1.0)
    first = await handler.handle(attempt_of(PAYLOAD))
    await standins.faults("payment")
    second = await handler.handle(attempt_of(PAYLOAD, number=2, previous="server_error"))
    assert shape(first) == ("retryable", "server_error", 503, None, True)
    assert shape(second) == ("succeeded", "transferred", 201)
    assert (await standins.stats("payment"))["by_outcome"] == {"unavailable": 1, "not_found": 1, "created": 1}
    assert await transfers(standins) == ONE_TRANSFER


async def test_a_lookup_that_fails_keeps_the_outcome_unknown_for_the_next_attempt(
    standins: Standins, registry: Registry
) -> None:
    handler = registry.handler(Kind.TRANSFER)
    await standins.faults("payment", apply_then_timeout_rate=1.0, withhold_ms=WITHHOLD_MS)
    await handler.handle(attempt_of(PAYLOAD))
    await standins.faults("payment", throttle_rate=1.0, retry_after_s=4)
    throttled_lookup = await handler.handle(attempt_of(PAYLOAD, number=2, previous="timeout"))
    await standins.faults("payment", error_rate=1.0)
    failed_lookup = await handler.handle(attempt_of(PAYLOAD, number=3, previous="timeout"))
    await standins.faults("payment")
    settled = await handler.handle(attempt_of(PAYLOAD, number=4, previous="timeout"))
    assert shape(throttled_lookup) == ("retryable", "timeout", 429, 4.0, True)
    assert shape(failed_lookup) == ("retryable", "timeout", 503, None, True)
    assert shape(settled) == ("succeeded", "already transferred", 200)
    assert await transfers(standins) == ONE_TRANSFER


async def test_the_same_id_with_other_content_goes_to_a_person(standins: Standins, registry: Registry) -> None:
    handler = registry.handler(Kind.TRANSFER)
    other = TransferPayload(**{**PAYLOAD.model_dump(), "amount_minor": 999})
    assert shape(await handler.handle(attempt_of(PAYLOAD))) == ("succeeded", "transferred", 201)
    looked = await handler.handle(attempt_of(other, previous="timeout"))
    posted = await handler.handle(attempt_of(other))
    other_business = await handler.handle(attempt_of(PAYLOAD, previous="timeout", ref_key="grant-2"))
    assert isinstance(looked, Permanent) and looked.error_class == "transfer_mismatch"
    assert "another amount_minor: a person must look" in looked.detail
    assert isinstance(other_business, Permanent) and "another business_id" in other_business.detail
    assert shape(posted) == ("permanent", "idempotency_conflict", 409)
    assert await transfers(standins) == ONE_TRANSFER


async def test_a_closed_account_is_permanent(standins: Standins, registry: Registry) -> None:
    closed = TransferPayload(**{**PAYLOAD.model_dump(), "payee": "closed-u-1"})
    assert shape(await registry.handler(Kind.TRANSFER).handle(attempt_of(closed))) == ("permanent", "account_closed", 422)
    assert await transfers(standins) == []


async def test_workers_racing_one_transfer_make_one(standins: Standins) -> None:
    """Leases that expired while their workers still ran: deliveries of one message at once."""
    async with build_registry(handler_settings(standins, gateway=PATIENT), secrets=SECRETS) as patient:
        handler = patient.handler(Kind.TRANSFER)
        decisions = await asyncio.gather(*(handler.handle(attempt_of(PAYLOAD, number=n)) for n in (1, 2, 3, 4)))
    assert sorted(shape(d) for d in decisions) == [("succeeded", "already transferred", 200)] * 3 + [
        ("succeeded", "transferred", 201)]
    assert await transfers(standins) == ONE_TRANSFER


async def test_a_wrong_payload_is_a_programmer_error(registry: Registry) -> None:
    from ledger.kinds import CallbackPayload

    with pytest.raises(TypeError, match="a transfer attempt carries a CallbackPayload"):
        await registry.handler(Kind.TRANSFER).handle(attempt_of(CallbackPayload(target="merchant-a", body={})))
