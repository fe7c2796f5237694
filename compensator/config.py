"""The service's configuration: one validated model, read from a TOML file and the environment.

    [store]
    addresses = ["10.0.1.1:7100", "10.0.1.2:7100", "10.0.1.3:7100"]
    [api]
    port = 8080
    workers = 2

Environment variables override the file, one field each: ``COMPENSATOR_API__PORT=8081``
(``COMPENSATOR_`` + section + ``__`` + field, upper case). A list is JSON or comma-separated.
Every field has a default that works on one machine (`make run`), so an empty file, or none at
all, is a valid configuration. `load` validates the whole model and raises `ConfigError` with one
line per problem, naming the field and where its value came from.

Owns: the shape, the defaults, the checks between fields, and reading the file and environment.
Must never: be read anywhere but the composition root (compensator/wiring.py and the command
line); the packages it configures take typed values, never this module or os.environ.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from compensator.worker.breaker import BreakerSettings
from handlers.settings import HandlersSettings
from outbox import RelaySettings

ENV_PREFIX: Final = "COMPENSATOR_"
METRICS_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess folder: set by `compensator api` for several workers."""
CONFIG_PATH_ENV: Final = "COMPENSATOR_CONFIG"
"""The file to read when the command line names none (how uvicorn's worker processes find it)."""
LOCAL_ADDRESSES: Final = ("127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


class StoreConfig(_Section, frozen=True):
    """How clients reach one Raft set (a 'set' in CMQ's words)."""

    addresses: tuple[str, ...] = LOCAL_ADDRESSES
    """host:port the nodes serve clients on. Only these (and what nodes advertise for clients)
    are ever dialled: never the peer addresses the nodes talk to each other on."""
    set_id: int = 1
    """Part of every public request id, so a second set is a configuration change."""
    attempt_timeout_s: float = 1.0
    deadline_s: float = 5.0
    """How long one store call may retry (leader changes, redirects) before the API answers 503."""


class ApiConfig(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    """uvicorn worker processes. Each holds its own connections, token cache and quota buckets."""
    instances: int = 1
    """API deployments behind the load balancer (compose replicas): with `workers`, how many ways a
    producer's quota is split, since each process enforces its share."""
    public_url: str = ""
    """The URL people and tools use (printed by `make run`); default http://host:port."""
    body_bytes_max: int = 256 * 1024 + 16 * 1024
    """A single request: a payload of up to 256 KiB plus the envelope."""
    batch_bytes_max: int = 16 * 1024 * 1024
    batch_items_max: int = 1000
    ready_lag_entries_max: int = 1000
    """/readyz fails while the leader's applied index is this far behind its commit index."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class QuotaConfig(_Section, frozen=True):
    """Defaults for every producer; `compensator token quota` sets one producer's at runtime."""

    rate_per_s: int = 2000
    """Requests (batch items) per second per producer, across all API processes."""
    burst: int = 4000
    hold_max_ms: int = 500
    """Over the rate, a request waits up to this long for its turn before it is answered 429."""
    held_max: int = 4096
    """Requests waiting for their turn at once, per API process; beyond it, 429 at once."""


class AuthConfig(_Section, frozen=True):
    refresh_interval_s: float = 1.0
    """How often each API process asks the store whether tokens changed: the longest a revoked
    token keeps working."""


class TelemetryConfig(_Section, frozen=True):
    exporter: Literal["none", "otlp", "console"] = "none"
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "compensator"
    sample_ratio: float = 1.0
    """Of traces started here; a sampled parent's decision is always followed."""


class WorkerConfig(_Section, frozen=True):
    """`compensator worker`: how much it takes on, how it waits, how it stops."""

    lease_ms: int = 30_000
    batch_max: int = 100
    """Grants per Lease command at most."""
    concurrency_per_kind: int = 64
    """Attempts of one kind running at once in one worker."""
    concurrency_per_downstream: int = 64
    """Attempts calling one downstream at once in one worker, whatever their kind."""
    idle_poll_ms: int = 100
    """An idle worker asks the store (a read) whether work is due this often at most."""
    drain_grace_s: float = 10.0
    """On SIGTERM: how long running attempts may finish before they are cut off and handed back."""
    metrics_port: int = 0
    """Prometheus metrics on 127.0.0.1:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    maintenance: bool = True
    """Also run the queue's maintenance driver (it reads before it writes, so several are cheap)."""
    callback_secrets_file: str = ""
    """JSON {"target": "secret"} for callback signatures (else $COMPENSATOR_CALLBACK_SECRETS)."""
    breaker_window_s: float = 10.0
    breaker_attempts_min: int = 50
    """Enough that a burst of fast failures among slow successes (503s answer first) does not trip it."""
    breaker_failure_ratio: float = 0.5
    breaker_probe_every_s: float = 1.0
    ramp_start_per_s: float = 5.0
    ramp_double_s: float = 2.0
    ramp_until_per_s: float = 1000.0


class LocalConfig(_Section, frozen=True):
    """`make run` only: where the local set keeps its data, and what else it starts."""

    data_dir: str = "var/local"
    workers: int = 2
    standins: bool = True
    """Start the downstream stand-ins (payment system, red-packet service, callback receiver) on the
    ports of `handlers.payment.base_url`, `handlers.red_packet.base_url` and `callback_port`."""
    callback_port: int = 7203
    callback_target: str = "merchant-demo"
    """The callback target `make run` registers, signed with a secret kept in the data folder."""


class OutboxConfig(RelaySettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`compensator outbox-relay`: one producer's outbox and where its rows go (docs/outbox.md); the
    relay's limits (table, batch_max, concurrency, poll_interval_s, http_timeout_s, backoff_min_s,
    backoff_max_s, retry_after_max_s) are `outbox.RelaySettings`' fields.

    The token is never a setting here (a file could be shown, a repr printed): `token_file` names a
    file that holds it, else it is read from $COMPENSATOR_OUTBOX_TOKEN."""

    dsn: str = ""
    """The producer's PostgreSQL (asyncpg DSN). It may hold a password: give it in the file or as
    COMPENSATOR_OUTBOX__DSN, never on a command line."""
    api_url: str = ""
    """The compensation API's base URL (default: this configuration's API URL)."""
    token_file: str = ""
    metrics_port: int = 0
    """Prometheus metrics on metrics_host:port (0: off)."""
    metrics_host: str = "127.0.0.1"


class Config(_Section, frozen=True):
    store: StoreConfig = StoreConfig()
    api: ApiConfig = ApiConfig()
    quota: QuotaConfig = QuotaConfig()
    auth: AuthConfig = AuthConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    worker: WorkerConfig = WorkerConfig()
    handlers: HandlersSettings = HandlersSettings()
    """Where each downstream is (handlers/settings.py): base URLs, client timeouts and limits,
    callback targets by name."""
    local: LocalConfig = LocalConfig()
    outbox: OutboxConfig = OutboxConfig()

    @property
    def api_url(self) -> str:
        return self.api.public_url or f"http://{self.api.host}:{self.api.port}"


class ConfigError(ValueError):
    """The configuration is invalid; the message has one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises ValueError with a one-line message."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)


def _problems(config: Config) -> list[str]:
    problems: list[str] = []

    def check(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append(f"{field}: {message}")

    store, api, quota = config.store, config.api, config.quota
    check(bool(store.addresses), "store.addresses", "at least one node address is needed")
    for address in store.addresses:
        try:
            parse_address(address)
        except ValueError as error:
            problems.append(f"store.addresses: {error}")
    check(len(set(store.addresses)) == len(store.addresses), "store.addresses", "an address is listed twice")
    check(1 <= store.set_id <= 65535, "store.set_id", "must be in 1..65535")
    check(0 < store.attempt_timeout_s <= store.deadline_s, "store.attempt_timeout_s", "must be in (0, deadline_s]")
    check(store.deadline_s <= 60, "store.deadline_s", "must be at most 60 s (callers wait this long for a 503)")
    check(0 < api.port < 65536, "api.port", "must be in 1..65535")
    check(1 <= api.workers <= 64, "api.workers", "must be in 1..64")
    check(1 <= api.instances <= 1024, "api.instances", "must be in 1..1024")
    check(64 * 1024 <= api.body_bytes_max <= 1024 * 1024, "api.body_bytes_max", "must be in 64 KiB..1 MiB")
    check(api.body_bytes_max <= api.batch_bytes_max <= 64 * 1024 * 1024, "api.batch_bytes_max",
          "must be in body_bytes_max..64 MiB")  # fmt: skip
    check(1 <= api.batch_items_max <= 1000, "api.batch_items_max", "must be in 1..1000 (one store frame)")
    check(api.ready_lag_entries_max >= 1, "api.ready_lag_entries_max", "must be positive")
    check(
        not api.public_url or api.public_url.startswith(("http://", "https://")), "api.public_url",
        "must start with http:// or https://",
    )  # fmt: skip
    check(1 <= quota.rate_per_s <= 1_000_000, "quota.rate_per_s", "must be in 1..1000000")
    check(quota.burst >= 1, "quota.burst", "must be positive")
    check(0 <= quota.hold_max_ms <= 10_000, "quota.hold_max_ms", "must be in 0..10000")
    check(quota.held_max >= 0, "quota.held_max", "must not be negative")
    check(0.1 <= config.auth.refresh_interval_s <= 30, "auth.refresh_interval_s", "must be in 0.1..30 s")
    check(0.0 <= config.telemetry.sample_ratio <= 1.0, "telemetry.sample_ratio", "must be in 0..1")
    check(bool(config.local.data_dir), "local.data_dir", "must not be empty")
    check(0 <= config.local.workers <= 16, "local.workers", "must be in 0..16")
    check(0 < config.local.callback_port < 65536, "local.callback_port", "must be in 1..65535")
    worker = config.worker
    check(1_000 <= worker.lease_ms <= 3_600_000, "worker.lease_ms", "must be in 1000..3600000")
    check(1 <= worker.batch_max <= 1000, "worker.batch_max", "must be in 1..1000")
    check(1 <= worker.concurrency_per_kind <= 10_000, "worker.concurrency_per_kind", "must be in 1..10000")
    check(1 <= worker.concurrency_per_downstream <= 10_000, "worker.concurrency_per_downstream", "must be in 1..10000")
    check(10 <= worker.idle_poll_ms <= 10_000, "worker.idle_poll_ms", "must be in 10..10000")
    check(0 <= worker.drain_grace_s <= 600, "worker.drain_grace_s", "must be in 0..600")
    check(0 <= worker.metrics_port < 65536, "worker.metrics_port", "must be in 0..65535")
    try:
        worker_breaker(worker).validate()
    except ValueError as error:
        problems.append(f"worker: {error}")
    problems += [f"handlers.{problem}" for problem in config.handlers.problems()]
    try:
        config.outbox.validate()
    except ValueError as error:
        problems.append(f"outbox: {error}")
    check(
        not config.outbox.api_url or config.outbox.api_url.startswith(("http://", "https://")), "outbox.api_url",
        "must start with http:// or https://",
    )  # fmt: skip
    check(0 <= config.outbox.metrics_port < 65536, "outbox.metrics_port", "must be in 0..65535")
    return problems


def worker_breaker(worker: WorkerConfig) -> BreakerSettings:
    return BreakerSettings(
        window_s=worker.breaker_window_s, attempts_min=worker.breaker_attempts_min,
        failure_ratio=worker.breaker_failure_ratio, probe_every_s=worker.breaker_probe_every_s,
        ramp_start_per_s=worker.ramp_start_per_s, ramp_double_s=worker.ramp_double_s,
        ramp_until_per_s=worker.ramp_until_per_s,
    )  # fmt: skip


def _env_value(text: str, field_type: Any) -> Any:
    """An environment string as the field's type: JSON when it parses, else the string itself,
    and a comma-separated list for a tuple field."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if getattr(field_type, "__origin__", None) is tuple and isinstance(value, str):
        value = [item.strip() for item in value.split(",") if item.strip()]
    return value


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    sections = {field.name: field.type for field in msgspec.structs.fields(Config)}
    found: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        section_type = sections.get(section)
        fields = {} if section_type is None else {f.name: f.type for f in msgspec.structs.fields(section_type)}
        if field not in fields:
            problems.append(f"{name}: no such setting ({section}.{field})")
            continue
        found.setdefault(section, {})[field] = _env_value(environ[name], fields[field])
    return found, problems


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The file (if any) overlaid with the environment, validated as a whole."""
    environ = os.environ if environ is None else environ
    document: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text())
        except OSError as error:
            raise ConfigError([f"{path}: cannot read: {error.strerror or error}"]) from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError([f"{path}: not valid TOML: {error}"]) from None
    overrides, problems = _env_overrides(environ)
    for section, fields in overrides.items():
        target = document.setdefault(section, {})
        if isinstance(target, dict):
            target.update(fields)
    if problems:
        raise ConfigError(problems)
    try:
        config = msgspec.convert(document, Config, strict=False)
    except msgspec.ValidationError as error:
        origin = f"{path}" if path is not None else "environment"
        raise ConfigError([f"{origin}: {_readable(str(error))}"]) from None
    problems = _problems(config)
    if problems:
        raise ConfigError(problems)
    return config


def _readable(message: str) -> str:
    """msgspec says ``... - at `$.api.port` ``; people read ``api.port: ...``."""
    text, sep, where = message.rpartition(" - at `$.")
    if not sep:
        return message
    return f"{where.rstrip('`')}: {text}"


def load_from_environment(environ: Mapping[str, str] | None = None) -> Config:
    """`COMPENSATOR_CONFIG` names the file, if any (uvicorn's worker processes start this way)."""
    environ = os.environ if environ is None else environ
    path = environ.get(CONFIG_PATH_ENV, "").strip()
    return load(Path(path) if path else None, environ)
