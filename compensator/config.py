"""The service's configuration: one validated model, read from a TOML file and the environment.

    [store]
    addresses = ["10.0.1.1:7100", "10.0.1.2:7100", "10.0.1.3:7100"]
    [api]
    port = 8080
    workers = 2

Environment variables override the file, one field each: ``COMPENSATOR_API__PORT=8081``
(``COMPENSATOR_`` + section + ``__`` + field, upper case). A list is JSON or comma-separated.
A command's own flags override both (``compensator node --id 2``). Every field has a default that
works on one machine (`make run`), so an empty file, or none at all, is a valid configuration.
`load` validates the whole model and raises `ConfigError` with one line per problem, naming the
field and where its value came from.

Every process kind reads this one model, the store nodes too: the set is `[store] addresses`
(node N is the N-th), written once for the nodes and for every client. The sections of the
long-running processes besides the API are in compensator/config_processes.py.

Owns: the shape, the defaults, the checks between fields, and reading the file and environment.
Must never: be read anywhere but the composition root (compensator/wiring/ and the command
line); the packages it configures take typed values, never this module or os.environ.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from api.review_policy import DISCARD_REASON_CODES
from compensator import config_sources as sources
from compensator.config_processes import (
    KafkaConfig,
    OutboxConfig,
    ProjectorConfig,
    Section,
    StandinsConfig,
    StoreNodeConfig,
    WorkerConfig,
    kafka_problems,
    node_problems,
    parse_address,
    standins_problems,
    worker_breaker,
)
from handlers.settings import HandlersSettings
from queues.model import JOB_RATE_MAX

ENV_PREFIX: Final = "COMPENSATOR_"
METRICS_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess folder: set by `compensator api` for several workers."""
CONFIG_PATH_ENV: Final = "COMPENSATOR_CONFIG"
"""The file to read when the command line names none (how uvicorn's worker processes find it)."""
LOCAL_ADDRESSES: Final = ("127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")
LOCAL_SECRET_NAME: Final = "cluster.secret"
"""The cluster secret `make run` makes in `local.data_dir`, where clients look when `store.secret_file` is empty."""
OTHER_VARIABLES: Final = {
    CONFIG_PATH_ENV: "The TOML file to read when the command line names none.",
    "COMPENSATOR_PG_DSN": "The PostgreSQL of the compensation ledger (projector, reconciliation, stand-ins), as "
    "`postgresql://user@host:port/db`; unset, an embedded server is started in the command's data folder.",
    "PGPASSFILE": "libpq's password file, read by asyncpg and the JDBC driver when the DSN carries no password "
    "(the way to keep the password out of the environment).",
    "COMPENSATOR_CALLBACK_SECRETS": "`{\"target\": \"secret\"}` for callback signatures when "
    "`worker.callback_secrets_file` is not set (the file is the better place).",
    METRICS_DIR_ENV: "Set by `compensator api` itself for several workers; not to be set by hand.",
    "COMPENSATOR_API_URL": "`compensator reconcile --enqueue`: the API its fixes are sent to right away (else the relay sends them).",
    "COMPENSATOR_PG_DATA": "`compensator reconcile` and `seed-ledgers`: the embedded PostgreSQL's data folder when no DSN is set.",
    "COMPENSATOR_OUTBOX_TOKEN": "The outbox relay's API token, when `outbox.token_file` is not set.",
    "COMPENSATOR_API_TOKEN": "The API token of the operator commands (`compensator kind`, `breaker`, "
    "`classification`) and of `reconcile --enqueue`, when no token file is given.",
}
"""Variables read outside the model's sections (docs/configuration.md lists them)."""


class StoreConfig(Section, frozen=True):
    """How clients reach one Raft set (a 'set' in CMQ's words)."""

    addresses: tuple[str, ...] = LOCAL_ADDRESSES
    """host:port the nodes serve clients on. Only these (and what nodes advertise for clients)
    are ever dialled: never the peer addresses the nodes talk to each other on."""
    set_id: int = 1
    """Part of every public request id, so a second set is a configuration change."""
    attempt_timeout_s: float = 1.0
    """One try at one node; past it the client tries the next (the outcome of a write may then be unknown)."""
    deadline_s: float = 5.0
    """How long one store call may retry (leader changes, redirects) before the API answers 503."""
    peer_addresses: tuple[str, ...] = ()
    """host:port the nodes reach each other on, node N at the N-th, when that is not `addresses`
    (the nodes' own network); empty: `addresses`. Only `compensator node` reads it."""
    secret_file: str = ""
    """The cluster secret every node and every client of the store proves it holds (mode 0600; one
    secret per line, the first presented, all accepted: docs/security.md). Empty: `local.data_dir`/cluster.secret,
    which `make run` makes."""
    tls_ca: str = ""
    """A PEM CA that the nodes' and clients' certificates chain to: set it, `tls_cert` and `tls_key` for TLS to the store."""
    tls_cert: str = ""
    """This process's PEM certificate for TLS to the store (the nodes take theirs as `compensator node --tls-cert`)."""
    tls_key: str = ""
    """The PEM private key of `tls_cert` (mode 0600)."""
    control_addresses: tuple[str, ...] = ()
    """host:port of the control set's nodes, which hold the set table (docs/sets.md). Empty: one
    set, `set_id` at `addresses`, and nothing of sets is used. Set: the API routes intake by key
    over every set the table names, and `compensator sets` manages the table."""
    sets_refresh_s: float = 30.0
    """How often a process re-reads the set table from the control set (it also re-reads it when a
    set answers ROUTE_STALE or an id names a set it does not know); it keeps its cached table while
    the control set is unreachable."""


class ApiConfig(Section, frozen=True):
    host: str = "127.0.0.1"
    """The address the API listens on (0.0.0.0 behind a load balancer)."""
    port: int = 8080
    """The API's TCP port."""
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
    """A `POST /v1/requests:batch` body, in bytes."""
    batch_items_max: int = 1000
    """Items in one batch; all of them go to the store in one frame."""
    ready_lag_entries_max: int = 1000
    """/readyz fails while the leader's applied index is this far behind its commit index."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """uvicorn's and the API's log level (tokens and payloads are never logged at any level)."""


class QuotaConfig(Section, frozen=True):
    """Defaults for every producer; `compensator token quota` sets one producer's at runtime."""

    rate_per_s: int = 2000
    """Requests (batch items) per second per producer, across all API processes."""
    burst: int = 4000
    """Requests a producer may send at once above its rate, across all API processes."""
    hold_max_ms: int = 500
    """Over the rate, a request waits up to this long for its turn before it is answered 429."""
    held_max: int = 4096
    """Requests waiting for their turn at once, per API process; beyond it, 429 at once."""


class AuthConfig(Section, frozen=True):
    refresh_interval_s: float = 1.0
    """How often each API process asks the store whether tokens changed: the longest a revoked
    token keeps working."""


class TelemetryConfig(Section, frozen=True):
    exporter: Literal["none", "otlp", "console"] = "none"
    """Where spans go: an OpenTelemetry collector over OTLP/HTTP, standard output, or nowhere (the trace context still travels)."""
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """The collector's OTLP/HTTP traces URL."""
    service_name: str = "compensator"
    """`service.name` of every span; each process adds its role as `service.instance.role`."""
    sample_ratio: float = 1.0
    """Of traces started here; a sampled parent's decision is always followed."""


class ReviewConfig(Section, frozen=True):
    """Finance review's four eyes (docs/review.md): which actions are proposals until a second
    person with the approver role approves them."""

    money_moving_kinds: tuple[str, ...] = ("transfer",)
    """Kinds whose redrive, edit or discard moves money: these need a second person's approval."""
    amount_threshold_minor: int = 0
    """A redrive, edit or discard of a money-moving request of at least this amount needs approval
    (0: every amount)."""
    bulk_count_max: int = 10
    """Any action on more requests than this needs approval."""
    proposal_ttl_s: int = 24 * 3600
    """A proposal not approved within this long expires (the store refuses its approval)."""
    discard_reason_codes: tuple[str, ...] = DISCARD_REASON_CODES
    """The reason codes a discard must give one of (with a comment)."""
    job_rate_per_s: int = 20
    """Dead letters a redrive job redrives per second unless its starter sets another rate: slow
    enough that a bulk redrive does not hit a downstream that just recovered with everything at once."""


class WebConfig(Section, frozen=True):
    """The finance review pages' logins and sessions (docs/review.md, "Users, sessions and rights")."""

    idle_timeout_s: int = 15 * 60
    """A session ends after this long without a request (give or take the minute its last-seen
    time may wait to be written back)."""
    lifetime_s: int = 12 * 3600
    """A session ends this long after its login, however busy: then the person logs in again."""
    cookie_secure: bool = False
    """Send the session cookie with `Secure` (HTTPS only). Off for `make run` on loopback's plain
    HTTP; every deployment behind TLS turns it on (a browser sends a Secure cookie over HTTPS only,
    so it cannot leak over plain HTTP)."""
    lockout_failures: int = 5
    """Failed logins in a row (each within lockout_s of the one before) that lock an account..."""
    lockout_s: int = 15 * 60
    """...for this long (a successful login before then resets the count; `compensator user unlock` lifts a
    lock). One client address may fail an account only lockout_failures - 1 times per lockout_s: alone, it can
    slow a guess but never lock the account."""
    client_failures_max: int = 20
    """Failed logins one client address may make across all accounts per lockout_s, per API process; then
    its logins are refused (429) until lockout_s after its last failure."""


class RuntimeConfig(Section, frozen=True):
    """How every long-running process (the API, workers, nodes, projector, bridges) runs Python's
    garbage collector once started (compensator/gc_policy.py says why; docs/benchmarks.md, i23g)."""

    gc_freeze: bool = True
    """Freeze the objects alive after start-up (`gc.freeze()`), so no collection walks them again: the API's full collections took 50-80 ms without it."""
    gc_gen0_threshold: int = 50_000
    """Net allocations of tracked objects between young collections (CPython's own is 700); 0 keeps CPython's. Cycles are still collected."""


class LocalConfig(Section, frozen=True):
    """`make run` only: where the local set keeps its data, and what else it starts."""

    data_dir: str = "var/local"
    """The store nodes' data, logs and the stand-ins' database, kept between runs."""
    workers: int = 2
    """Compensation workers `make run` starts."""
    standins: bool = True
    """Start the downstream stand-ins (payment system, red-packet service, callback receiver) on the
    ports of `handlers.payment.base_url`, `handlers.red_packet.base_url` and `callback_port`."""
    projector: bool = True
    """Start the ledger projector (`compensator project`), writing the compensation ledger to an
    embedded PostgreSQL in `data_dir`/pg (beside the stand-ins' ledgers), or to $COMPENSATOR_PG_DSN."""
    callback_port: int = 7203
    """The callback receiver stand-in's port."""
    callback_target: str = "merchant-demo"
    """The callback target `make run` registers, signed with a secret kept in the data folder."""
    control_tick_ms: int = 100
    """`compensator run --sets N`: the control set's nodes' `node.tick_ms` (the data sets' stay at
    `node.tick_ms`). The control set is idle under load; a slower clock cuts its heartbeats to a
    third and makes its failover 1-2 s instead of 0.3-0.6 s, which neither intake nor leasing waits on
    (docs/sets.md, "The control set's clock")."""
    breaker_attempts_min: int = 5
    """`worker.breaker_attempts_min` for the workers `make run` starts: its traffic is a person's
    handful of requests, never the 50 in 10 s a production breaker waits for, so an outage of the
    payment stand-in with ten transfers sent opens the breaker (at least one of the two workers makes
    five of their first attempts)."""


class Config(Section, frozen=True):
    store: StoreConfig = StoreConfig()
    api: ApiConfig = ApiConfig()
    quota: QuotaConfig = QuotaConfig()
    auth: AuthConfig = AuthConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    worker: WorkerConfig = WorkerConfig()
    handlers: HandlersSettings = HandlersSettings()
    """Where each downstream is (handlers/settings.py): base URLs, client timeouts and limits,
    callback targets by name."""
    kafka: KafkaConfig = KafkaConfig()
    projector: ProjectorConfig = ProjectorConfig()
    local: LocalConfig = LocalConfig()
    review: ReviewConfig = ReviewConfig()
    web: WebConfig = WebConfig()
    outbox: OutboxConfig = OutboxConfig()
    node: StoreNodeConfig = StoreNodeConfig()
    standins: StandinsConfig = StandinsConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    @property
    def api_url(self) -> str:
        return self.api.public_url or f"http://{self.api.host}:{self.api.port}"

    @property
    def secret_path(self) -> Path:
        """The cluster secret's file: `store.secret_file`, else the local run's."""
        return Path(self.store.secret_file or Path(self.local.data_dir) / LOCAL_SECRET_NAME)


class ConfigError(ValueError):
    """The configuration is invalid; the message has one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


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
    check(config.runtime.gc_gen0_threshold >= 0, "runtime.gc_gen0_threshold", "must be 0 (CPython's own) or more")
    for address in store.control_addresses:
        try:
            parse_address(address)
        except ValueError as error:
            problems.append(f"store.control_addresses: {error}")
    check(not set(store.control_addresses) & set(store.addresses), "store.control_addresses",
          "the control set's nodes are not a set's nodes: give them their own addresses")  # fmt: skip
    check(1 <= store.sets_refresh_s <= 3600, "store.sets_refresh_s", "must be in 1..3600")
    check(0 < store.attempt_timeout_s <= store.deadline_s, "store.attempt_timeout_s", "must be in (0, deadline_s]")
    check(store.deadline_s <= 60, "store.deadline_s", "must be at most 60 s (callers wait this long for a 503)")
    tls = [store.tls_ca, store.tls_cert, store.tls_key]
    check(all(tls) or not any(tls), "store.tls_ca", "TLS needs all three of tls_ca, tls_cert and tls_key")
    review = config.review
    check(review.amount_threshold_minor >= 0, "review.amount_threshold_minor", "must be at least 0")
    check(1 <= review.bulk_count_max <= 1000, "review.bulk_count_max", "must be in 1..1000")
    check(1 <= review.job_rate_per_s <= JOB_RATE_MAX, "review.job_rate_per_s", f"must be in 1..{JOB_RATE_MAX}")
    check(60 <= review.proposal_ttl_s <= 30 * 86400, "review.proposal_ttl_s", "must be in 60..2592000 (30 days)")
    check(bool(review.discard_reason_codes), "review.discard_reason_codes", "at least one code is needed")
    web = config.web
    check(60 <= web.idle_timeout_s <= 24 * 3600, "web.idle_timeout_s", "must be in 60..86400")
    check(web.idle_timeout_s <= web.lifetime_s <= 30 * 86400, "web.lifetime_s", "must be in idle_timeout_s..2592000 (30 days)")
    check(1 <= web.lockout_failures <= 100, "web.lockout_failures", "must be in 1..100")
    check(1 <= web.lockout_s <= 86400, "web.lockout_s", "must be in 1..86400")
    check(1 <= web.client_failures_max <= 10_000, "web.client_failures_max", "must be in 1..10000")
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
    check(config.local.breaker_attempts_min >= 1, "local.breaker_attempts_min", "must be positive")
    check(1 <= config.local.control_tick_ms <= 10_000, "local.control_tick_ms", "must be in 1..10000")
    worker = config.worker
    check(1_000 <= worker.lease_ms <= 3_600_000, "worker.lease_ms", "must be in 1000..3600000")
    check(1 <= worker.batch_max <= 1000, "worker.batch_max", "must be in 1..1000")
    check(1 <= worker.concurrency_per_kind <= 10_000, "worker.concurrency_per_kind", "must be in 1..10000")
    check(1 <= worker.concurrency_per_downstream <= 10_000, "worker.concurrency_per_downstream", "must be in 1..10000")
    check(10 <= worker.idle_poll_ms <= 10_000, "worker.idle_poll_ms", "must be in 10..10000")
    check(10 <= worker.idle_wait_ms <= 60_000, "worker.idle_wait_ms", "must be in 10..60000")
    check(0 <= worker.drain_grace_s <= 600, "worker.drain_grace_s", "must be in 0..600")
    check(0 <= worker.metrics_port < 65536, "worker.metrics_port", "must be in 0..65535")
    projector = config.projector
    check(1 <= projector.batch_max <= 1000, "projector.batch_max", "must be in 1..1000")
    check(10 <= projector.idle_poll_ms <= 60_000, "projector.idle_poll_ms", "must be in 10..60000")
    check(10 <= projector.standby_poll_ms <= 60_000, "projector.standby_poll_ms", "must be in 10..60000")
    check(0 <= projector.round_gather_ms <= 1000, "projector.round_gather_ms", "must be in 0..1000")
    check(bool(projector.pg_data), "projector.pg_data", "must not be empty")
    check(0 <= projector.metrics_port < 65536, "projector.metrics_port", "must be in 0..65535")
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
    problems += kafka_problems(config.kafka)
    problems += node_problems(config.node, store.addresses, store.peer_addresses)
    problems += standins_problems(config.standins)
    return problems


Flags = Mapping[tuple[str, str], tuple[Any, str]]
"""(section, field) -> (value, the flag it was given as): a command line's overrides."""


def load(path: Path | None = None, environ: Mapping[str, str] | None = None, flags: Flags | None = None) -> Config:
    """The file (if any) overlaid with the environment, then with the command line's `flags`,
    validated as a whole: every problem is found, each one line that starts with where the value
    came from (the file, the variable or the flag) and names the field."""
    environ = os.environ if environ is None else environ
    where = str(path) if path is not None else "defaults"
    document: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text())
        except OSError as error:
            raise ConfigError([f"{path}: cannot read: {error.strerror or error}"]) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError([f"{path}: not valid TOML: {error}"]) from None
    origins = {(section, name): where for section, fields in document.items() if isinstance(fields, dict)
               for name in fields}  # fmt: skip
    overrides, problems = sources.env_overrides(environ, Config, ENV_PREFIX)
    for section, fields in overrides.items():
        target = document.setdefault(section, {})
        if isinstance(target, dict):
            target.update(fields)
            origins.update({(section, name): f"{ENV_PREFIX}{section.upper()}__{name.upper()}" for name in fields})
    for (section, name), (value, flag) in (flags or {}).items():
        target = document.setdefault(section, {})
        if isinstance(target, dict):
            target[name] = value
            origins[(section, name)] = flag
    checked, found = sources.typed(document, origins, where, Config)
    problems += found
    config = msgspec.convert(checked, Config, strict=False)  # each field was converted on its own above
    problems += [sources.located(problem, origins, where) for problem in _problems(config)]
    if problems:
        raise ConfigError(problems)
    return config


def load_from_environment(environ: Mapping[str, str] | None = None) -> Config:
    """`COMPENSATOR_CONFIG` names the file, if any (uvicorn's worker processes start this way)."""
    environ = os.environ if environ is None else environ
    path = environ.get(CONFIG_PATH_ENV, "").strip()
    return load(Path(path) if path else None, environ)
