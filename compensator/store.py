"""The store's clients, as every process builds them from the configuration.

Kept apart from wiring.py so that the command line's store commands (tokens, the local launcher)
do not import the web stack.
"""

from __future__ import annotations

from compensator.config import Config, parse_address
from queues import QueueClient, RaftClient


def raft_client(config: Config) -> RaftClient:
    store = config.store
    return RaftClient(
        [parse_address(address) for address in store.addresses], attempt_timeout_s=store.attempt_timeout_s,
        deadline_s=store.deadline_s,
    )  # fmt: skip


def queue_client(config: Config) -> QueueClient:
    return QueueClient(raft_client(config))
