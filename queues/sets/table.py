"""The set table: which sets exist, where they answer, and the epochs that route keys.

An epoch is an append-only list of set ids: epoch 1 = [1], and adding sets 2 and 3 makes epoch 2
= [1, 2, 3]. A newer epoch's list always starts with the older one's (jump consistent hash then
moves only the new sets' share of keys). An epoch is `pending` while its fence is being committed
on every set of the epoch before, and `active` after: routers use active epochs only.

The table is one JSON document (namespace `sets`, name `table`) in the control set, so every change
is one replicated, audited write of the whole table, and a reader gets a consistent table in one read.

Must never: do I/O, or accept a table whose epochs do not extend each other.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

NAMESPACE: Final = "sets"
DOCUMENT: Final = "table"
CONTROL_SET_ID: Final = 0
"""The control set's id where a set id is needed (status, logs): never part of a request id."""
SET_ID_MAX: Final = 99_999
"""A request id's set part has at most five digits (ledger/request_ids.py)."""
_ADDRESS: Final = re.compile(r"^[A-Za-z0-9_.\-]{1,253}:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]{2,45}\]:[0-9]{1,5}$")


class TableError(ValueError):
    """A table, or a change to it, that is not valid: the message is one line for an operator."""


class EpochState(enum.Enum):
    PENDING = "pending"
    ACTIVE = "active"


class SetEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: int
    addresses: tuple[str, ...]


class Epoch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    epoch: int
    sets: tuple[int, ...]
    state: EpochState = EpochState.ACTIVE


class SetTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sets: tuple[SetEntry, ...] = ()
    epochs: tuple[Epoch, ...] = ()

    def addresses(self) -> dict[int, tuple[str, ...]]:
        return {entry.id: entry.addresses for entry in self.sets}

    def active(self) -> tuple[Epoch, ...]:
        """The epochs routers use, oldest first."""
        return tuple(epoch for epoch in self.epochs if epoch.state is EpochState.ACTIVE)

    def newest_active(self) -> Epoch:
        active = self.active()
        if not active:
            raise TableError("the set table has no active epoch (run `compensator sets init`)")
        return active[-1]

    def pending(self) -> Epoch | None:
        last = self.epochs[-1] if self.epochs else None
        return last if last is not None and last.state is EpochState.PENDING else None


def check_address(address: str) -> str:
    if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise TableError(f"not a host:port address: {address!r}")
    return address


def validate(table: SetTable) -> SetTable:
    """The table, or TableError naming the first thing wrong with it."""
    ids = [entry.id for entry in table.sets]
    if len(set(ids)) != len(ids):
        raise TableError("a set id appears twice in the set table")
    seen_addresses: set[str] = set()
    for entry in table.sets:
        if not 1 <= entry.id <= SET_ID_MAX:
            raise TableError(f"set id {entry.id} is outside 1..{SET_ID_MAX}")
        if not entry.addresses:
            raise TableError(f"set {entry.id} has no addresses")
        for address in entry.addresses:
            check_address(address)
            if address in seen_addresses:
                raise TableError(f"address {address} belongs to two sets")
            seen_addresses.add(address)
    known = set(ids)
    previous: Epoch | None = None
    for number, epoch in enumerate(table.epochs, start=1):
        if epoch.epoch != number:
            raise TableError(f"epochs must be numbered 1, 2, ...: found {epoch.epoch} at place {number}")
        if not epoch.sets or len(set(epoch.sets)) != len(epoch.sets):
            raise TableError(f"epoch {epoch.epoch} must list distinct sets")
        missing = [set_id for set_id in epoch.sets if set_id not in known]
        if missing:
            raise TableError(f"epoch {epoch.epoch} names unknown set {missing[0]}")
        if previous is not None:
            if epoch.sets[: len(previous.sets)] != previous.sets or len(epoch.sets) == len(previous.sets):
                raise TableError(f"epoch {epoch.epoch} must extend epoch {previous.epoch}'s sets with new ones")
            if previous.state is EpochState.PENDING:
                raise TableError(f"epoch {previous.epoch} is still pending below epoch {epoch.epoch}")
        previous = epoch
    return table


def first_table(addresses: Mapping[int, Sequence[str]]) -> SetTable:
    """Epoch 1 of the given sets (active: nothing routed before it, so nothing to fence)."""
    sets = tuple(SetEntry(set_id, tuple(found)) for set_id, found in sorted(addresses.items()))
    return validate(SetTable(sets=sets, epochs=(Epoch(1, tuple(entry.id for entry in sets)),)))


def with_new_sets(table: SetTable, added: Sequence[tuple[str, ...]]) -> tuple[SetTable, Epoch]:
    """The table with these sets (each its addresses) added under ids after the highest, and a new
    pending epoch = the newest epoch's sets followed by them."""
    if table.pending() is not None:
        raise TableError(f"epoch {table.epochs[-1].epoch} is still pending: finish it first (`compensator sets add --resume`)")
    if not table.epochs:
        raise TableError("the set table is empty (run `compensator sets init`)")
    if not added:
        raise TableError("no set to add")
    next_id = max(entry.id for entry in table.sets) + 1
    entries = tuple(SetEntry(next_id + n, addresses) for n, addresses in enumerate(added))
    newest = table.epochs[-1]
    epoch = Epoch(newest.epoch + 1, newest.sets + tuple(entry.id for entry in entries), EpochState.PENDING)
    return validate(SetTable(sets=table.sets + entries, epochs=(*table.epochs, epoch))), epoch


def readdressed(table: SetTable, set_id: int, addresses: tuple[str, ...]) -> SetTable:
    """The table with set `set_id` at `addresses`, which keep a majority of its addresses before:
    a node replaced (or added, or removed) at a time, as Raft changes membership. Nothing on a node
    says which set it is, so a list that kept no majority could name another set's nodes, and the
    routers would send this set's keys there; moving a set is so many replacements, one at a time."""
    before = table.addresses().get(set_id)
    if before is None:
        raise TableError(f"the set table has no set {set_id} (sets {','.join(map(str, sorted(table.addresses())))})")
    kept = len(set(before) & set(addresses))
    if kept <= len(before) // 2:
        raise TableError(f"set {set_id}'s new addresses keep {kept} of its {len(before)} ({','.join(before)}): keep a"
                         " majority, replacing one node at a time (docs/runbook.md)")  # fmt: skip
    if tuple(addresses) == before:
        raise TableError(f"set {set_id} is already at {','.join(before)}")
    sets = tuple(SetEntry(entry.id, tuple(addresses)) if entry.id == set_id else entry for entry in table.sets)
    return validate(msgspec.structs.replace(table, sets=sets))


def activated(table: SetTable, epoch_number: int) -> SetTable:
    epochs = tuple(
        msgspec.structs.replace(epoch, state=EpochState.ACTIVE) if epoch.epoch == epoch_number else epoch
        for epoch in table.epochs
    )
    return validate(msgspec.structs.replace(table, epochs=epochs))


def encode(table: SetTable) -> bytes:
    return msgspec.json.encode(validate(table))


def decode(body: bytes) -> SetTable:
    try:
        return validate(msgspec.json.decode(body, type=SetTable))
    except msgspec.DecodeError as error:  # ValidationError is one
        raise TableError(f"the set table does not decode: {error}") from None
