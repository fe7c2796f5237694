"""The node's side of the log's clock: its real clocks, a lock, and the calls the node makes.

Why apart from node.py: `LogClock` (log_clock.py) is pure and single-threaded, but a node reads it
on its event loop (stamps, messages, status) and in its apply thread (every query's "now"). This
wraps it with the node's wall and monotonic clocks, read once per use, behind one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from raft_store.log import RaftLog
from raft_store.log_clock import LogClock
from raft_store.state_machine import latest_stamp_ms
from raft_store.types import Message


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class NodeClock:
    """Thread-safe: every method takes the lock; `read_ms` is what queries call "now"."""

    def __init__(
        self, node_id: int, *, band_ms: int, wall: Callable[[], int] = wall_ms, monotonic: Callable[[], int] = monotonic_ms
    ) -> None:
        self._clock = LogClock(node_id, band_ms=band_ms)
        self._wall, self._monotonic = wall, monotonic
        self._lock = threading.Lock()
        self._role: tuple[bool, int, frozenset[int]] | None = None
        self._stamp: tuple[int, int] = (-1, 0)  # (monotonic ms, reading) of the last stamp
        self._log: RaftLog | None = None

    def follow_log(self, log: RaftLog) -> None:
        """The node's log: as the node takes the lead, the times stamped in its entries above what
        it applied are a floor of its reading (`LogClock.logged`)."""
        self._log = log

    def read_ms(self) -> int:
        """The log's clock now: what the leader stamps into an entry and a query calls "now"."""
        with self._lock:
            return self._clock.read(wall_ms=self._wall(), mono_ms=self._monotonic())

    def stamps(self) -> tuple[int, int]:
        """(wall clock, reading) for a message on its way out. Only a leader's reading is followed,
        so a follower sends 0, and so does a leader that has only its own wall clock to go by. One
        reading per millisecond: a busy leader sends many messages in one."""
        wall = self._wall()
        with self._lock:
            if not self._clock.leading:
                return wall, 0
            mono = self._monotonic()
            if mono != self._stamp[0]:
                reading = self._clock.read(wall_ms=wall, mono_ms=mono)
                self._stamp = (mono, reading if self._clock.grounded else 0)
            return wall, self._stamp[1]

    def heard(self, m: Message) -> None:
        if m.wall_ms or m.clock_ms:
            with self._lock:
                self._clock.heard_message(m, mono_ms=self._monotonic())

    def committed(self, time_ms: int) -> None:
        with self._lock:
            self._clock.committed(time_ms)

    def set_role(self, leading: bool, leader: int, voters: frozenset[int]) -> None:
        role = (leading, leader, voters)
        if role != self._role:
            self._role = role
            log = self._log
            # On the node's loop, as the log is changed: the tail's stamps, read before the lock.
            latest = latest_stamp_ms(log.entries_after(log.applied)) if leading and log is not None else 0
            with self._lock:
                self._clock.set_role(leading=leading, leader=leader, voters=voters)
                self._clock.logged(latest)

    def status(self) -> dict[str, int | None]:
        """The node's wall clock against the log's (`offset_ms`: wall minus log, which an alert
        watches), and the majority's time when the node leads."""
        wall, mono = self._wall(), self._monotonic()
        with self._lock:
            reading = self._clock.read(wall_ms=wall, mono_ms=mono)
            majority = self._clock.majority_ms(wall_ms=wall, mono_ms=mono) if self._clock.leading else None
        return {"wall_ms": wall, "log_ms": reading, "offset_ms": wall - reading, "majority_ms": majority}


__all__ = ["NodeClock", "monotonic_ms", "wall_ms"]
