"""Durable, checksummed snapshot files, installed atomically.

File layout (little-endian):

    magic    8 bytes  b"RSNAP001"
    hlen     u32      length of the meta block
    meta     index u64, term u64, nvoters u32, voters u64*, nlearners u32, learners u64*
    data     the state machine's bytes, opaque here
    datalen  u64      length of data (a truncated file cannot pass as a shorter snapshot)
    crc      u32      CRC32C of every byte before it

A snapshot is written to `<name>.tmp`, fsynced, renamed over its final name and the directory is
fsynced: a crash at any point leaves either the old set of snapshots or the new one, plus maybe a
stray .tmp that the next start removes. The checksum covers the whole file because the snapshot
replaces the compacted log: a silently corrupt snapshot would be silently lost committed state.

Files are streamed in chunks with the CRC computed on the way, so a multi-GiB snapshot never has
to fit in memory. A follower receives the leader's file bytes unchanged (`iter_chunks` ->
`begin_receive`/`write_chunk`/`finish`) and verifies the same end-to-end checksum before install.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from raft_store import framing
from raft_store.files import AppendFile, FaultHook, FileSystem, private_dir
from raft_store.types import ConfState, SnapshotMeta

log = logging.getLogger(__name__)

MAGIC = b"RSNAP001"
CHUNK_BYTES = 1 << 20
KEEP = 2
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INDEX_TERM = struct.Struct("<QQ")
_PREFIX = len(MAGIC) + _U32.size
_TRAILER = _U64.size + _U32.size
_MAX_META = 1 << 20  # a meta block this large is a corrupted length, not a real membership
_NAME = re.compile(r"^snap-(\d{20})-(\d{20})\.snap$")
CHECKPOINT_NAME = "checkpoint.snap"

_crc = framing.crc32c


class CorruptSnapshotError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def snapshot_name(meta: SnapshotMeta) -> str:
    """Zero-padded (index, term) so lexical order is age order."""
    return f"snap-{meta.index:020d}-{meta.term:020d}.snap"


def encode_header(meta: SnapshotMeta) -> bytes:
    voters = sorted(meta.conf.voters)
    learners = sorted(meta.conf.learners)
    body = b"".join(
        (
            _INDEX_TERM.pack(meta.index, meta.term),
            _U32.pack(len(voters)),
            struct.pack(f"<{len(voters)}Q", *voters),
            _U32.pack(len(learners)),
            struct.pack(f"<{len(learners)}Q", *learners),
        )
    )
    return MAGIC + _U32.pack(len(body)) + body


def _decode_header(path: Path, head: bytes, file_size: int) -> tuple[SnapshotMeta, int]:
    """Parse magic and meta; returns the meta and the offset where data starts."""
    if len(head) < _PREFIX or head[: len(MAGIC)] != MAGIC:
        raise CorruptSnapshotError(path, "bad magic")
    (hlen,) = _U32.unpack_from(head, len(MAGIC))
    data_start = _PREFIX + hlen
    if hlen > _MAX_META or data_start + _TRAILER > file_size or len(head) < data_start:
        raise CorruptSnapshotError(path, f"implausible meta length {hlen} for a {file_size}-byte file")
    try:
        index, term = _INDEX_TERM.unpack_from(head, _PREFIX)
        pos = _PREFIX + _INDEX_TERM.size
        (nv,) = _U32.unpack_from(head, pos)
        voters = struct.unpack_from(f"<{nv}Q", head, pos + 4)
        pos += 4 + 8 * nv
        (nl,) = _U32.unpack_from(head, pos)
        learners = struct.unpack_from(f"<{nl}Q", head, pos + 4)
        pos += 4 + 8 * nl
    except struct.error as err:
        raise CorruptSnapshotError(path, f"malformed meta: {err}") from None
    if pos != data_start:
        raise CorruptSnapshotError(path, "meta length does not match its content")
    return SnapshotMeta(index, term, ConfState(frozenset(voters), frozenset(learners))), data_start


def _read_head(path: Path) -> tuple[SnapshotMeta, int, int]:
    """(meta, data_start, data_len) from header and trailer, without checking the CRC."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        prefix = f.read(_PREFIX)
        hlen = _U32.unpack_from(prefix, len(MAGIC))[0] if len(prefix) == _PREFIX else 0
        head = prefix + f.read(min(hlen, _MAX_META))
        meta, data_start = _decode_header(path, head, size)
        f.seek(size - _TRAILER)
        (data_len,) = _U64.unpack(f.read(_U64.size))
    if data_start + data_len + _TRAILER != size:
        raise CorruptSnapshotError(path, f"data length {data_len} does not match the file size {size}")
    return meta, data_start, data_len


def verify(path: Path) -> SnapshotMeta:
    """Check the whole file against its CRC (streaming) and return its meta."""
    meta, _start, _len = _read_head(path)
    size = path.stat().st_size
    body = size - _U32.size
    crc = 0
    with open(path, "rb") as f:
        remaining = body
        while remaining:
            chunk = f.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                raise CorruptSnapshotError(path, "file shrank while being verified")
            crc = _crc(chunk, crc)
            remaining -= len(chunk)
        (stored,) = _U32.unpack(f.read(_U32.size))
    if stored != crc:
        raise CorruptSnapshotError(path, f"checksum mismatch (stored {stored:#010x}, computed {crc:#010x})")
    return meta


class SnapshotWriter:
    """An in-progress snapshot file; nothing is visible under the final name until `finish`.

    `raw=False`: chunks are state-machine data and the header/trailer are added here.
    `raw=True`: chunks are a whole snapshot file as sent by a leader; `finish` verifies it.
    Use as a context manager to remove the temp file if the caller fails (a crash leaves it for
    the next start to remove).
    """

    def __init__(self, store: SnapshotStore, meta: SnapshotMeta, *, raw: bool, name: str | None = None) -> None:
        self._store = store
        self.meta = meta
        self._raw = raw
        self.final_path = store.directory / (name or snapshot_name(meta))
        self.tmp_path = self.final_path.with_suffix(".tmp")
        fs = store.fs
        if self.tmp_path.exists():
            fs.remove(self.tmp_path)
        self._file: AppendFile | None = fs.create(self.tmp_path)
        self._crc = 0
        self._data_len = 0
        self.written = 0
        if not raw:
            self._put(encode_header(meta))

    def _put(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError("snapshot writer is finished or aborted")
        self._file.write(data)
        self._crc = _crc(data, self._crc)
        self.written += len(data)

    def write_chunk(self, chunk: bytes, offset: int | None = None) -> None:
        """Append a chunk; `offset` (raw mode: file offset, else data offset) rejects reordering."""
        position = self.written if self._raw else self._data_len
        if offset is not None and offset != position:
            raise ValueError(f"chunk at offset {offset}, expected {position}")
        self._put(chunk)
        self._data_len += len(chunk)

    def finish(self) -> Path:
        """fsync, verify (raw mode), rename into place, fsync the directory, prune old ones."""
        if self._file is None:
            raise ValueError("snapshot writer is finished or aborted")
        if not self._raw:
            tail = _U64.pack(self._data_len)
            self._put(tail)
            self._file.write(_U32.pack(self._crc))
        f, self._file = self._file, None
        try:
            f.sync()
        finally:
            f.close()
        if self._raw:
            try:
                got = verify(self.tmp_path)
            except CorruptSnapshotError:
                self._store.fs.remove(self.tmp_path)
                raise
            if got != self.meta:
                self._store.fs.remove(self.tmp_path)
                raise CorruptSnapshotError(self.tmp_path, f"received snapshot is {got}, expected {self.meta}")
        store = self._store
        with store.lock:
            store.fs.rename(self.tmp_path, self.final_path)
            store.fs.fsync_dir(store.directory)
            store.prune()
        return self.final_path

    def abort(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            f.close()
            if self._store.fs.failure is None:  # after a storage failure, touch nothing more
                self._store.fs.remove(self.tmp_path)

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Only on ordinary errors: a SimulatedCrash (BaseException) must leave the temp file
        # behind exactly as a real crash would.
        if isinstance(exc, Exception):
            self.abort()


class SnapshotStore:
    """The newest `keep` snapshots in one directory."""

    def __init__(self, directory: Path, *, fault: FaultHook | None = None, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory = Path(directory)
        self.fs = FileSystem(fault=fault)
        # The node saves checkpoints on its WAL thread and frames on-demand snapshot copies on
        # another: every change to the directory's set of files happens under this lock.
        self.lock = threading.RLock()
        self.keep = keep
        # Corruption found by latest() that was survived by falling back; for metrics/alerts.
        self.reported: list[CorruptSnapshotError] = []
        if not self.directory.exists():
            private_dir(self.directory)
            self.fs.fsync_dir(self.directory.parent)
        stale = [*self.directory.glob("snap-*.tmp"), *self.directory.glob("checkpoint.tmp")]
        for p in stale:
            self.fs.remove(p)
        if stale:
            self.fs.fsync_dir(self.directory)

    def paths(self) -> list[Path]:
        """Snapshot files, newest first."""
        found = [p for p in self.directory.iterdir() if _NAME.match(p.name)]
        return sorted(found, key=lambda p: p.name, reverse=True)

    # ------------------------------------------------------------------ writing

    def begin(self, meta: SnapshotMeta) -> SnapshotWriter:
        """Write a snapshot from data chunks (e.g. a state machine streaming its dump)."""
        self.fs.check()
        return SnapshotWriter(self, meta, raw=False)

    def begin_receive(self, meta: SnapshotMeta) -> SnapshotWriter:
        """Write a snapshot file received from a leader in chunks (as produced by iter_chunks)."""
        self.fs.check()
        return SnapshotWriter(self, meta, raw=True)

    def save(self, meta: SnapshotMeta, data: bytes | Path) -> Path:
        """Atomically write a snapshot of `data` (bytes, or a file streamed in chunks)."""
        with self.begin(meta) as w:
            if isinstance(data, Path):
                with open(data, "rb") as src:
                    while chunk := src.read(CHUNK_BYTES):
                        w.write_chunk(chunk)
            else:
                for i in range(0, len(data), CHUNK_BYTES):
                    w.write_chunk(data[i : i + CHUNK_BYTES])
            return w.finish()

    def save_checkpoint(self, meta: SnapshotMeta) -> Path:
        """Record that the state machine's own store durably reflects the log up to `meta`.

        A checkpoint is a snapshot without data: for a machine whose state is already a durable
        store (SQLite), copying gigabytes to compact a log of megabytes is waste. The file has the
        snapshot format (header, zero data bytes, CRC) under the fixed name `checkpoint.snap`,
        replaced atomically; a full snapshot file is written only when a follower needs one."""
        with SnapshotWriter(self, meta, raw=False, name=CHECKPOINT_NAME) as w:
            path = w.finish()
        # A full snapshot older than the checkpoint can neither restart this node (its log tail is
        # compacted away) nor catch up a follower (too old): it is only disk space.
        with self.lock:
            doomed = [q for q in self.paths() if (m := _NAME.match(q.name)) and int(m.group(1)) < meta.index]
            for q in doomed:
                self.fs.remove(q)
            if doomed:
                self.fs.fsync_dir(self.directory)
        return path

    def checkpoint(self) -> SnapshotMeta | None:
        """The last checkpoint's meta, or None. A corrupt checkpoint raises: the WAL before it is gone."""
        path = self.directory / CHECKPOINT_NAME
        if not path.exists():
            return None
        try:
            return verify(path)
        except struct.error as err:
            raise CorruptSnapshotError(path, f"unreadable: {err}") from err

    def prune(self) -> None:
        """Keep the newest `keep`; older ones are covered by a newer snapshot."""
        with self.lock:
            doomed = self.paths()[self.keep :]
            for p in doomed:
                self.fs.remove(p)
            if doomed:
                self.fs.fsync_dir(self.directory)

    # ------------------------------------------------------------------ reading

    def latest(self) -> tuple[SnapshotMeta, Path] | None:
        """The newest snapshot that verifies.

        If the newest is corrupt and an older one verifies, the corrupt files are renamed to
        `.corrupt` (kept for inspection, and so pruning cannot delete the good fallback in their
        place), the event is logged and appended to `self.reported`, and the older one returned.
        The caller must check that the fallback still joins up with its log (snapshot index >=
        the WAL's first index - 1); if not, it needs a snapshot from the leader. With no valid
        snapshot at all, the newest one's CorruptSnapshotError is raised and nothing is moved.
        """
        errors: list[CorruptSnapshotError] = []
        for path in self.paths():
            try:
                meta = verify(path)
            except (CorruptSnapshotError, OSError, struct.error) as err:
                if not isinstance(err, CorruptSnapshotError):
                    err = CorruptSnapshotError(path, f"unreadable: {err}")
                log.error("corrupt snapshot %s: %s", path, err.reason)
                errors.append(err)
                continue
            if errors:
                for bad in errors:
                    self.fs.rename(bad.path, bad.path.with_name(bad.path.name + ".corrupt"))
                self.fs.fsync_dir(self.directory)
                log.warning("falling back to snapshot %s after %d corrupt newer snapshot(s)", path, len(errors))
                self.reported.extend(errors)
            return meta, path
        if errors:
            raise errors[0]
        return None

    @staticmethod
    def read_meta(path: Path) -> SnapshotMeta:
        return _read_head(path)[0]

    @staticmethod
    def iter_data(path: Path, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The state-machine data, in chunks (verify first: latest() does)."""
        _meta, start, length = _read_head(path)
        with open(path, "rb") as f:
            f.seek(start)
            while length:
                chunk = f.read(min(chunk_size, length))
                if not chunk:
                    raise CorruptSnapshotError(path, "file shrank while being read")
                length -= len(chunk)
                yield chunk

    @staticmethod
    def read_chunk(path: Path, offset: int, size: int) -> bytes:
        """Raw file bytes at `offset`, for a resumable transfer to a follower."""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    @staticmethod
    def iter_chunks(path: Path, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The whole raw file in chunks; the receiver verifies the embedded CRC."""
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                yield chunk
