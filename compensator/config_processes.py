"""The configuration's sections of the long-running processes besides the API: the worker, the
Kafka bridges, the projector, the outbox relay, a store node and the stand-ins; each read by its
process kind in the composition root (compensator/wiring/), and their checks.

Kept apart from compensator/config.py (the model, the shared sections, reading and validating) so
that each stays a size a person reads at once; `Config` holds these as it holds the others.

Must never: be read anywhere but the composition root and the command line.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from outbox import RelaySettings
from services.worker.breaker import BreakerSettings


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises ValueError with a one-line message."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)




class WorkerConfig(Section, frozen=True):
    """`compensator worker`: how much it takes on, how it waits, how it stops."""

    lease_ms: int = 30_000
    """How long a leased request stays this worker's; the worker extends it while the handler runs, and another worker retries it once it expires."""
    batch_max: int = 100
    """Grants per Lease command at most."""
    concurrency_per_kind: int = 64
    """Attempts of one kind running at once in one worker."""
    concurrency_per_downstream: int = 64
    """Attempts calling one downstream at once in one worker, whatever their kind."""
    idle_poll_ms: int = 100
    """Under load, how old a read of what is due may be before the worker reads again; with an open breaker, how often an idle worker asks (its probes are timed by it)."""
    idle_wait_ms: int = 1000
    """An idle worker's long poll is held at most this long: the store answers it at once when work arrives, and the worker asks again by the next due time, so a longer wait costs no latency, only fewer reads of every set."""
    drain_grace_s: float = 10.0
    """On SIGTERM: how long running attempts may finish before they are cut off and handed back."""
    metrics_port: int = 0
    """Prometheus metrics on 127.0.0.1:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """The address of the worker's metrics endpoint."""
    maintenance: bool = True
    """Also run the queue's maintenance driver (it reads before it writes, so several are cheap)."""
    callback_secrets_file: str = ""
    """JSON {"target": "secret"} for callback signatures (else $COMPENSATOR_CALLBACK_SECRETS)."""
    breaker_window_s: float = 10.0
    """The circuit breaker judges a downstream on the attempts of this many recent seconds."""
    breaker_attempts_min: int = 50
    """Enough that a burst of fast failures among slow successes (503s answer first) does not trip it."""
    breaker_failure_ratio: float = 0.5
    """The share of the downstream's own failures (timeouts, lost connections, 5xx, 429) in the window that opens the breaker."""
    breaker_probe_every_s: float = 1.0
    """While open: one probe request this often; an answered probe closes the breaker."""
    ramp_start_per_s: float = 5.0
    """After the breaker closes, leases of the downstream's kinds start at this rate per worker..."""
    ramp_double_s: float = 2.0
    """...which doubles this often (with jitter)..."""
    ramp_until_per_s: float = 1000.0
    """...until it reaches this rate, where the ramp ends."""


class KafkaConfig(Section, frozen=True):
    """`compensator events-publish` and `compensator kafka-ingest` (docs/kafka.md)."""

    bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    """host:port of Kafka brokers to start from."""
    client_id: str = "compensator"
    """The Kafka client id (broker logs and quotas)."""
    request_timeout_ms: int = 30_000
    """How long a produce or metadata request may take before it fails (and is retried)."""
    create_topics: bool = True
    """Create missing topics at start (with `partitions`); off where topics are provisioned."""
    partitions: int = 6
    """Partitions of each topic created at start; events are keyed by ref key, so one business id stays in one partition."""
    replication_factor: int = 1
    """For the topics created at start: one replica is all a one-broker machine has; a cluster
    wants 3 (with the broker's min.insync.replicas 2, so acks=all means a majority)."""
    events_topic: str = "compensator.events"
    """Every lifecycle event of the store, keyed by ref key (docs/kafka.md has the schema)."""
    publisher_batch_max: int = 500
    """Events per store read and per Kafka round (sent, then all acknowledged, then the cursor moves)."""
    publisher_poll_ms: int = 200
    """A caught-up publisher asks the store for new events this often."""
    publisher_lease_ms: int = 15_000
    """How long an active publisher's lease lasts without renewal (renewed every third of it):
    a standby takes over at most this long after the active one died."""
    ingest_topic: str = "compensator.requests"
    """Failed requests from producers that prefer Kafka to HTTP."""
    rejects_topic: str = "compensator.requests.rejects"
    """Ingested records that failed validation, with the reason and their original topic, partition and offset."""
    group_id: str = "compensator-ingest"
    """The ingest's consumer group: run several ingest processes to share the partitions."""
    ingest_producer: str = "kafka"
    """The producer name ingested requests are stored under: keys are `{producer}:{key}`, as an
    API token's name makes them for HTTP submissions."""
    ingest_batch_max: int = 500
    """Records per consumer poll: submitted to the store in one frame, then committed."""
    body_bytes_max: int = 256 * 1024 + 16 * 1024
    """An ingested record's value, as the API's `api.body_bytes_max`; larger ones are rejected."""
    session_timeout_ms: int = 30_000
    """The consumer group's session: a dead ingest's partitions move after this long."""
    heartbeat_interval_ms: int = 3_000
    """The consumer's heartbeats to the group coordinator."""
    metrics_port: int = 0
    """Prometheus metrics on metrics_host:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """The address of the metrics endpoint."""


class ProjectorConfig(Section, frozen=True):
    """`compensator project`: the compensation ledger's projector of every set, one active per set."""

    batch_max: int = 1000
    """Events of one set per ledger transaction at most."""
    idle_poll_ms: int = 1000
    """A caught-up projector's wait for new events is held this long at most: a long poll the store answers at its next apply, so a longer wait costs no lag, only fewer reads."""
    standby_poll_ms: int = 1000
    """A standby tries to take over the set's projector lock this often."""
    round_gather_ms: int = 20
    """With several sets: once one set's batch is ready, the others' are waited for this long at most, so that one transaction carries every busy set's batch (docs/ledger.md, "Several sets"); 0 writes each as it comes."""
    pg_data: str = "var/pg/data"
    """The embedded PostgreSQL's data folder, used when $COMPENSATOR_PG_DSN names no server (the
    one `compensator reconcile` reads by default, so the nightly job finds this ledger)."""
    metrics_port: int = 0
    """Prometheus metrics on metrics_host:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """The address of the metrics endpoint."""


class HostedReplica(Section, frozen=True):
    """One more replica a `compensator node` process hosts beside its own (docs/sets.md, "Hosting
    several replicas in one process"): node `id` of the set whose nodes are `addresses`, with its own
    listener and data directory; the timing settings of `[node]` are every hosted replica's."""

    set_id: int = -1
    """The set it belongs to (0: the control set): the name its metrics and its stop line carry."""
    id: int = 0
    """Its place in `addresses`, from 1."""
    addresses: tuple[str, ...] = ()
    """host:port its set's nodes serve clients on, node N the N-th (that set's `store.addresses`)."""
    peer_addresses: tuple[str, ...] = ()
    """Where its set's nodes reach each other, when not `addresses` (that set's `store.peer_addresses`)."""
    data_dir: str = ""
    """Its own log, snapshots and queue database: required (the same folder it has when it runs alone)."""
    listen: str = ""
    """host:port it listens on; default its own address in `peer_addresses` (else `addresses`)."""
    tick_ms: int = 0
    """Its Raft tick, when not `node.tick_ms` (0): a set of its own pace, such as the control set's."""
    join: bool = False
    """Start empty and wait to be added to its set (`raft-store add-learner`, then `add-voter`),
    as `node.join` for the process's own: a replacement machine's replicas (docs/runbook.md)."""
    voters: tuple[int, ...] = ()
    """Its set's first voters, when it forms the set (default: every node of `addresses`)."""

    @property
    def group(self) -> str:
        return "the control set" if self.set_id == 0 else f"set {self.set_id}"


class StoreNodeConfig(Section, frozen=True):
    """`compensator node`: one node of the set `store.addresses` lists (node N is the N-th address),
    so a deployment writes the set's addresses once, for its nodes and its clients alike."""

    id: int = 0
    """This node's id: its place in `store.addresses`, from 1 (`--id` or COMPENSATOR_NODE__ID; required by `compensator node`)."""
    listen: str = ""
    """host:port the node listens on, for its peers and its clients; default its own address in
    `store.peer_addresses` (else `store.addresses`). In a container: 0.0.0.0 and that port."""
    data_dir: str = ""
    """Its log, snapshots and queue database (0700); default var/node<id>."""
    join: bool = False
    """Start empty and wait to be added to a running set (`raft-store add-voter`), instead of forming it."""
    voters: tuple[int, ...] = ()
    """A new set's first voters (default: every node of `store.addresses`)."""
    tick_ms: int = 30
    """The Raft clock's tick: a leader's heartbeat every 2 ticks, an election after `election_ticks` (randomised up to twice that) without one. An idle node wakes for these deadlines only, not every tick (docs/raft.md)."""
    election_ticks: int = 10
    """Ticks without a leader's heartbeat before a follower stands for election."""
    group_commit_entries: int = 8192
    """Log entries one fsync may cover at most."""
    group_commit_delay_ms: float = 0.0
    """How long a write may wait for others to share its fsync (0: never waits; batches form under load)."""
    snapshot_every_entries: int = 20_000
    """Log entries between snapshots."""
    snapshot_every_mib: int = 64
    """MiB of log between snapshots."""
    wal_preallocate: bool = True
    """Zero-fill the log's next segment on a thread ahead of need, so each fsync flushes data, not the file system's journal (docs/storage.md); false on copy-on-write file systems (btrfs, ZFS), where it buys nothing."""
    metrics_port: int = 0
    """Prometheus metrics (the node's Raft state and its replica's queue depth) on metrics_host:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """The address of the metrics endpoint."""
    replicas: tuple[HostedReplica, ...] = ()
    """More replicas, of other sets, this process runs beside its own on one event loop: one process
    per machine instead of one per replica (docs/sets.md). Each a `[[node.replicas]]` table (or an
    object of COMPENSATOR_NODE__REPLICAS' JSON list, or of `--replica JSON`) of `set_id` (0: the
    control set), `id` (its place in `addresses`), `addresses` (its set's `store.addresses`),
    `data_dir` (required), and optionally `peer_addresses`, `listen`, `tick_ms`, `join` and `voters`; the other timing
    settings above are every replica's. A storage failure of any stops them all (exit 1)."""


class StandinsConfig(Section, frozen=True):
    """`compensator standins`: stand-ins of the payment system, the red-packet service and a callback
    receiver in one process, for local runs, demos and manual tests (handlers/standins/)."""

    host: str = "127.0.0.1"
    """A loopback address, unless `exposed`."""
    exposed: bool = False
    """Allow a non-loopback `host` (a demo network of its own: anyone there can flip faults)."""
    payment_port: int = 7201
    """The payment system's stand-in."""
    red_packet_port: int = 7202
    """The red-packet service's stand-in."""
    callback_port: int = 7203
    """The callback receiver's stand-in."""
    seed: int = -1
    """The fault generators' seed (-1: a new one at each start)."""
    payment_dedup: bool = True
    """One payment per transfer id; off: every accepted POST is a new payment (a system that does not deduplicate)."""
    payment_expiry: Literal["enforce", "ignore"] = "ignore"
    """enforce: refuse a POST whose expires_at has passed (it writes nothing)."""
    callback_dedup: bool = True
    """A repeated Idempotency-Key is answered as a repeat; off: a merchant that handles every delivery as new."""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    """The stand-ins' log level."""
    pg_data: str = "var/standins/pg"
    """The embedded PostgreSQL's data folder of their ledgers, when $COMPENSATOR_PG_DSN names no server."""
    secrets_file: str = ""
    """JSON {"target": "secret"} for the callback receiver (else $COMPENSATOR_CALLBACK_SECRETS; none: every callback is 404)."""


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
    """A file holding the relay's API token (a producer token); else $COMPENSATOR_OUTBOX_TOKEN."""
    metrics_port: int = 0
    """Prometheus metrics on metrics_host:port (0: off)."""
    metrics_host: str = "127.0.0.1"
    """The address of the metrics endpoint."""


_TOPIC: Final = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_PRODUCER: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")


def kafka_problems(kafka: KafkaConfig) -> list[str]:
    problems: list[str] = []

    def check(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append(f"kafka.{field}: {message}")

    check(bool(kafka.bootstrap_servers), "bootstrap_servers", "at least one broker address is needed")
    for address in kafka.bootstrap_servers:
        try:
            parse_address(address)
        except ValueError as error:
            problems.append(f"kafka.bootstrap_servers: {error}")
    for field in ("events_topic", "ingest_topic", "rejects_topic"):
        check(_TOPIC.match(getattr(kafka, field)) is not None, field, "must be 1-128 of A-Z a-z 0-9 . _ -")
    check(kafka.ingest_topic != kafka.rejects_topic, "rejects_topic", "must differ from ingest_topic")
    check(_PRODUCER.match(kafka.ingest_producer) is not None, "ingest_producer",
          "must be a principal name: 1-32 of a-z 0-9 _ . - starting with a letter or digit")  # fmt: skip
    check(bool(kafka.group_id), "group_id", "must not be empty")
    check(1 <= kafka.partitions <= 1000, "partitions", "must be in 1..1000")
    check(1 <= kafka.replication_factor <= 16, "replication_factor", "must be in 1..16")
    check(1 <= kafka.publisher_batch_max <= 1000, "publisher_batch_max", "must be in 1..1000")
    check(10 <= kafka.publisher_poll_ms <= 60_000, "publisher_poll_ms", "must be in 10..60000")
    check(1_000 <= kafka.publisher_lease_ms <= 600_000, "publisher_lease_ms", "must be in 1000..600000")
    check(1 <= kafka.ingest_batch_max <= 1000, "ingest_batch_max", "must be in 1..1000 (one store frame)")
    check(1024 <= kafka.body_bytes_max <= 1024 * 1024, "body_bytes_max", "must be in 1 KiB..1 MiB")
    check(1_000 <= kafka.request_timeout_ms <= 300_000, "request_timeout_ms", "must be in 1000..300000")
    check(1_000 <= kafka.session_timeout_ms <= 300_000, "session_timeout_ms", "must be in 1000..300000")
    check(0 < kafka.heartbeat_interval_ms < kafka.session_timeout_ms, "heartbeat_interval_ms",
          "must be positive and under session_timeout_ms")  # fmt: skip
    check(0 <= kafka.metrics_port < 65536, "metrics_port", "must be in 0..65535")
    return problems


def worker_breaker(worker: WorkerConfig) -> BreakerSettings:
    return BreakerSettings(
        window_s=worker.breaker_window_s, attempts_min=worker.breaker_attempts_min,
        failure_ratio=worker.breaker_failure_ratio, probe_every_s=worker.breaker_probe_every_s,
        ramp_start_per_s=worker.ramp_start_per_s, ramp_double_s=worker.ramp_double_s,
        ramp_until_per_s=worker.ramp_until_per_s,
    )  # fmt: skip


def node_problems(node: StoreNodeConfig, addresses: tuple[str, ...], peer_addresses: tuple[str, ...]) -> list[str]:
    problems: list[str] = []

    def check(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append(f"{field}: {message}")

    check(not peer_addresses or len(peer_addresses) == len(addresses), "store.peer_addresses",
          f"one per node of store.addresses ({len(addresses)}), or none")  # fmt: skip
    for address in peer_addresses:
        try:
            parse_address(address)
        except ValueError as error:
            problems.append(f"store.peer_addresses: {error}")
    check(node.id >= 0, "node.id", "must be a node's place in store.addresses, from 1")
    if node.listen:
        try:
            parse_address(node.listen)
        except ValueError as error:
            problems.append(f"node.listen: {error}")
    check(all(voter >= 1 for voter in node.voters), "node.voters", "must be node ids, from 1")
    check(1 <= node.tick_ms <= 10_000, "node.tick_ms", "must be in 1..10000")
    check(2 <= node.election_ticks <= 1000, "node.election_ticks", "must be in 2..1000")
    check(1 <= node.group_commit_entries <= 1_000_000, "node.group_commit_entries", "must be in 1..1000000")
    check(0 <= node.group_commit_delay_ms <= 1000, "node.group_commit_delay_ms", "must be in 0..1000")
    check(node.snapshot_every_entries >= 1, "node.snapshot_every_entries", "must be positive")
    check(node.snapshot_every_mib >= 1, "node.snapshot_every_mib", "must be positive")
    check(0 <= node.metrics_port < 65536, "node.metrics_port", "must be in 0..65535")
    problems += replica_problems(node.replicas, addresses)
    return problems


def replica_problems(replicas: tuple[HostedReplica, ...], addresses: tuple[str, ...]) -> list[str]:
    """Each hosted replica's own checks, and theirs together: one set once per process (two
    replicas of one set on one machine would lose its majority with the machine)."""
    problems: list[str] = []
    seen: set[int] = set()
    taken = set(addresses)
    for index, replica in enumerate(replicas, 1):
        found: list[str] = []
        if not 0 <= replica.set_id <= 65535:
            found.append("set_id must be given, in 0..65535 (0: the control set)")
        elif replica.set_id in seen:
            found.append(f"{replica.group} is hosted twice")
        seen.add(replica.set_id)
        if not replica.addresses:
            found.append("addresses must list its set's nodes")
        if not 1 <= replica.id <= len(replica.addresses or (1,)):
            found.append(f"id must be its place in addresses, 1..{len(replica.addresses)}")
        if replica.peer_addresses and len(replica.peer_addresses) != len(replica.addresses):
            found.append(f"peer_addresses: one per node of addresses ({len(replica.addresses)}), or none")
        if set(replica.addresses) & set(addresses):
            found.append("addresses are store.addresses': a replica hosts another set than the process's own")
        elif set(replica.addresses) & taken:
            found.append("addresses are another replica's: each set is hosted once")
        taken |= set(replica.addresses)
        if not replica.data_dir:
            found.append("data_dir must be given (the folder the replica keeps wherever it runs)")
        if not 0 <= replica.tick_ms <= 10_000:
            found.append("tick_ms must be in 0..10000 (0: node.tick_ms)")
        if replica.join and replica.voters:
            found.append("join and voters exclude each other: a joining replica forms nothing")
        elif not set(replica.voters) <= set(range(1, len(replica.addresses) + 1)):
            found.append(f"voters must be places in addresses, 1..{len(replica.addresses)}")
        for address in (*replica.addresses, *replica.peer_addresses, *([replica.listen] if replica.listen else [])):
            try:
                parse_address(address)
            except ValueError as error:
                found.append(str(error))
        problems += [f"node.replicas: replica {index} ({replica.group}): {problem}" for problem in found]
    return problems


def standins_problems(standins: StandinsConfig) -> list[str]:
    problems: list[str] = []
    for name in ("payment_port", "red_packet_port", "callback_port"):
        if not 0 < getattr(standins, name) < 65536:
            problems.append(f"standins.{name}: must be in 1..65535")
    ports = [standins.payment_port, standins.red_packet_port, standins.callback_port]
    if len(set(ports)) != len(ports):
        problems.append("standins.callback_port: the three stand-ins need three ports")
    if standins.seed < -1:
        problems.append("standins.seed: -1 (a new one at each start) or a seed")
    if not standins.pg_data:
        problems.append("standins.pg_data: must not be empty")
    return problems
