"""A queue machine driven in process through `apply_batch` bytes, as a node drives it: the one
test driver the in-process query, access and timeline tests share."""

from __future__ import annotations

from collections.abc import Iterator

from queues import codec
from queues.core.port import KvRead, KvWrite, Table
from queues.machine import QueueConfig, QueueMachine
from queues.model import Code, Enqueue, EnqueueResult, Fail, Lease, LeaseResult, QueueCommand, QueueResult
from raft_store.state_machine import Command

T0 = 1_700_000_000_000


class Node:
    def __init__(self, path: str = ":memory:", config: QueueConfig | None = None) -> None:
        self.machine: QueueMachine = QueueMachine(path, config)
        self.index = 0
        self.now_ms = T0

    @classmethod
    def over(cls, machine: QueueMachine) -> Node:
        """Drive a machine built elsewhere (a ReplicatedQueueMachine, to query it too)."""
        node = cls.__new__(cls)
        node.machine, node.index, node.now_ms = machine, 0, T0
        return node

    def apply_raw(self, data: bytes) -> QueueResult:
        self.index += 1
        return codec.decode_result(self.machine.apply_batch(self.index, self.now_ms, [Command(0, 0, data)])[0])

    def apply_many(self, commands: list[QueueCommand]) -> list[QueueResult]:
        self.index += 1
        data = [Command(0, 0, codec.encode_command(c)) for c in commands]
        return [codec.decode_result(r) for r in self.machine.apply_batch(self.index, self.now_ms, data)]

    def apply(self, command: QueueCommand) -> QueueResult:
        return self.apply_many([command])[0]

    def enqueue(self, key: str, kind: str = "transfer", ref: str = "order-1", delay_ms: int = 0) -> int:
        result = self.apply(
            Enqueue(kind=kind, idempotency_key=key, ref_key=ref, payload=key.encode(), delay_ms=delay_ms)
        )
        assert isinstance(result, EnqueueResult) and result.code is Code.OK, result
        return result.message_id

    def lease(self, count_max: int = 10, kinds: tuple[str, ...] = ()) -> LeaseResult:
        result = self.apply(Lease(worker_id="w", count_max=count_max, lease_ms=30_000, kinds=kinds))
        assert isinstance(result, LeaseResult)
        return result

    def kill(self, message_id: int, token: int, error_class: str = "insufficient_funds") -> None:
        fail = Fail(message_id=message_id, token=token, error_class=error_class, permanent=True)
        assert self.apply(fail).code is Code.OK


class CountingView:
    """A view that counts what it reads, per table: how a test shows that a read goes through an
    index (what the SQL store's tests asked of EXPLAIN QUERY PLAN)."""

    def __init__(self, view: KvRead) -> None:
        self._view = view
        self.scans: dict[Table, int] = {}
        """Keys read by scans, per table."""
        self.gets: dict[Table, int] = {}

    def get(self, table: Table, key: bytes) -> bytes | None:
        self.gets[table] = self.gets.get(table, 0) + 1
        return self._view.get(table, key)

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        for item in self._view.scan(table, start, stop, reverse=reverse):
            self.scans[table] = self.scans.get(table, 0) + 1
            yield item

    def count(self, table: Table) -> int:
        return self._view.count(table)


class CountingWrite(CountingView):
    """A CountingView of one entry's writes (a rule run by hand inside `store.write()`)."""

    def __init__(self, tx: KvWrite) -> None:
        super().__init__(tx)
        self._tx = tx

    def put(self, table: Table, key: bytes, value: bytes, *, append: bool = False) -> None:
        self._tx.put(table, key, value, append=append)

    def delete(self, table: Table, key: bytes) -> bool:
        return self._tx.delete(table, key)

    def claim(self, table: Table, key: bytes, value: bytes) -> bytes | None:
        self.gets[table] = self.gets.get(table, 0) + 1
        return self._tx.claim(table, key, value)


def tamper(machine: QueueMachine, table: Table, key: bytes, value: bytes | None) -> None:
    """Change one stored value behind the rules' back: a store corrupted at rest, for the audit's tests."""
    with machine.store.write() as tx:
        if value is None:
            tx.delete(table, key)
        else:
            tx.put(table, key, value)
    machine.store.commit()
