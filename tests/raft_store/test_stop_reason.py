"""After a storage failure a node commits nothing on the way out, and its last line names the cause
and what to do (raft_store/stop_reason.py, raft_store/cli.py's run_node)."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from raft_store.files import FsyncFailedError, WalFailedError
from raft_store.framing import CorruptLogError
from raft_store.machines import KvMachine
from raft_store.state_machine import Command, GroupCommittingMachine
from raft_store.stop_reason import stop_reason

DATA = Path("/srv/compensator/node1")


def caused(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (caused(WalFailedError("write of wal/seg failed"), OSError(errno.ENOSPC, "No space left on device")),
         "the disk is full"),
        (sqlite3.OperationalError("database or disk is full"), "the disk is full"),
        (caused(FsyncFailedError("fsync of wal/seg failed"), OSError(errno.EIO, "Input/output error")),
         "the disk reported an I/O error"),
        (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
        (CorruptLogError(DATA / "wal" / "seg", 4096, "bad checksum"), "its log is corrupt"),
        (ValueError("a bug"), "on an unexpected error"),
    ],
)  # fmt: skip
def test_the_last_line_names_the_cause_and_what_to_do(error: Exception, said: str) -> None:
    line = stop_reason(error, node_id=3, data_dir=DATA)
    assert line.startswith(f"node 3 stopped: {said} (")
    assert "\n" not in line and line.endswith(".")
    if said == "the disk is full":
        assert f"Free space on the file system holding {DATA}" in line and "start the node again" in line


class LibraryError(Exception):
    """What LMDB raises: not an OSError, whatever the system said."""


def test_a_store_librarys_error_is_storage_and_on_a_full_file_system_a_full_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """LMDB reports a short write on a full file system as `mdb_txn_commit: Input/output error`:
    the store wraps it in a StorageError, and the space left on the data directory's file system
    says whether the disk is full."""
    from queues.stores import StoreError

    error = caused(StoreError("queue.lmdb: a commit failed"), LibraryError("mdb_txn_commit: Input/output error"))
    assert stop_reason(error, node_id=1, data_dir=tmp_path).startswith("node 1 stopped: storage failed (")

    class Full:
        f_bavail, f_frsize = 3, 4096

    monkeypatch.setattr("raft_store.stop_reason.os.statvfs", lambda path: Full())
    assert stop_reason(error, node_id=1, data_dir=tmp_path).startswith("node 1 stopped: the disk is full (")
    assert stop_reason(ValueError("a bug"), node_id=1, data_dir=tmp_path).startswith("node 1 stopped: on an unexpected")


class FailingCommit(KvMachine):
    """A store whose COMMIT fails and keeps the transaction open (a deferred constraint), as a
    full disk can leave it."""

    def create_tables(self, conn: sqlite3.Connection) -> None:
        super().create_tables(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS child (key TEXT REFERENCES kv(key) DEFERRABLE INITIALLY DEFERRED)")

    def apply_command(self, conn: sqlite3.Connection, now_ms: int, data: bytes) -> bytes:
        if data == b"orphan":
            conn.execute("INSERT INTO child (key) VALUES ('nobody')")
            return b"ok"
        return super().apply_command(conn, now_ms, data)


def test_a_failed_commit_leaves_nothing_to_commit_on_the_way_out(tmp_path: Path) -> None:
    machine = FailingCommit(tmp_path / "store.sqlite")
    machine._conn.execute("PRAGMA foreign_keys = ON")
    machine.apply_batch(1, 0, [Command(0, 0, b'{"op": "put", "key": "a", "value": "1"}')])
    machine.commit()
    machine.apply_batch(2, 0, [Command(0, 0, b"orphan")])
    with pytest.raises(sqlite3.IntegrityError):
        machine.commit()
    assert machine.uncommitted  # SQLite kept the transaction: the flag says so, not "committed"
    assert isinstance(machine, GroupCommittingMachine)
    machine.rollback()
    assert (machine.uncommitted, machine.applied_index()) == (False, 1)  # the log replays entry 2
    machine.close()  # commits nothing, raises nothing
    reopened = KvMachine(tmp_path / "store.sqlite")
    assert reopened.applied_index() == 1
    reopened.close()
