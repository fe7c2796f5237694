"""The callback handler against the callback receiver: signed bodies are accepted, tampered or
wrongly signed ones refused by the receiver, repeats counted, redirects never followed, unknown
targets permanent, and no secret ever reaches a log line, a repr, an exception or a decision."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Any

import pytest
from handlers_support import FAST, SECRETS, WITHHOLD_MS, Standins, attempt_of, handler_settings, recording_server

from handlers.callback import CallbackHandler, CallbackTarget
from handlers.contract import Decision, Permanent, Retryable, Succeeded
from handlers.gateway import Gateway
from handlers.registry import Registry, build_registry
from handlers.signing import Secret
from handlers.tables import CALLBACK_TABLE
from ledger.kinds import CallbackPayload, Kind, TransferPayload

PAYLOAD = CallbackPayload(target="merchant-a", body={"order": "o-1", "paid": True, "amount_minor": 500})
CANONICAL_BODY = b'{"amount_minor":500,"order":"o-1","paid":true}'


def shape(decision: Decision) -> tuple[Any, ...]:
    if isinstance(decision, Succeeded):
        return ("succeeded", decision.detail, decision.status)
    if isinstance(decision, Retryable):
        return ("retryable", decision.error_class, decision.status, decision.outcome_unknown)
    return ("permanent", decision.error_class, decision.status)


async def deliveries(standins: Standins) -> list[dict[str, Any]]:
    return await standins.rows("SELECT target, idempotency_key, count FROM callback_deliveries")


async def test_a_signed_callback_is_received_and_its_repeats_counted(standins: Standins, registry: Registry) -> None:
    handler = registry.handler(Kind.CALLBACK)
    first = await handler.handle(attempt_of(PAYLOAD, key="cb-1"))
    second = await handler.handle(attempt_of(PAYLOAD, number=2, previous="timeout", key="cb-1"))
    assert (shape(first), shape(second)) == (("succeeded", "delivered", 200), ("succeeded", "already delivered", 200))
    assert await deliveries(standins) == [{"target": "merchant-a", "idempotency_key": "cb-1", "count": 2}]


async def test_the_signature_is_hmac_sha256_of_the_timestamp_and_the_exact_bytes_sent() -> None:
    async with recording_server(200) as merchant:
        gateway = Gateway(downstream="callback", settings=FAST)
        target = CallbackTarget(name="merchant-a", url=f"{merchant.url}/hook", secret=SECRETS["merchant-a"])
        handler = CallbackHandler(sender=gateway, table=CALLBACK_TABLE, targets={"merchant-a": target},
                                  clock=lambda: 1_800_000_000.5)  # fmt: skip
        try:
            await handler.handle(attempt_of(PAYLOAD, key="cb-9"))
        finally:
            await gateway.aclose()
    (head,) = merchant.heads
    digest = hmac.new(SECRETS["merchant-a"].reveal(), b"1800000000." + CANONICAL_BODY, hashlib.sha256).hexdigest()
    assert head["webhook-signature"] == f"t=1800000000,v1={digest}"
    assert (head["request-line"], head["idempotency-key"], head["content-type"]) == (
        "POST /hook HTTP/1.1", "cb-9", "application/json")


async def test_a_callback_signed_with_another_secret_is_refused_by_the_receiver(standins: Standins) -> None:
    wrong = {**SECRETS, "merchant-a": Secret(b"whsec-not-what-the-merchant-has")}
    async with build_registry(handler_settings(standins), secrets=wrong) as registry:
        refused = await registry.handler(Kind.CALLBACK).handle(attempt_of(PAYLOAD))
    assert shape(refused) == ("permanent", "signature_refused", 401)
    assert await deliveries(standins) == []
    assert (await standins.stats("callback"))["by_outcome"] == {"bad_signature": 1}


async def test_a_late_signature_is_refused_as_stale(standins: Standins) -> None:
    gateway = Gateway(downstream="callback", settings=FAST)
    target = CallbackTarget(name="merchant-a", url=f"{standins.urls['callback']}/callbacks/merchant-a",
                            secret=SECRETS["merchant-a"])  # fmt: skip
    late = CallbackHandler(sender=gateway, table=CALLBACK_TABLE, targets={"merchant-a": target},
                           clock=lambda: time.time() - 600)  # fmt: skip
    try:
        refused = await late.handle(attempt_of(PAYLOAD))
    finally:
        await gateway.aclose()
    assert shape(refused) == ("permanent", "signature_refused", 401)
    assert (await standins.stats("callback"))["by_outcome"] == {"stale_signature": 1}


async def test_an_unknown_target_is_permanent_and_nothing_is_sent(standins: Standins, registry: Registry) -> None:
    unknown = CallbackPayload(target="merchant-z", body={"order": "o-1"})
    decision = await registry.handler(Kind.CALLBACK).handle(attempt_of(unknown))
    assert decision == Permanent(error_class="unknown_target", detail="no callback target is named 'merchant-z'")
    assert (await standins.stats("callback"))["requests"] == 0


async def test_a_redirect_is_refused_never_followed(standins: Standins) -> None:
    receiver = f"{standins.urls['callback']}/callbacks/merchant-a"
    async with recording_server(308, headers={"Location": receiver}) as moved:
        gateway = Gateway(downstream="callback", settings=FAST)
        target = CallbackTarget(name="merchant-a", url=f"{moved.url}/old-hook", secret=SECRETS["merchant-a"])
        handler = CallbackHandler(sender=gateway, table=CALLBACK_TABLE, targets={"merchant-a": target})
        try:
            decision = await handler.handle(attempt_of(PAYLOAD))
        finally:
            await gateway.aclose()
    assert shape(decision) == ("permanent", "redirect_refused", 308)
    assert len(moved.heads) == 1
    assert (await standins.stats("callback"))["requests"] == 0


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"error_rate": 1.0}, ("retryable", "server_error", 503, True)),
        ({"permanent_rate": 1.0}, ("permanent", "gone", 410)),
        ({"apply_then_timeout_rate": 1.0, "withhold_ms": WITHHOLD_MS}, ("retryable", "timeout", None, True)),
    ],
    ids=["unavailable", "gone", "apply-then-timeout"],
)
async def test_each_fault_gives_its_decision(
    standins: Standins, registry: Registry, faults: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    await standins.faults("callback", **faults)
    assert shape(await registry.handler(Kind.CALLBACK).handle(attempt_of(PAYLOAD))) == expected


async def test_no_secret_or_signature_reaches_a_log_a_repr_or_a_decision(
    standins: Standins, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    handler = registry.handler(Kind.CALLBACK)
    shown: list[str] = [repr(registry), repr(handler), repr(SECRETS), str(SECRETS["merchant-a"])]
    for faults in ({}, {"error_rate": 1.0}, {"apply_then_drop_rate": 1.0}):
        await standins.faults("callback", **faults)
        shown.append(repr(await handler.handle(attempt_of(PAYLOAD, key=f"k-{len(shown)}"))))
    wrong = {**SECRETS, "merchant-a": Secret(b"whsec-not-what-the-merchant-has")}
    async with build_registry(handler_settings(standins), secrets=wrong) as other:
        await standins.faults("callback")
        shown.append(repr(await other.handler(Kind.CALLBACK).handle(attempt_of(PAYLOAD))))
    with pytest.raises(TypeError) as raised:
        await handler.handle(attempt_of(TransferPayload(transfer_id="t-1", payer="a", payee="b", amount_minor=1,
                                                        currency="CNY")))  # fmt: skip
    shown.append(str(raised.value))
    text = "\n".join([caplog.text, *shown])
    assert "callback POST /callbacks/merchant-a" in caplog.text  # the gateway did log, and what
    for secret in (*SECRETS.values(), wrong["merchant-a"]):
        assert secret.reveal().decode() not in text
    assert "v1=" not in text and "Webhook-Signature" not in text

