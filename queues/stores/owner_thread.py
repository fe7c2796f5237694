"""A thread that runs what must stay on one thread: LMDB's write transaction (queues/stores/lmdb_store.py)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class OwnerThread:
    """The thread that begins, commits and aborts the group's write transaction.

    LMDB's writer lock is a process-shared mutex that only the thread which took it may release,
    and the node calls its machine from more than one thread. So the group's transaction is begun
    and ended here, and everything else (each entry's nested transaction, every read) runs on the
    caller's thread, with no hand-off per entry. A commit runs here after the entry that filled
    the group has returned: its page writes overlap the node's answers and the next replication,
    and the next write waits for it only if it comes first."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def start(self, fn: Callable[[], Any]) -> tuple[list[Any], threading.Event]:
        box: list[Any] = []
        done = threading.Event()
        self._tasks.put((fn, box, done))
        return box, done

    def run(self, fn: Callable[[], T]) -> T:
        box, done = self.start(fn)
        return result_of(box, done)  # type: ignore[no-any-return]

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, box, done = task
            try:
                box.extend((True, fn()))
            except BaseException as error:  # handed to whoever waits for it
                box.extend((False, error))
            done.set()

    def stop(self) -> None:
        self._tasks.put(None)
        self._thread.join()


def result_of(box: list[Any], done: threading.Event) -> Any:
    done.wait()
    ok, value = box
    if not ok:
        raise value
    return value
