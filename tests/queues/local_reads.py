"""A replica's query server reached in process: the client's read path without a network.

One fake for the tests that drive a `QueueClient` over machines they apply to by hand; it keeps
`RaftClient.read`'s signature, so a new read option reaches every such test at once."""

from __future__ import annotations

from queues.replicated import ReplicatedQueueMachine
from raft_store.client import LongPoll


class LocalReads:
    def __init__(self, machine: ReplicatedQueueMachine) -> None:
        self.machine = machine

    async def read(
        self, data: bytes, *, linearizable: bool = True, wait: LongPoll | None = None
    ) -> tuple[bytes, int]:
        """A long poll is answered at once: nothing applies behind the test's back."""
        return self.machine.query(data), self.machine.applied_index()
