"""The queue machine as a raft_store node runs it: the factory and the read-query server.

    python -m raft_store run --id 1 --peer 1=h:p ... --data DIR --machine queues.replicated:machine_factory

Owns: `machine_factory(data_dir)` (the `module:factory` hook of raft_store's CLI) and
`ReplicatedQueueMachine.query(bytes) -> bytes`, which the node calls after a ReadIndex
(linearizable reads, on the leader) or at once (stale reads, on any replica), in its apply thread
between applies (never on its event loop: a page over a large dead tier takes longer than the
election timeout). The answer is the core's (queues.core.answers), read on the store's thread
from the applied state.

Queries are not applied: they change nothing and are not replicated, so reading a clock here is
allowed (unlike in apply). The clock is the log's, as the node reads it (raft_store/log_clock.py,
handed over by `use_clock`), never the node's raw wall clock: a read must call "ready" exactly
what the next Lease would grant, or a worker waits on a node whose clock is behind the log's. A
caller may pin it with `now_ms` (a view "as of").

Must never: raise out of `query` (the node would answer a bare ERROR, not a `QueryError` the
client can read), or write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from queues import query_codec as qc
from queues.core.answers import answer_query
from queues.core.config import QueueConfig
from queues.machine import QueueMachine
from queues.stores import Store, StoreError
from raft_store.files import private_dir

DB_NAME: Final = "queue.lmdb"
LEGACY_DB_NAME: Final = "queue.sqlite"
"""The SQL store of the versions before the LMDB store (`python -m queues.migrate` converts it)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicatedQueueMachine(QueueMachine):
    """QueueMachine plus the read-query server the Raft node calls."""

    def __init__(
        self, store: str | Path | Store, config: QueueConfig | None = None, *,
        clock_ms: Callable[[], int] = wall_clock_ms, threaded: bool | None = None,
    ) -> None:  # fmt: skip
        self._clock_ms = clock_ms
        """Outside a node (tests, tools) the wall clock; a node hands over the log's (`use_clock`)."""
        super().__init__(store, config, threaded=threaded)

    def use_clock(self, read_ms: Callable[[], int]) -> None:
        self._clock_ms = read_ms

    def query(self, data: bytes) -> bytes:
        """Answer one encoded query. Bad bytes or a failing query give a `QueryError` answer."""
        decoded = qc.decode_query(data)
        if isinstance(decoded, qc.QueryError):
            return qc.encode_answer(decoded)
        now_ms = decoded.now_ms if decoded.now_ms is not None else self._clock_ms()
        try:
            answer = self.store.call(lambda: answer_query(self.store.read(), decoded, now_ms, self.config))
        except Exception as error:  # a QueryError the client can read, not the node's bare ERROR
            answer = qc.QueryError(code=qc.QueryErrorCode.FAILED, detail=str(error)[:200], now_ms=now_ms)
        return qc.encode_answer(answer)


def machine_factory(data_dir: Path) -> ReplicatedQueueMachine:
    """`--machine queues.replicated:machine_factory`: the LMDB store in the node's data dir.

    A data directory that still holds the SQL store of an older version is refused in one line
    (StoreError) that says how to convert it: never opened empty beside it."""
    data_dir = Path(data_dir)
    private_dir(data_dir)
    legacy = data_dir / LEGACY_DB_NAME
    if legacy.exists() and not (data_dir / DB_NAME).exists():
        raise StoreError(
            f"{legacy} is a queue store of the SQL layout (before the LMDB store): convert it with"
            f" `python -m queues.migrate {data_dir}`, or move the data directory aside and let the node rejoin"
            " empty from a snapshot"
        )
    return ReplicatedQueueMachine(str(data_dir / DB_NAME), threaded=True)
