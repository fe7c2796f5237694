"""The client reads a node has taken and not yet answered, and when each is due.

A read is due once the node has applied up to its index: a linearizable read's read index (known
once a quorum confirmed the leader), 0 for a stale read, which is due at once. A waiting stale
read (a long poll: `codec.Read.wait_ms`) is due once a command after its `wait_after_index` has
applied, or when its wait runs out, whichever comes first; so a worker waiting for work hears of
an enqueue one apply after it, without asking again and again. A wake-one read
(`codec.Read.wakes_one`) is one of a group with the same query: per applied index the oldest of
the group waiting for an earlier one is due, the others wait for the next apply (idle workers
asking the same question do not all rush to lease the one message an enqueue made ready).

The node hands the due reads to one read job on the apply thread (node_reads.py, scheduled by the
Ready runner between applies: ready_runner.py `serve_reads`), and a
job cut short by its budget puts the rest back first in line.

Must never: answer a waiting read before its index or its time, or hold one past its `wait_ms`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

from raft_store import codec
from raft_store.codec import FrameType, Status
from raft_store.metrics import NodeMetrics
from raft_store.transport import ClientConnection

Due: TypeAlias = tuple[int, ClientConnection, codec.Read]
"""(the applied index it waits for, its connection, the read)."""


class ReadsDue:
    def __init__(self, serve: Callable[[], None], metrics: NodeMetrics) -> None:
        self._serve = serve
        """Called when a read fell due without an apply (its wait ran out)."""
        self._metrics = metrics
        self._waiting: list[Due] = []
        self._waking_one: dict[bytes, deque[tuple[ClientConnection, codec.Read]]] = {}
        """Wake-one reads by query, oldest first."""
        self._woken_at: dict[bytes, int] = {}
        """The applied index at which each query's last wake-one read was woken."""

    def __bool__(self) -> bool:
        return bool(self._waiting or self._waking_one)

    def add(self, index: int, conn: ClientConnection, read: codec.Read) -> None:
        """A read due once `index` has applied (a stale read: 0)."""
        self._waiting.append((index, conn, read))

    def take_stale(self, conn: ClientConnection, read: codec.Read, applied: int) -> None:
        """A stale read: due at once, or, when it waits, as the module says."""
        self._metrics.stale_reads += 1
        if not read.wait_ms:
            self._waiting.append((0, conn, read))
            return
        if read.linearizable:
            error = b"a waiting read must be stale (a linearizable read is answered at its read index)"
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, Status.ERROR, 0, (error,))))
            return
        if read.wakes_one and applied <= read.wait_after_index:
            self._waking_one.setdefault(read.query, deque()).append((conn, read))
        else:
            self._waiting.append((read.wait_after_index + 1, conn, read))
        asyncio.get_running_loop().call_later(read.wait_ms / 1000, self._ran_out, read)

    def due(self, applied: int) -> list[Due]:
        """The reads due at this applied index, in the order taken; the rest keep waiting."""
        if self._waking_one:
            self._wake_one_each(applied)
        ready = [r for r in self._waiting if r[0] <= applied]
        if ready:
            self._waiting = [r for r in self._waiting if r[0] > applied]
        return ready

    def put_back(self, reads: list[Due]) -> None:
        """Reads a job did not reach: first in line for the next."""
        self._waiting[:0] = reads

    def _wake_one_each(self, applied: int) -> None:
        for query, queue in list(self._waking_one.items()):
            if self._woken_at.get(query, -1) >= applied:
                continue
            for position, (conn, read) in enumerate(queue):
                if read.wait_after_index < applied:
                    del queue[position]
                    self._waiting.append((0, conn, read))
                    self._woken_at[query] = applied
                    break
            if not queue:
                del self._waking_one[query]
                self._woken_at.pop(query, None)

    def _ran_out(self, read: codec.Read) -> None:
        for position, (index, conn, waiting) in enumerate(self._waiting):
            if waiting is read:
                if index > 0:
                    self._waiting[position] = (0, conn, waiting)
                    self._serve()
                return
        queue = self._waking_one.get(read.query)
        for entry in queue or ():
            if entry[1] is read:
                queue.remove(entry)  # type: ignore[union-attr]
                self._waiting.append((0, entry[0], read))
                self._serve()
                return
