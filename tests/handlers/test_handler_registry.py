"""The registry: one handler per kind from a small configuration, every problem named before a
connection is opened, and settings that decode strictly from a document an operator wrote."""

from __future__ import annotations

import msgspec
import pytest
from handlers_support import SECRETS

from handlers.callback import CallbackHandler
from handlers.classification import Action, ClassificationTable, Rule
from handlers.list_update import ListUpdateHandler
from handlers.registry import RegistryError, build_registry
from handlers.settings import (
    CallbackSettings,
    CallbackTargetSettings,
    DownstreamSettings,
    HandlersSettings,
    SettingsError,
    decode_settings,
)
from handlers.tables import DEFAULT_TABLES
from handlers.transfer import TransferHandler
from ledger.kinds import Kind

TARGETS = CallbackSettings(targets=(
    CallbackTargetSettings(name="merchant-a", url="https://merchant-a.example/hooks/pay"),
    CallbackTargetSettings(name="merchant-b", url="http://127.0.0.1:9000/cb"),
))  # fmt: skip


async def test_one_handler_per_kind_each_naming_its_downstream() -> None:
    async with build_registry(HandlersSettings(callback=TARGETS), secrets=SECRETS) as registry:
        kinds = {kind: (type(handler), handler.kind, handler.downstream) for kind, handler in registry.handlers.items()}
        shown = repr(registry) + repr(registry.handler(Kind.CALLBACK))
    assert kinds == {
        Kind.TRANSFER: (TransferHandler, Kind.TRANSFER, "payment"),
        Kind.LIST_UPDATE: (ListUpdateHandler, Kind.LIST_UPDATE, "red_packet"),
        Kind.CALLBACK: (CallbackHandler, Kind.CALLBACK, "callback"),
    }
    assert "merchant-a" in shown and all(s.reveal().decode() not in shown for s in SECRETS.values())


def test_every_problem_is_named_before_anything_opens() -> None:
    settings = HandlersSettings(
        payment=DownstreamSettings(base_url="ftp://bank.example"),
        red_packet=DownstreamSettings(base_url="http://user:pw@red-packet.example/v1?x=1"),
        callback=CallbackSettings(targets=(
            CallbackTargetSettings(name="merchant-a", url="/relative"),
            CallbackTargetSettings(name="merchant-a", url="https://a.example/h"),
            CallbackTargetSettings(name="merchant-c", url="https://c.example/h"),
        )),
    )  # fmt: skip
    no_catch_all = ClassificationTable(downstream="payment", rules=(
        Rule(status_min=200, status_max=299, action=Action.SUCCESS, error_class="ok"),))  # fmt: skip
    with pytest.raises(RegistryError) as raised:
        build_registry(settings, secrets={"merchant-a": SECRETS["merchant-a"]},
                       tables={**DEFAULT_TABLES, "payment": no_catch_all})  # fmt: skip
    assert str(raised.value).splitlines() == [
        "payment.base_url: must be an absolute http:// or https:// URL",
        "red_packet.base_url: must not carry credentials",
        "red_packet.base_url: must have no query or fragment",
        "red_packet.base_url: a base URL has no path",
        "callback.targets: a target name is listed twice",
        "callback.targets.merchant-a.url: must be an absolute http:// or https:// URL",
        "table payment: the last rule must match every status (100-599) with no code",
        "callback target 'merchant-c' has no secret",
    ]
    assert "pw" not in str(raised.value)


def test_settings_decode_from_a_document_and_round_trip() -> None:
    document = b"""{
        "payment": {"base_url": "http://10.0.0.5:8443", "gateway": {"read_timeout_s": 8.0, "connections_max": 64}},
        "callback": {"targets": [{"name": "merchant-a", "url": "https://merchant-a.example/hooks/pay"}]}
    }"""
    settings = decode_settings(document)
    assert settings.payment.gateway.read_timeout_s == 8.0 and settings.payment.gateway.connect_timeout_s == 1.0
    assert settings.red_packet.base_url == "http://127.0.0.1:7202"
    assert settings.callback.gateway.read_timeout_s == 3.0  # the callbacks' tighter defaults
    assert decode_settings(msgspec.json.encode(settings)) == settings
    assert decode_settings(b"{}") == HandlersSettings()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"payment": {"base_url": "http://a", "gateway": {"read_timeout_s": 0}}}', r"Expected `float` > 0.0"),
        (b'{"payment": {"base_url": "http://a", "retries": 3}}', r"unknown field `retries`"),
        (b'{"callback": {"targets": [{"name": "Merchant A", "url": "http://a/h"}]}}', r"Expected `str` matching regex"),
        (b'{"payment": {"base_url": "http://a", "gateway": {"connections_max": 4, "keepalive_connections_max": 8}}}',
         r"payment.gateway: keepalive_connections_max must be at most connections_max"),
    ],
)  # fmt: skip
def test_settings_refuse_what_they_cannot_use(document: bytes, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        decode_settings(document)
