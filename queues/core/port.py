"""The storage port: what the queue's rules need from a store, and nothing more.

The core keeps its state in named tables of ordered byte keys and byte values (River's driver
interface is the model: one interface, one shared conformance suite, tests/queues/test_store_port.py,
that every implementation passes). Keys compare as bytes (memcmp, shorter first on a common
prefix), so the encodings in `queues.core.keys` make every range the rules ask for ("the oldest due
messages of a kind", "dead letters of a group after a cursor") one ordered scan.

Why bytes and not typed operations: every rule, record layout and index lives above this line, in
pure code that runs the same on every store; a store only has to be an ordered map with atomic
groups of writes. Two stores implement it: LMDB (the nodes', `queues.stores.lmdb_store`) and SQLite
(`queues.stores.sqlite_store`: the simulator's, whose whole state is one byte image).

Must never: hold a rule, or a record layout.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Protocol


class Table(enum.IntEnum):
    """Every table of the queue's state. Key and value layouts: `queues.core.keys` and
    `queues.core.records`; which rule keeps which index: `queues.core.messages` and the modules
    named per table."""

    META = 0
    MESSAGES = 1
    BODIES = 2
    EDITED = 3
    KEYS = 4
    REFS = 5
    DUE = 6
    LEASES = 7
    DEAD = 8
    DEAD_GROUPS = 9
    PURGE = 10
    PHASE_COUNTS = 11
    EVENTS = 12
    OPERATOR_EVENTS = 13
    KINDS = 14
    PAUSES = 15
    SETTINGS = 16
    TOKENS = 17
    TOKEN_SECRETS = 18
    DOCUMENTS = 19
    DOCUMENT_VERSIONS = 20
    AUDIT = 21
    AUDIT_MESSAGES = 22
    AUDIT_ACTORS = 23
    AUDIT_ACTIONS = 24
    AUDIT_TARGETS = 25
    PROPOSALS = 26
    PROPOSALS_PENDING = 27
    JOBS = 28
    JOBS_ACTIVE = 29
    JOB_ITEMS = 30
    JOB_ITEMS_BY_RESULT = 31
    SESSIONS = 32
    SESSIONS_TOUCHED = 33
    DEAD_BUCKETS = 34
    DEAD_AMOUNTS = 35
    JOB_GROUPS = 36


class KvRead(Protocol):
    """A consistent view of the state: between applies, the applied state."""

    def get(self, table: Table, key: bytes) -> bytes | None: ...

    def scan(
        self, table: Table, start: bytes = b"", stop: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) with start <= key < stop (stop None: to the end), ascending; `reverse`:
        the same keys, descending. Lazy: a caller that stops early reads no further."""
        ...

    def count(self, table: Table) -> int:
        """How many keys the table holds: O(1) (the rules keep no counter of their own for it)."""
        ...


class KvWrite(KvRead, Protocol):
    """The writes of one log entry: all of them take effect, or none (the entry raised)."""

    def put(self, table: Table, key: bytes, value: bytes, *, append: bool = False) -> None:
        """Insert or replace. `append`: the caller knows `key` is above every key of the table
        (a new message id, a new event seq): a store may use that, and must refuse it when false."""
        ...

    def delete(self, table: Table, key: bytes) -> bool:
        """Whether the key was there."""
        ...

    def claim(self, table: Table, key: bytes, value: bytes) -> bytes | None:
        """Insert `value` at `key` unless the key is there; answer what is there (None: inserted).
        One lookup where `get` then `put` take two: an idempotency key is claimed so at each
        enqueue, on every replica, and a new key (the common case) is found absent by the insert."""
        ...
