"""The transfer handler against the payment stand-in: each fault gives the decision it should, and
whatever happens to the answers, ``payment_transfers`` ends with exactly one transfer per id."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from handlers_support import (
    PATIENT,
    SECRETS,
    WITHHOLD_MS,
    Standins,
    attempt_of,
    handler_settings,
    recording_server,
    running_standins,
)

from handlers.contract import Decision, Permanent, Retryable, Succeeded
from handlers.gateway import GatewaySettings
from handlers.lease_time import LeaseTime
from handlers.registry import Registry, build_registry
from handlers.settings import DownstreamSettings, HandlersSettings
from handlers.transfer import rfc3339_ms
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


# ---- a payment system that does not deduplicate: expiry enforced, or no guarantee at all ----------

QUICK = GatewaySettings(
    connect_timeout_s=0.5, write_timeout_s=0.5, read_timeout_s=0.5, pool_timeout_s=0.2, attempt_timeout_s=1.0,
    connect_tries_max=3, connect_backoff_min_s=0.01, connect_backoff_max_s=0.05,
)  # fmt: skip
"""A request's deadline is at most the attempt timeout ahead: 1 s keeps the waits short."""


@pytest.fixture
def no_dedup_expiry(database: str) -> Iterator[Standins]:
    with running_standins(database, payment_dedup=False, payment_expiry=True) as standins:
        yield standins


@pytest.fixture
def no_dedup(database: str) -> Iterator[Standins]:
    with running_standins(database, payment_dedup=False) as standins:
        yield standins


def lease_from(now_ms: int, *, lease_ms: int = 30_000, passed_ms: int = 0) -> LeaseTime:
    """A lease granted `passed_ms` ago by a store whose clock reads `now_ms` now."""
    now = time.monotonic()
    return LeaseTime(lease_ms=lease_ms, requested_s=now - passed_ms / 1000, received_s=now - passed_ms / 1000,
                     granted_ms=now_ms - passed_ms, deadline_ms=now_ms - passed_ms + lease_ms)  # fmt: skip


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_every_post_carries_an_expiry_never_past_the_lease() -> None:
    async with recording_server(201, body=b"{}") as server:
        settings = HandlersSettings(payment=DownstreamSettings(base_url=server.url, gateway=QUICK, guarantee="expiry"))
        async with build_registry(settings, secrets={}) as expiring:
            short = lease_from(wall_ms(), lease_ms=600)
            assert shape(await expiring.handler(Kind.TRANSFER).handle(attempt_of(PAYLOAD, lease=short))) == (
                "succeeded", "transferred", 201)
    (head,) = server.heads
    assert head["expires-at"] == rfc3339_ms(short.deadline_ms)  # sooner than the 1 s attempt timeout
    # The body carries the same instant (the recording server keeps heads only: the stand-in test reads bodies).


async def test_a_request_arriving_after_its_expiry_is_refused_and_retried_as_not_applied(
    no_dedup_expiry: Standins,
) -> None:
    """The request left in time by this worker's clock, but its expiry (the store's deadline of
    the lease) had passed at the payment system: as for a request held in the network."""
    async with build_registry(handler_settings(no_dedup_expiry, gateway=QUICK, guarantee="expiry"),
                              secrets=SECRETS) as expiring:  # fmt: skip
        stale = LeaseTime(lease_ms=30_000, requested_s=time.monotonic(), received_s=time.monotonic(),
                          granted_ms=wall_ms() - 31_000, deadline_ms=wall_ms() - 1000)  # the store's deadline passed
        decision = await expiring.handler(Kind.TRANSFER).handle(attempt_of(PAYLOAD, lease=stale))
        fine = await expiring.handler(Kind.TRANSFER).handle(attempt_of(PAYLOAD, number=2, previous="request_expired",
                                                                       lease=lease_from(wall_ms())))  # fmt: skip
    assert shape(decision) == ("retryable", "request_expired", 422, None, False)
    assert shape(fine) == ("succeeded", "transferred", 201)
    assert await transfers(no_dedup_expiry) == ONE_TRANSFER


@pytest.mark.parametrize(
    ("number", "previous"),
    [
        (2, "timeout"),  # the next attempt after the unknown outcome
        (1, None),  # an edited version's first attempt: the store passes on its predecessor's deadline
    ],
    ids=["retry", "edited-version"],
)
async def test_after_an_unknown_outcome_the_next_attempt_waits_for_the_expiry_then_looks(
    no_dedup_expiry: Standins, number: int, previous: str | None,
) -> None:
    skew_s = 0.3
    async with build_registry(handler_settings(no_dedup_expiry, gateway=QUICK, guarantee="expiry",
                                               clock_skew_ms=int(skew_s * 1000)), secrets=SECRETS) as expiring:  # fmt: skip
        handler = expiring.handler(Kind.TRANSFER)
        await no_dedup_expiry.faults("payment", apply_then_timeout_rate=1.0, withhold_ms=WITHHOLD_MS)
        first_lease = lease_from(wall_ms())
        first = await handler.handle(attempt_of(PAYLOAD, lease=first_lease))
        in_doubt_ms = first_lease.in_doubt_report_ms()
        await no_dedup_expiry.faults("payment")
        started = time.monotonic()
        second = await handler.handle(attempt_of(PAYLOAD, number=number, previous=previous, in_doubt_ms=in_doubt_ms,
                                                 lease=lease_from(wall_ms())))  # fmt: skip
        waited_s = time.monotonic() - started
    assert shape(first) == ("retryable", "timeout", None, None, True)
    assert in_doubt_ms is not None and 200 <= in_doubt_ms <= 1000  # the 1 s deadline, less the 0.5 s read timeout
    assert waited_s >= in_doubt_ms / 1000 + skew_s
    assert shape(second) == ("succeeded", "already transferred", 200)
    assert await transfers(no_dedup_expiry) == ONE_TRANSFER
    assert (await no_dedup_expiry.stats("payment"))["by_outcome"] == {"created": 1, "found": 1}


async def test_without_a_guarantee_an_unknown_outcome_is_looked_up_twice_then_parked_then_sent_on_redrive(
    no_dedup: Standins,
) -> None:
    horizon_s = 40.0
    async with build_registry(handler_settings(no_dedup, gateway=QUICK, guarantee="none",
                                               in_flight_horizon_s=horizon_s), secrets=SECRETS) as unguarded:  # fmt: skip
        handler = unguarded.handler(Kind.TRANSFER)
        await no_dedup.faults("payment", error_rate=1.0)  # a 503: applied or not, nobody knows
        first = await handler.handle(attempt_of(PAYLOAD, lease=lease_from(wall_ms())))
        await no_dedup.faults("payment")
        second = await handler.handle(attempt_of(PAYLOAD, number=2, previous="server_error", in_doubt_ms=-100,
                                                 lease=lease_from(wall_ms())))  # fmt: skip
        third = await handler.handle(attempt_of(PAYLOAD, number=3, previous="unknown_outcome",
                                                in_doubt_ms=-int(horizon_s * 1000) - 100, lease=lease_from(wall_ms())))  # fmt: skip
        assert await transfers(no_dedup) == []  # never sent again without finance
        redriven = await handler.handle(attempt_of(PAYLOAD, number=4, previous="unknown_outcome", budget_attempt=1,
                                                   in_doubt_ms=-int(horizon_s * 1000) - 60_000,
                                                   lease=lease_from(wall_ms())))  # fmt: skip
    assert shape(first) == ("retryable", "server_error", 503, None, True)
    assert isinstance(second, Retryable) and (second.error_class, second.outcome_unknown) == ("unknown_outcome", True)
    assert second.retry_after_s is not None and horizon_s - 1 <= second.retry_after_s <= horizon_s
    assert "404 not_found" in second.detail and "Looking again in" in second.detail
    assert isinstance(third, Permanent) and third.error_class == "unknown_outcome"
    assert "never found" in third.detail and "404 not_found" in third.detail and "redrive sends" in third.detail
    assert shape(redriven) == ("succeeded", "transferred", 201)
    assert await transfers(no_dedup) == ONE_TRANSFER
    assert (await no_dedup.stats("payment"))["by_outcome"] == {"unavailable": 1, "not_found": 3, "created": 1}


async def test_without_a_guarantee_a_transfer_made_despite_a_lost_answer_is_found_not_sent_again(
    no_dedup: Standins,
) -> None:
    async with build_registry(handler_settings(no_dedup, gateway=QUICK, guarantee="none"), secrets=SECRETS) as unguarded:
        handler = unguarded.handler(Kind.TRANSFER)
        await no_dedup.faults("payment", apply_then_drop_rate=1.0)
        first = await handler.handle(attempt_of(PAYLOAD, lease=lease_from(wall_ms())))
        await no_dedup.faults("payment")
        second = await handler.handle(attempt_of(PAYLOAD, number=2, previous="connection_lost", in_doubt_ms=0,
                                                 lease=lease_from(wall_ms())))  # fmt: skip
    assert shape(first) == ("retryable", "connection_lost", None, None, True)
    assert shape(second) == ("succeeded", "already transferred", 200)
    assert await transfers(no_dedup) == ONE_TRANSFER


async def test_every_resend_looks_first_even_after_a_known_outcome(standins: Standins, registry: Registry) -> None:
    """A redrive may come after the payment system's deduplication window: the lookup protects it."""
    handler = registry.handler(Kind.TRANSFER)
    assert shape(await handler.handle(attempt_of(PAYLOAD))) == ("succeeded", "transferred", 201)
    again = await handler.handle(attempt_of(PAYLOAD, number=2, previous="rate_limited"))
    assert shape(again) == ("succeeded", "already transferred", 200)
    assert (await standins.stats("payment"))["by_outcome"] == {"created": 1, "found": 1}


async def test_without_a_guarantee_a_lookup_that_fails_keeps_the_transfer_unknown(no_dedup: Standins) -> None:
    """So that a budget spent looking ends as unknown_outcome, never as a timeout finance might redrive blind."""
    async with build_registry(handler_settings(no_dedup, gateway=QUICK, guarantee="none"), secrets=SECRETS) as unguarded:
        await no_dedup.faults("payment", error_rate=1.0)
        looked = await unguarded.handler(Kind.TRANSFER).handle(attempt_of(PAYLOAD, number=2, previous="timeout",
                                                                          in_doubt_ms=0, lease=lease_from(wall_ms())))  # fmt: skip
    assert shape(looked) == ("retryable", "unknown_outcome", 503, None, True)
    assert await transfers(no_dedup) == []
