"""The node's client reads: ReadIndex rounds, reads due, and the read jobs the runner schedules.

All linearizable reads that arrived in one turn share one ReadIndex round (one heartbeat to the
followers). Once the core confirms a read index, its reads are due when it has applied (reads.py);
the Ready runner hands them to one read job on the machine lane between applies, never on the
loop: a query may take hundreds of milliseconds (a summary over a large dead-letter tier), longer
than the election timeout, and the loop must keep ticking, heartbeating and appending meanwhile.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from raft_store import codec
from raft_store.codec import FrameType, Status
from raft_store.core import RaftCore
from raft_store.metrics import NodeMetrics
from raft_store.reads import Due, ReadsDue
from raft_store.ready_runner import ReadJob
from raft_store.transport import ClientConnection
from raft_store.types import ReadState

log = logging.getLogger("raft_store.node")

READ_JOB_BUDGET_S = 0.01
"""A read job stops taking further queries of its batch after this long (the rest go first into
the next job): applies queued behind it then wait for at most one slow query plus this, however
many reviewers ask at once."""

Answers = tuple[int, list[tuple[Status, bytes]]]


class NodeReads:
    def __init__(self, node_id: int, machine: Any, metrics: NodeMetrics, serve: Callable[[], None]) -> None:
        self._node_id = node_id
        self._machine = machine
        self.core: RaftCore | None = None
        self._waiting: dict[bytes, list[tuple[ClientConnection, codec.Read]]] = {}
        self._batch: list[tuple[ClientConnection, codec.Read]] = []
        self._due = ReadsDue(serve, metrics)
        self._seq = 0

    def client_read(self, conn: ClientConnection, read: codec.Read) -> None:
        core = self.core
        assert core is not None
        if not read.linearizable or read.wait_ms:  # due at once, or a long poll (reads.py)
            self._due.take_stale(conn, read, core.log.applied)
        elif core.leader == 0:
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, Status.NOT_LEADER, 0, ())))
        else:
            self._batch.append((conn, read))

    def request_read_index(self) -> None:
        """All linearizable reads that arrived since the last turn share one ReadIndex round."""
        if not self._batch:
            return
        assert self.core is not None
        self._seq += 1
        context = self._seq.to_bytes(8, "big") + os.urandom(4)
        self._waiting[context] = self._batch
        self._batch = []
        self.core.read_index(context)

    def leader_lost(self) -> None:
        """No leader is known: the linearizable reads waiting for a read index are told so."""
        waiting = [r for batch in self._waiting.values() for r in batch] + self._batch
        for conn, read in waiting:
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, Status.NOT_LEADER, 0, ())))
        self._waiting = {}
        self._batch = []

    @property
    def awaiting_index(self) -> bool:
        return bool(self._waiting or self._batch)

    # ---- the runner's Reader ------------------------------------------------------------------
    def read_state(self, state: ReadState) -> None:
        for conn, read in self._waiting.pop(state.context, []):
            self._due.add(state.index, conn, read)

    def pending(self) -> bool:
        return bool(self._due)

    def take(self, applied: int) -> ReadJob[Any] | None:
        ready = self._due.due(applied)
        if not ready:
            return None
        queries = [read.query for _, _, read in ready]
        return (lambda: self._query_batch(queries)), (lambda result: self._read_done(result, ready))

    def _query_batch(self, queries: list[bytes]) -> Answers:
        """Machine lane: answers to a prefix of `queries` (all of them unless the job ran past
        READ_JOB_BUDGET_S), with the applied index they all reflect, taken from the machine here
        (exact: nothing applies while this runs). A query that raises answers ERROR: a bad read
        must neither stop the node nor leave its client waiting."""
        machine = self._machine
        applied = int(machine.applied_index())
        deadline = time.perf_counter() + READ_JOB_BUDGET_S
        answers: list[tuple[Status, bytes]] = []
        for query in queries:
            if answers and time.perf_counter() >= deadline:
                break
            try:
                answers.append((Status.OK, machine.query(query)))
            except Exception as exc:
                log.exception("node %d: a query failed", self._node_id)
                answers.append((Status.ERROR, f"query failed: {exc!r}"[:500].encode()))
        return applied, answers

    def _read_done(self, result: Callable[[], Answers], ready: list[Due]) -> None:
        hint = self.core.leader if self.core is not None else 0
        try:
            applied, answers = result()
        except Exception as exc:
            log.error("node %d: a read job failed: %r", self._node_id, exc)
            answers = [(Status.ERROR, f"read failed: {exc!r}".encode())] * len(ready)
            applied = 0
        for (_, conn, read), (status, answer) in zip(ready, answers, strict=False):
            results = (answer, applied.to_bytes(8, "big")) if status is Status.OK else (answer,)
            conn.send(FrameType.RESULT, codec.encode_result(codec.Result(read.request_id, status, hint, results)))
        # What the budget left unanswered goes first into the next job.
        self._due.put_back(ready[len(answers) :])
