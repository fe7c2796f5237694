"""Which hosted replica a log line is about.

Why: a host process runs one replica of each of several groups (raft_store/hosting.py), and their
lines ("peer 2 at ...: connection refused", "node 1: a read job failed") read alike; at 3 a.m.
the on-call engineer must know which set's replica said it. Each replica starts inside `about`,
so its tasks (they copy the context they are created in) and its threads (ThreadLane runs each in
the context of its first job) carry the group, and `GroupTag` on the process's log handlers puts
it at the start of the message: `[set 2] peer 3 at ...`. A process of one replica has no group
and its lines are unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Final

GROUP: Final[ContextVar[str]] = ContextVar("raft_store_group", default="")


@contextlib.contextmanager
def about(group: str) -> Iterator[None]:
    """Whatever starts inside (tasks, threads' first jobs) logs as `group`'s."""
    token = GROUP.set(group)
    try:
        yield
    finally:
        GROUP.reset(token)


class GroupTag(logging.Filter):
    """On a handler: a record logged in a group's context starts with `[group] ` (once, however
    many handlers see the record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        group = GROUP.get()
        if group and not getattr(record, "raft_group", ""):
            record.msg = f"[{group}] {record.getMessage()}"
            record.args = None
            record.raft_group = group
        return True
