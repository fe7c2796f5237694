"""The storage port over one LMDB transaction: what the core's reads and writes become in LMDB.

A named database per table of the port (`NAMES`); a write transaction's view counts the rows it
changed, which the store's group commit goes by. A file written by an earlier version may lack
tables added since: a read-only open reads them as empty (`OlderTx`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, cast

import lmdb

from queues.core.port import Table
from queues.stores import StoreError

NAMES: Final = tuple(table.name.lower().encode() for table in Table)


class Tx:
    """The port over one LMDB transaction."""

    __slots__ = ("_dbs", "_txn", "changes")

    def __init__(self, txn: lmdb.Transaction, dbs: tuple[Any, ...]) -> None:
        self._txn = txn
        self._dbs = dbs
        self.changes = 0

    def get(self, table: Table, key: bytes) -> bytes | None:
        # Positional arguments to py-lmdb throughout: it parses keywords slowly, and these run per row.
        return cast("bytes | None", self._txn.get(key, None, self._dbs[table]))

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        cursor = self._txn.cursor(db=self._dbs[table])
        if not reverse:
            if not cursor.set_range(start):
                return
            for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor.iternext()):
                if stop is not None and key >= stop:
                    return
                yield key, value
            return
        if stop is None:
            positioned = cursor.last()
        elif cursor.set_range(stop):
            positioned = cursor.prev()  # the last key below stop, if any
        else:
            positioned = cursor.last()  # every key is below stop
        if not positioned:
            return
        for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor.iterprev()):
            if key < start:
                return
            yield key, value

    def count(self, table: Table) -> int:
        return int(self._txn.stat(self._dbs[table])["entries"])

    def put(self, table: Table, key: bytes, value: bytes, *, append: bool = False) -> None:
        if not self._txn.put(key, value, True, True, append, self._dbs[table]) and append:
            raise StoreError(f"{table.name}: an append of {key.hex()} is not above the table's last key")
        self.changes += 1

    def delete(self, table: Table, key: bytes) -> bool:
        found = bool(self._txn.delete(key, b"", self._dbs[table]))
        self.changes += found
        return found

    def claim(self, table: Table, key: bytes, value: bytes) -> bytes | None:
        db = self._dbs[table]
        if self._txn.put(key, value, True, False, False, db):  # MDB_NOOVERWRITE: False when the key is there
            self.changes += 1
            return None
        return cast("bytes", self._txn.get(key, None, db))


class OlderTx(Tx):
    """A read-only view of a file written by an earlier version, which lacks the tables added since
    (their handles are None): they read as empty (a read-only open cannot create them; a writer
    creates them and the machine rebuilds what they derive from, docs/storage.md)."""

    __slots__ = ()

    def get(self, table: Table, key: bytes) -> bytes | None:
        return None if self._dbs[table] is None else super().get(table, key)

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        return iter(()) if self._dbs[table] is None else super().scan(table, start, stop, reverse=reverse)

    def count(self, table: Table) -> int:
        return 0 if self._dbs[table] is None else super().count(table)


ADDED_LATER: Final = frozenset({Table.DEAD_BUCKETS, Table.DEAD_AMOUNTS, Table.JOB_GROUPS})
"""Tables a file of an earlier version may lack: derived indexes, rebuilt when a writer opens it."""
