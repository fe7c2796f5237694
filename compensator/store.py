"""The store's clients, as every process builds them from the configuration.

Kept apart from wiring/api.py so that the command line's store commands (tokens, the local launcher)
do not import the web stack. Every client presents the cluster secret (`store.secret_file`): a
process without it cannot reach the store at all, which is what keeps `compensator token create`
and `compensator user add` to the store's administrators (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compensator.config import Config
from compensator.config_processes import parse_address
from queues import ControlSet, QueueClient, RaftClient, SetsClient, StoreAuth
from raft_store.auth import AuthConfigError


class StoreSecretError(ValueError):
    """The cluster secret (or a TLS file) cannot be used: one line, exit 1."""


def store_auth(config: Config) -> StoreAuth:
    """The cluster secret and TLS files of the configuration, read now (a bad file fails here)."""
    store = config.store
    try:
        return StoreAuth.from_files(
            config.secret_path, tls_ca=Path(store.tls_ca) if store.tls_ca else None,
            tls_cert=Path(store.tls_cert) if store.tls_cert else None,
            tls_key=Path(store.tls_key) if store.tls_key else None,
        )  # fmt: skip
    except AuthConfigError as error:
        hint = "" if store.secret_file else " (`make run` makes it; elsewhere set store.secret_file)"
        raise StoreSecretError(f"{error}{hint}; the store admits only holders of its cluster secret") from None


def raft_client(config: Config, auth: StoreAuth | None = None, addresses: Sequence[str] | None = None) -> RaftClient:
    """A client of the set at `addresses` (default `store.addresses`), with the store's deadlines."""
    store = config.store
    return RaftClient(
        [parse_address(address) for address in (store.addresses if addresses is None else addresses)],
        auth=auth or store_auth(config), attempt_timeout_s=store.attempt_timeout_s, deadline_s=store.deadline_s,
    )  # fmt: skip


def queue_client(config: Config, auth: StoreAuth | None = None) -> QueueClient:
    return QueueClient(raft_client(config, auth))


def access_client(config: Config, auth: StoreAuth | None = None) -> QueueClient:
    """Where API tokens, review-page users and their sessions live: the control set with several
    sets (one copy, in the failure domain that routes every request anyway; a set that loses its
    majority must stop only its own share, docs/sets.md), else the one store."""
    if config.store.control_addresses:
        return control_set(config, auth).queue
    return queue_client(config, auth)


def access_addresses(config: Config) -> Sequence[str]:
    """The addresses `access_client` reaches (for messages that name them)."""
    return config.store.control_addresses or config.store.addresses


def control_set(config: Config, auth: StoreAuth | None = None) -> ControlSet:
    """The control set's client (store.control_addresses; ValueError when there is none)."""
    if not config.store.control_addresses:
        raise ValueError("store.control_addresses is empty: this deployment is one set and has no control set")
    return ControlSet(QueueClient(raft_client(config, auth, config.store.control_addresses)))


def sets_client(config: Config, auth: StoreAuth | None = None) -> SetsClient | None:
    """The facade over every set of the table (read at its first refresh), or None in one-set mode."""
    if not config.store.control_addresses:
        return None
    auth = auth or store_auth(config)
    return SetsClient.lazy(
        control_set(config, auth), refresh_s=config.store.sets_refresh_s,
        connect=lambda _set_id, addresses: QueueClient(raft_client(config, auth, addresses)),
    )  # fmt: skip


async def open_sets(config: Config, auth: StoreAuth | None = None) -> SetsClient:
    """The facade over the sets of the table the control set holds now, its control set's client
    kept open so that `refresh` re-reads the table (what a worker leases from, and how it finds a
    set added later). Raises TableError while the control set holds no table, ClientError when it
    cannot be read; the caller closes it."""
    auth = auth or store_auth(config)
    control = control_set(config, auth)
    try:
        return await SetsClient.from_control(
            control, refresh_s=config.store.sets_refresh_s,
            connect=lambda _set_id, addresses: QueueClient(raft_client(config, auth, addresses)),
        )  # fmt: skip
    except BaseException:
        await control.queue.raft.close()
        raise
