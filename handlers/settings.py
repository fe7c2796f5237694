"""The handlers' configuration: where each downstream is, its client's timeouts and limits, and
the registered callback targets.

Every field has a default that works on one machine (the stand-ins' default ports), so an empty
document is valid. msgspec Structs, like compensator/config.py's, so a TOML table or a JSON document
decodes into them strictly (`decode_settings`). Callback targets carry a name and a URL only: their
secrets are not configuration text, the composition root reads them (a file, the environment) and
hands them to the registry as `Secret`s.

Must never: read the environment or a file, or hold a secret.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final
from urllib.parse import urlsplit

import msgspec

from handlers.gateway import GatewaySettings
from ledger.kinds import TARGET_PATTERN

TARGETS_MAX: Final = 256
URL_CHARS_MAX: Final = 2048

CALLBACK_GATEWAY: Final = GatewaySettings(
    connect_timeout_s=1.0, write_timeout_s=2.0, read_timeout_s=3.0, pool_timeout_s=1.0, attempt_timeout_s=5.0,
    connections_max=16,
)  # fmt: skip
"""Merchant endpoints are many and slow ones must not hold our workers: tighter than a payment API's."""

Url = Annotated[str, msgspec.Meta(min_length=1, max_length=URL_CHARS_MAX)]
TargetName = Annotated[str, msgspec.Meta(pattern=TARGET_PATTERN)]


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Guarantee(enum.StrEnum):
    """What a downstream guarantees about a request it receives twice or late (docs/worker.md)."""

    DEDUP = "dedup"
    """It honours our idempotency key (the transfer id) for at least `dedup_window_s`: a repeat
    within it is answered, not applied again."""
    EXPIRY = "expiry"
    """It enforces the `expires_at` every request carries, by its own clock: a request that
    arrives after it is refused and writes nothing."""
    NONE = "none"
    """No guarantee: a repeat is a new payment and a late request is applied."""


SKEW_MS_MAX: Final = 60_000
"""Clocks a minute apart are broken, not skewed; and an attempt waits at most a minute inside its lease."""
HORIZON_S_MAX: Final = 7 * 86_400
WINDOW_S_MAX: Final = 10 * 366 * 86_400


class DownstreamSettings(_Settings, frozen=True):
    base_url: Url
    """The downstream's base URL (scheme, host, port; no path): the handlers add their paths."""
    gateway: GatewaySettings = GatewaySettings()
    """The HTTP client's timeouts and limits for this downstream."""
    guarantee: Guarantee = Guarantee.DEDUP
    """What the downstream guarantees: `dedup` (it deduplicates on our idempotency key), `expiry` (it
    refuses a request that arrives after its `expires_at`) or `none` (after an unknown outcome a
    transfer is never sent again automatically: looked up, then parked for finance)."""
    dedup_window_s: Annotated[int, msgspec.Meta(ge=1, le=WINDOW_S_MAX)] | None = None
    """`dedup` only: how long it keeps an idempotency key; unset, as long as it keeps its transfers.
    A worker refuses to start while a retry policy of this downstream's kinds can re-send later
    than this (delay/policy.py `horizon_ms`)."""
    clock_skew_ms: Annotated[int, msgspec.Meta(ge=0, le=SKEW_MS_MAX)] = 1000
    """`expiry`: the largest difference between the store's clock (the log's) and the downstream's.
    After an unknown outcome the next attempt looks the request up only once its expiry plus this
    has passed; a larger real difference can let a late request through after that lookup."""
    in_flight_horizon_s: Annotated[float, msgspec.Meta(gt=0, le=HORIZON_S_MAX)] = 300.0
    """`none`: the longest a request may still take effect after its attempt's deadline (a worker
    paused, a request held in the network). After an unknown outcome the request is looked up at
    once and again this long after that deadline; still not found, it is parked as `unknown_outcome`."""


class CallbackTargetSettings(_Settings, frozen=True):
    name: TargetName
    url: Url
    """Where this target's callbacks are POSTed, whole: a callback never chooses a URL."""


class CallbackSettings(_Settings, frozen=True):
    gateway: GatewaySettings = CALLBACK_GATEWAY
    """The HTTP client's timeouts and limits for callbacks: strict, since a target is someone else's server."""
    targets: Annotated[tuple[CallbackTargetSettings, ...], msgspec.Meta(max_length=TARGETS_MAX)] = ()
    """The registered callback targets, each `{ name = "...", url = "..." }`; a callback request names its target, never a URL."""


class HandlersSettings(_Settings, frozen=True):
    payment: DownstreamSettings = DownstreamSettings(base_url="http://127.0.0.1:7201")
    """The payment system (transfers)."""
    red_packet: DownstreamSettings = DownstreamSettings(base_url="http://127.0.0.1:7202")
    """The red-packet service (receive-list updates)."""
    callback: CallbackSettings = CallbackSettings()
    """Callbacks to registered targets (user-info writes)."""

    def problems(self) -> list[str]:
        try:  # settings built in Python skipped the decoder's checks
            msgspec.json.decode(msgspec.json.encode(self), type=HandlersSettings, strict=True)
        except msgspec.ValidationError as error:
            return [str(error)]
        found: list[str] = []
        for name, downstream in (("payment", self.payment), ("red_packet", self.red_packet)):
            found += [f"{name}.base_url: {p}" for p in url_problems(downstream.base_url, base=True)]
            found += [f"{name}.gateway: {p}" for p in downstream.gateway.problems()]
            if downstream.dedup_window_s is not None and downstream.guarantee != Guarantee.DEDUP:
                found.append(f"{name}.dedup_window_s: applies to guarantee dedup only (this one is {downstream.guarantee})")
        if self.red_packet.guarantee != Guarantee.DEDUP:
            found.append("red_packet.guarantee: a list update carries its version, which the red-packet service applies"
                         " only forward: that is its deduplication, so only dedup describes it")  # fmt: skip
        found += [f"callback.gateway: {p}" for p in self.callback.gateway.problems()]
        names = [target.name for target in self.callback.targets]
        if len(set(names)) != len(names):
            found.append("callback.targets: a target name is listed twice")
        for target in self.callback.targets:
            found += [f"callback.targets.{target.name}.url: {p}" for p in url_problems(target.url, base=False)]
        return found


def url_problems(url: str, *, base: bool) -> list[str]:
    """An absolute http(s) URL with a host, no credentials, query or fragment; a base URL also no path."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        return ["not a URL"]
    found: list[str] = []
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        found.append("must be an absolute http:// or https:// URL")
    if not port_ok:
        found.append("port out of range")
    if parts.username is not None or parts.password is not None:
        found.append("must not carry credentials")
    if parts.query or parts.fragment:
        found.append("must have no query or fragment")
    if base and parts.path not in {"", "/"}:
        found.append("a base URL has no path")
    return found


class SettingsError(ValueError):
    """Settings that do not decode or contradict each other; one problem per line."""


def decode_settings(data: bytes) -> HandlersSettings:
    try:
        settings = msgspec.json.decode(data, type=HandlersSettings, strict=True)
    except msgspec.DecodeError as error:
        raise SettingsError(str(error)) from None
    problems = settings.problems()
    if problems:
        raise SettingsError("\n".join(problems))
    return settings
