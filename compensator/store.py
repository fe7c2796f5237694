"""The store's clients, as every process builds them from the configuration.

Kept apart from wiring/api.py so that the command line's store commands (tokens, the local launcher)
do not import the web stack. Every client presents the cluster secret (`store.secret_file`): a
process without it cannot reach the store at all, which is what keeps `compensator token create`
and `compensator user add` to the store's administrators (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

from compensator.config import Config
from compensator.config_processes import parse_address
from queues import QueueClient, RaftClient, StoreAuth
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


def raft_client(config: Config, auth: StoreAuth | None = None) -> RaftClient:
    store = config.store
    return RaftClient(
        [parse_address(address) for address in store.addresses], auth=auth or store_auth(config),
        attempt_timeout_s=store.attempt_timeout_s, deadline_s=store.deadline_s,
    )  # fmt: skip


def queue_client(config: Config, auth: StoreAuth | None = None) -> QueueClient:
    return QueueClient(raft_client(config, auth))
