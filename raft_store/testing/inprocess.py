"""A one-node store running in this process, on a thread of its own with its own event loop.

One node is a whole Raft set of one: a real WAL with real fsyncs, the real client protocol over
loopback TCP, behind its own cluster secret (`auth` for clients in the test's process,
`secret_file` for command lines it starts). On its own loop it serves async tests (which talk to it over TCP like any client)
and synchronous ones (schemathesis, which blocks the test's thread) alike. Fault tests need real
processes instead (processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from raft_store.client import RaftClient
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.state_machine import StateMachine
from raft_store.testing.credentials import cluster_auth, service_settings
from raft_store.testing.processes import free_ports

T = TypeVar("T")


class StoreThread:
    """A one-node store on its own loop in a daemon thread."""

    def __init__(self, data_dir: Path, machine_factory: Callable[[Path], StateMachine]) -> None:
        self._machine_factory = machine_factory
        (port,) = free_ports(1)
        self.address = ("127.0.0.1", port)
        name = f"{data_dir.name}.secret"
        self.auth = cluster_auth(data_dir.parent, name=name)
        self.secret_file = data_dir.parent / name
        self._config = NodeConfig(
            node_id=1, data_dir=data_dir, listen=self.address, peers={1: self.address},
            initial_voters=frozenset({1}), tick_ms=10, election_ticks=5, auth=self.auth,
        )  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.node: Node | None = None

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def start(self) -> None:
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        self.start_node()

    def start_node(self) -> None:
        """The node (again, after `stop_node`), from its data directory, on the same address."""
        self.node = Node(self._config, self._machine_factory(self._config.data_dir))
        self.run(self.node.start())
        self.run(self._wait_leader())

    def stop_node(self) -> None:
        """The node stops as a killed one would look to its clients (connections refused); the
        thread stays, for `start_node`."""
        if self.node is not None and not self.node.stopped.is_set():
            self.run(self.node.stop())
            self.node.machine.close()

    async def _wait_leader(self) -> None:
        client = RaftClient([self.address], auth=self.auth, attempt_timeout_s=0.5, deadline_s=10)
        try:
            for _ in range(200):
                if (await client.status(self.address)).get("role") == "leader":
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("the store elected no leader")
        finally:
            await client.close()

    def stop(self) -> None:
        self.stop_node()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def service_settings(self) -> dict[str, str]:
        """This store as the service's configuration names it (COMPENSATOR_STORE__ variables)."""
        return service_settings([self.address], self.auth)

    @property
    def addresses(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


@contextlib.contextmanager
def running_store(data_dir: Path, machine_factory: Callable[[Path], StateMachine]) -> Iterator[StoreThread]:
    """A started one-node store, stopped on exit: what a test fixture yields."""
    thread = StoreThread(data_dir, machine_factory)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
