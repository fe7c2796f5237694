"""The only place the WAL and snapshot store touch the OS (but for raft_store/wal_spare.py, which
fills the next segment's zeros on a thread of its own, before that file is part of the log).

Two modes:
- normal: `os.pwrite` at a file's logical end on real file descriptors, `fdatasync` at sync, and
  a directory fsync after a file is created, renamed or removed (a new name is not durable until its directory is
  fsynced; "All File Systems Are Not Created Equal", OSDI'14);
- volatile: appends are held in process memory and only written and fsynced at `sync()`, so a
  kill -9 (or `close()` without sync) loses exactly the un-fsynced data. This turns "power loss"
  into something a test can do on real files.

Every file is created 0600 and every directory 0700, whatever the umask: a node's files hold
password hashes and unmasked payloads (`private_dir`, `make_private` tighten what older versions
left readable).

A `FaultHook` sees every operation first; tests use it to count fsyncs, fail an fsync with EIO,
or stop at a failpoint with `SimulatedCrash`.

An fsync failure is sticky: after one, the `FileSystem` refuses everything. On Linux a failed
fsync may have already dropped the dirty pages and cleared the error, so a retry can "succeed"
without the data ever reaching disk (PostgreSQL's "fsyncgate", 2018). The only safe reaction is
to stop and recover from what is durable (or from the other replicas).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Literal

Op = Literal["create", "write", "fsync", "fsync_dir", "rename", "remove", "truncate"]

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: Path) -> None:
    """`path` as a directory only its owner may enter (created if missing; parents as the umask says)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR)


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 unless it exists, so that a library creating it later
    (SQLite, and its -wal and -shm files, which take the database file's mode) keeps it private."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE))


def private_copy(source: Path, target: Path) -> None:
    """`source` copied to `target`, made anew with mode 0600 (a file already at `target` is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    private_file(target)
    shutil.copyfile(source, target)


def make_private(tree: Path) -> None:
    """`tree` and everything in it: directories 0700, files 0600 (symbolic links left alone)."""
    private_dir(tree)
    for root, directories, names in os.walk(tree):
        for name in directories:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, PRIVATE_DIR)
        for name in names:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, PRIVATE_FILE)


class WalFailedError(RuntimeError):
    """The storage layer hit an I/O error and refuses further work; the node must stop."""


class StorageError(Exception):
    """A state machine's store failed on its files, in a library that does not raise OSError (LMDB
    says `mdb_txn_commit: Input/output error`): the node's last line names it as storage, not a bug."""


class FsyncFailedError(WalFailedError):
    """An fsync (file or directory) failed: what was written may or may not be durable."""


class SimulatedCrash(BaseException):
    """Raised by a FaultHook at a failpoint to stop the code under test like a kill -9.

    A BaseException so `except Exception` cleanup paths do not run, as they would not in a
    real crash.
    """


class FaultHook:
    """Counts operations and injects faults; subclass and override `before` for other faults.

    fail_fsync_at: the n-th fsync (file or directory, 1-based) raises OSError(EIO); only that
    one, so a test can prove the caller never retries its way past the failure.
    crash_before / crash_at: raise SimulatedCrash before the `crash_at`-th operation `crash_before`.
    """

    def __init__(
        self,
        *,
        fail_fsync_at: int | None = None,
        crash_before: Op | None = None,
        crash_at: int = 1,
    ) -> None:
        self.calls: Counter[str] = Counter()
        self.fail_fsync_at = fail_fsync_at
        self.crash_before = crash_before
        self.crash_at = crash_at

    @property
    def fsyncs(self) -> int:
        return self.calls["fsync"] + self.calls["fsync_dir"]

    def before(self, op: Op, path: Path) -> None:
        self.calls[op] += 1
        if op == self.crash_before and self.calls[op] == self.crash_at:
            raise SimulatedCrash(f"crash before {op} #{self.crash_at} of {path}")
        if op in ("fsync", "fsync_dir") and self.fail_fsync_at is not None and self.fsyncs == self.fail_fsync_at:
            raise OSError(errno.EIO, "injected fsync failure", str(path))


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


# fdatasync skips the inode's timestamps; the size and block map, which reading the data back
# needs, it still flushes. Writes into a preallocated (zero-filled, synced) segment change
# neither, so their sync is one data flush with no journal commit.
datasync = getattr(os, "fdatasync", os.fsync)


class FileSystem:
    """Shared state of one store: the mode, the fault hook and the sticky failure."""

    def __init__(self, *, volatile: bool = False, fault: FaultHook | None = None) -> None:
        self.volatile = volatile
        self.fault = fault
        self.failure: WalFailedError | None = None

    def check(self) -> None:
        if self.failure is not None:
            raise type(self.failure)(f"storage refuses work after an earlier failure: {self.failure}")

    def before_op(self, op: Op, path: Path) -> None:
        self.check()
        if self.fault is not None:
            try:
                self.fault.before(op, path)
            except OSError as err:
                raise self.fail(err, op, path) from err

    def fail(self, err: OSError, op: Op, path: Path) -> WalFailedError:
        """Record a sticky failure and return the error to raise."""
        cls = FsyncFailedError if op in ("fsync", "fsync_dir") else WalFailedError
        failure = cls(f"{op} of {path} failed: {err}")
        failure.__cause__ = err
        if self.failure is None:
            self.failure = failure
        return failure

    def create(self, path: Path) -> AppendFile:
        """Create a new, empty file for appending (never reuses a name: O_EXCL)."""
        self.before_op("create", path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
        except OSError as err:
            raise self.fail(err, "create", path) from err
        return AppendFile(self, path, fd, 0, 0)

    def open_at(self, path: Path, end: int) -> AppendFile:
        """Reopen a file to write on from `end`: the bytes after it (if any) are zeros, unwritten
        space that later writes fill instead of growing the file."""
        self.check()
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        return AppendFile(self, path, fd, end, os.fstat(fd).st_size)

    def adopt(self, spare: Path, path: Path) -> AppendFile:
        """Give a zero-filled, synced spare file its segment name and open it to write from 0.
        The new name becomes durable with the caller's next directory fsync, like a created file's."""
        self.rename(spare, path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as err:
            raise self.fail(err, "create", path) from err
        return AppendFile(self, path, fd, 0, os.fstat(fd).st_size)

    def fsync_dir(self, directory: Path) -> None:
        self.before_op("fsync_dir", directory)
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as err:
            raise self.fail(err, "fsync_dir", directory) from err

    def rename(self, src: Path, dst: Path) -> None:
        """Atomic replace; the caller fsyncs the directory to make it durable."""
        self.before_op("rename", dst)
        try:
            os.replace(src, dst)
        except OSError as err:
            raise self.fail(err, "rename", dst) from err

    def remove(self, path: Path) -> None:
        self.before_op("remove", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise self.fail(err, "remove", path) from err

    def truncate(self, path: Path, size: int) -> None:
        """Cut a file to `size` and fsync it (used by recovery to drop a torn tail)."""
        self.before_op("truncate", path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as err:
            raise self.fail(err, "truncate", path) from err
        try:
            try:
                os.ftruncate(fd, size)
            except OSError as err:
                raise self.fail(err, "truncate", path) from err
            self.before_op("fsync", path)
            try:
                os.fsync(fd)
            except OSError as err:
                raise self.fail(err, "fsync", path) from err
        finally:
            os.close(fd)


class AppendFile:
    """A file written at its end, `size` (which counts held, volatile bytes too). The file may be
    longer: `capacity` bytes exist on disk, the ones past `size` zeros (a preallocated segment),
    which writes overwrite instead of growing the file."""

    __slots__ = ("_fd", "_fs", "_held", "_written", "capacity", "path", "size")

    def __init__(self, fs: FileSystem, path: Path, fd: int, size: int, capacity: int) -> None:
        self._fs = fs
        self.path = path
        self._fd: int | None = fd
        self.size = size
        self._written = size
        self.capacity = capacity
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        """One write per call: the WAL hands over a whole batch already joined."""
        fs = self._fs
        if fs.failure is not None:
            fs.check()
        assert self._fd is not None, "write after close"
        if fs.volatile:
            self._held.append(data)
        else:
            self._write_through(data)
        self.size += len(data)

    def _write_through(self, data: bytes) -> None:
        """The one place bytes reach the file descriptor (both modes)."""
        fs = self._fs
        assert self._fd is not None
        if fs.fault is not None:
            fs.before_op("write", self.path)
        try:
            _write_all(self._fd, data, self._written)
        except OSError as err:
            raise fs.fail(err, "write", self.path) from err
        self._written += len(data)

    def sync(self) -> None:
        fs = self._fs
        fs.check()
        assert self._fd is not None, "sync after close"
        if self._held:
            data = b"".join(self._held) if len(self._held) > 1 else self._held[0]
            self._held.clear()
            self._write_through(data)
        if fs.fault is not None:
            fs.before_op("fsync", self.path)
        try:
            datasync(self._fd)
        except OSError as err:
            raise fs.fail(err, "fsync", self.path) from err

    def close(self) -> None:
        """Release the descriptor; in volatile mode un-synced bytes are lost, as in a kill -9."""
        self._held.clear()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
