"""The last line a node prints when storage stops it: what failed, and what the operator does.

Why: at 3 a.m. the last line of a stopped node is what the on-call engineer reads first. A full
disk used to end with SQLite's `cannot commit - no transaction is active`, raised by a commit on
the way out after the real failure, which sends the reader the wrong way. The cause is found
in the exception and its causes (an errno, SQLite's full-disk error, a corrupt log), and the line
says the one thing to do for it (docs/runbook.md has the procedures).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from raft_store.files import FsyncFailedError, StorageError
from raft_store.framing import CorruptLogError
from raft_store.node import NodeStopped

_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL: Final = 13
_NEARLY_FULL_BYTES: Final = 1 << 20
"""Below this much space left, a storage failure is taken for a full disk whatever the library said:
LMDB reports a short write on a full file system as an I/O error."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _FULL:
        return True
    if isinstance(error, sqlite3.Error):
        return getattr(error, "sqlite_errorcode", None) == _SQLITE_FULL or "disk is full" in str(error)
    return False


def _no_space_left(data_dir: Path) -> bool:
    try:
        fs = os.statvfs(data_dir)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < _NEARLY_FULL_BYTES


def _storage(error: BaseException) -> bool:
    return isinstance(error, OSError | sqlite3.Error | StorageError)


def stop_reason(exc: BaseException, *, node_id: int, data_dir: Path, group: str = "") -> str:
    """One line: `node N stopped: <what failed> (<the error>). <what to do>.`; a replica hosted with
    others (raft_store/hosting.py) names its `group` (`node 2 of set 3 stopped: ...`)."""
    chain = list(_chain(exc))
    detail = "; ".join(dict.fromkeys(str(e) or type(e).__name__ for e in chain))[:400]
    where = f"the file system holding {data_dir}"
    if any(_disk_full(e) for e in chain) or (any(_storage(e) for e in chain) and _no_space_left(data_dir)):
        what = "the disk is full"
        todo = (
            f"Nothing was committed after the failure. Free space on {where} (df -h {data_dir}), then start"
            " the node again: it cuts off a half-written log record at start and catches up from the others"
        )
    elif any(isinstance(e, OSError) and e.errno == errno.EROFS for e in chain):
        what = "the file system is read-only"
        todo = (
            f"The kernel usually remounts read-only after disk errors: check dmesg, repair or replace the disk"
            f" under {data_dir}, then start the node again (or replace it: docs/runbook.md)"
        )
    elif any(isinstance(e, FsyncFailedError) or (isinstance(e, OSError) and e.errno == errno.EIO) for e in chain):
        what = "the disk reported an I/O error"
        todo = (
            "A failed fsync is never retried: what it covered may be lost. Check the device (dmesg, SMART); on"
            " a healthy disk start the node again, it recovers from what is durable and catches up from the"
            " others; on a failing one replace the node (docs/runbook.md)"
        )
    elif any(isinstance(e, CorruptLogError) for e in chain):
        what = "its log is corrupt"
        todo = (
            f"Do not edit the files. Move {data_dir} aside (keep it for the post-mortem) and start the node"
            " with an empty data directory: it rejoins from the leader's snapshot (docs/runbook.md)"
        )
    elif isinstance(exc, NodeStopped):
        what = "it refused its own state"
        todo = (
            f"Do not edit the files. Move {data_dir} aside (keep it for the post-mortem) and start the node"
            " with an empty data directory: it rejoins from the leader's snapshot (docs/runbook.md)"
        )
    elif any(_storage(e) for e in chain):
        what = "storage failed"
        todo = f"Check {where} (space, permissions, dmesg), then start the node again"
    else:
        what = "on an unexpected error"
        todo = "This is a bug: the traceback is above. Start the node again; report it with the log"
    name = f"node {node_id} of {group}" if group else f"node {node_id}"
    return f"{name} stopped: {what} ({detail}). {todo}."


__all__ = ["stop_reason"]
