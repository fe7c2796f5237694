"""Durable checkpoints of an LMDB store whose commits are not synced.

The store commits its groups of applies without fsync (MDB_NOSYNC): the Raft log is the durable
record of every applied entry, and an fsync per group put 5-70 ms pauses on the apply thread of a
disk like this machine's. What makes the state durable is a checkpoint: an fsync of the data file
at a state C, after which the log before C may be compacted. Without synced commits, a power cut
can leave the file's newest meta page pointing at pages that never reached the disk; so after any
unclean stop the store is rolled back to its last checkpoint and the node replays the log from it.
Two things make C's state recoverable:

  * a read transaction pinned on C from the checkpoint until the next one: LMDB reuses no page a
    live reader can see, so no later write touches a page of C's trees or free list (LMDB's MVCC,
    the same guarantee every reader has);
  * C's meta page, saved at the checkpoint in a side file (`<store>-checkpoint`: the page, its
    transaction id and the applied index, with a CRC, written atomically). A rollback writes it
    back over both meta slots of the data file, fsyncs, and removes the lock file; LMDB then opens
    at C. Pages written after C are either beyond C's last page or on C's free list: C never
    reads them.

A clean stop syncs and leaves a marker (`<store>-clean`): the next open trusts the file as it is
and makes that state the checkpoint at once (no reader protects the old one across processes).

The meta page layout is LMDB 0.9's (MDB_meta after a 16-byte page header: magic 0xBEEFC0DE,
data version 1, the transaction id at byte 144 of the page); a file or a saved page that does not
carry it is refused, never patched.

Must never: patch a file whose layout it does not recognise, or leave a torn checkpoint file.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from queues.stores import StoreError
from raft_store.files import PRIVATE_FILE

MAGIC: Final = 0xBEEFC0DE
DATA_VERSION: Final = 1
_MAGIC_AT: Final = 16
_TXNID_AT: Final = 144
_SIDE: Final = struct.Struct("<4sQQI")  # b"QCKP", txnid, applied index, page size
_SIDE_TAG: Final = b"QCKP"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A durable state: its transaction id, applied index, and meta page as it was written."""

    txnid: int
    index: int
    page: bytes


def meta_txnid(page: bytes) -> int:
    """The transaction id a meta page records; StoreError when it is not an LMDB 0.9 meta page."""
    magic, version = struct.unpack_from("<II", page, _MAGIC_AT)
    if magic != MAGIC or version != DATA_VERSION:
        raise StoreError(f"not an LMDB meta page of data version {DATA_VERSION} (magic {magic:#x}, version {version})")
    return int(struct.unpack_from("<Q", page, _TXNID_AT)[0])


def read_meta(path: str, page_size: int, txnid: int) -> bytes:
    """The meta page of transaction `txnid`, from whichever of the two slots holds it now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for slot in (0, 1):
            page = os.pread(fd, page_size, slot * page_size)
            if meta_txnid(page) == txnid:
                return page
    finally:
        os.close(fd)
    raise StoreError(f"{path}: no meta page records transaction {txnid}")


def side_path(path: str) -> str:
    return path + "-checkpoint"


def clean_path(path: str) -> str:
    return path + "-clean"


def save(path: str, checkpoint: Checkpoint) -> None:
    """Write the side file atomically (a temporary file, fsynced, renamed, directory fsynced)."""
    body = _SIDE.pack(_SIDE_TAG, checkpoint.txnid, checkpoint.index, len(checkpoint.page)) + checkpoint.page
    data = body + zlib.crc32(body).to_bytes(4, "little")
    tmp = side_path(path) + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # made anew: an older version's may be readable by others
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, side_path(path))
    fsync_dir(path)


def load(path: str) -> Checkpoint | None:
    try:
        with open(side_path(path), "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    body, crc = data[:-4], data[-4:]
    if len(data) < _SIDE.size + 4 or zlib.crc32(body).to_bytes(4, "little") != crc:
        raise StoreError(f"{side_path(path)}: the checkpoint record is corrupt (CRC): the store cannot be recovered")
    tag, txnid, index, size = _SIDE.unpack_from(body)
    page = body[_SIDE.size :]
    if tag != _SIDE_TAG or len(page) != size or meta_txnid(page) != txnid:
        raise StoreError(f"{side_path(path)}: not a checkpoint record of this store")
    return Checkpoint(int(txnid), int(index), bytes(page))


def roll_back(path: str, checkpoint: Checkpoint) -> None:
    """Make the data file open at the checkpoint: its meta page in both slots (each with its own
    page number), fsynced, and the lock file (which may record a later transaction) removed."""
    size = len(checkpoint.page)
    fd = os.open(path, os.O_RDWR)
    try:
        for slot in (0, 1):
            page = slot.to_bytes(8, "little") + checkpoint.page[8:]
            if os.pwrite(fd, page, slot * size) != size:
                raise StoreError(f"{path}: short write of a meta page")
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + "-lock")


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
