"""The WAL's next segment, zero-filled and synced on a thread of its own before it is needed.

Why: an fsync of a file that grew must commit the file system's journal too (new size, new
blocks), and on this machine's ext4 that doubles its latency (docs/storage.md has the figures).
Writes into space already written and synced change no metadata, so their `fdatasync` is one
data flush. PostgreSQL zero-fills its WAL segments for the same reason (`wal_init_zero`); etcd
prepares the next segment on a goroutine (its `filePipeline`), which is the shape here: one spare
file, `<dir>/next.spare`, filled in the background and renamed into place when the log rolls.

The spare is never part of the log: recovery deletes a `.spare` file it finds (a stop mid-fill),
and its zeros only become log space once the rename and the directory fsync of the next sync make
it a segment. Filling it fails soft: an error (a full disk, an EIO on its fsync) is logged and
the log creates its next segment empty, as it did before preallocation; nothing the log holds is
touched, so nothing is poisoned.

Sizes grow: the first spare after a start is small (a test cluster or an idle node pays a few
MiB, not 64), each next one twice the last, up to the segment size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from raft_store.files import PRIVATE_FILE, datasync

log = logging.getLogger("raft_store.wal")

SPARE_NAME = "next.spare"
FIRST_SPARE_BYTES = 1 << 20
_CHUNK = 1 << 20  # flushed one at a time: the log's syncs wait behind one chunk's flush at most


def fill_zeros(path: Path, size: int, stop: threading.Event) -> bool:
    """Write `size` zero bytes to a new `path` and sync them; False if stopped first."""
    zeros = bytes(min(_CHUNK, size))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        done = 0
        while done < size:
            if stop.is_set():
                return False
            done += os.pwrite(fd, zeros[: size - done], done)
            datasync(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


class SpareSegment:
    """The one spare of a WAL directory. Called from the WAL's thread; fills on its own."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.path = directory / SPARE_NAME
        self._segment_bytes = segment_bytes
        self._next_bytes = min(FIRST_SPARE_BYTES, segment_bytes)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = 0  # bytes of the filled spare, 0 while none is ready
        self.failures = 0

    @property
    def ready(self) -> bool:
        return self._ready > 0 and self._thread is not None and not self._thread.is_alive()

    def prepare(self) -> None:
        """Start filling the next spare unless one is filling or ready."""
        if self._thread is not None or self._stop.is_set():
            return
        size = self._next_bytes
        self._next_bytes = min(self._segment_bytes, size * 2)
        self._thread = threading.Thread(target=self._run, args=(size,), name="wal-spare", daemon=True)
        self._thread.start()

    def _run(self, size: int) -> None:
        try:
            if fill_zeros(self.path, size, self._stop):
                self._ready = size
        except OSError as err:
            self.failures += 1
            log.warning("WAL: could not prepare the next segment (%s); it will be created empty", err)
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def wait(self) -> None:
        """Until the fill in progress, if any, has finished (or failed)."""
        if self._thread is not None:
            self._thread.join()

    def take(self) -> Path | None:
        """The filled spare, now the caller's to rename; None if none is ready."""
        if not self.ready:
            return None
        self._ready = 0
        self._thread = None
        return self.path

    def settle(self) -> None:
        """At a roll: forget a fill that failed, so the next `prepare` tries again. Once a roll,
        not at every write: a full disk is not hammered (nor the log flooded) a thousand times a
        second."""
        if self._thread is not None and not self._thread.is_alive() and not self._ready:
            self._thread = None

    def close(self) -> None:
        """Stop a fill in progress, wait for its thread and delete the spare (one a crash leaves
        is deleted at the next open)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
