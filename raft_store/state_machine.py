"""The contract between the replicated log and whatever it replicates.

The node hands committed commands to a `StateMachine` in batches. The machine, not the node,
persists its applied index together with its own state (same transaction), so a restart replays
only the log tail after that index, and exactly-once client sessions (Raft dissertation 6.3) are
part of the replicated state: a retried command with a (client_id, seq) already applied returns
the stored result instead of applying twice.

Apply must be deterministic: no clock (use `now_ms`, stamped by the leader into the log entry),
no randomness, no iteration over unordered sets, no I/O whose result can differ between replicas.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from raft_store.types import Entry, EntryKind

# A NORMAL log entry carries one batch of client commands, stamped with the leader's clock:
#   header: u64 now_ms, u32 count
#   per command: u64 client_id, u64 seq, u32 length, data
# One entry per batch keeps Raft's per-entry cost (one object, one CRC, one index) off the
# per-command hot path; this is the batching CMQ describes, done at the proposal hop.
_HEADER = struct.Struct(">QI")
_COMMAND = struct.Struct(">QQI")

BATCH_COMMANDS_MAX = 65_536


class Command(NamedTuple):
    """One client command of an entry. A NamedTuple, not a frozen dataclass: every replica builds
    one per command it applies, and a frozen dataclass's __init__ costs three times as much."""

    client_id: int
    seq: int
    data: bytes


class BatchFormatError(ValueError):
    """A NORMAL entry's bytes do not parse: the log is corrupt or written by a foreign program."""


def encode_batch(now_ms: int, commands: Sequence[tuple[int, int, bytes]]) -> bytes:
    """Frame (client_id, seq, data) triples into one entry payload."""
    if len(commands) > BATCH_COMMANDS_MAX:
        raise ValueError(f"batch of {len(commands)} commands exceeds {BATCH_COMMANDS_MAX}")
    parts = [_HEADER.pack(now_ms, len(commands))]
    pack = _COMMAND.pack
    for client_id, seq, data in commands:
        parts.append(pack(client_id, seq, len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_batch(payload: bytes) -> tuple[int, list[Command]]:
    if len(payload) < _HEADER.size:
        raise BatchFormatError("batch shorter than its header")
    now_ms, count = _HEADER.unpack_from(payload, 0)
    if count > BATCH_COMMANDS_MAX:
        raise BatchFormatError(f"batch claims {count} commands")
    offset = _HEADER.size
    commands: list[Command] = []
    unpack = _COMMAND.unpack_from
    size = _COMMAND.size
    view = memoryview(payload)
    for _ in range(count):
        if offset + size > len(payload):
            raise BatchFormatError("batch truncated inside a command header")
        client_id, seq, length = unpack(payload, offset)
        offset += size
        if offset + length > len(payload):
            raise BatchFormatError("batch truncated inside a command body")
        commands.append(Command(client_id, seq, bytes(view[offset : offset + length])))
        offset += length
    if offset != len(payload):
        raise BatchFormatError("trailing bytes after the last command")
    return now_ms, commands


def latest_stamp_ms(entries: Iterable[Entry]) -> int:
    """The greatest time a leader stamped in these entries (0 if none carries a batch): what a node
    taking the lead tells its log's clock about the entries it has not applied (`LogClock.logged`),
    as they all commit under it. Reads each batch's header only (a tail of thousands of entries
    costs well under a millisecond as the node takes the lead); an entry too short for the commands
    its header claims (one that would apply as a no-op, raft_store/node_ports.py) stamps nothing."""
    latest = 0
    header, command = _HEADER.size, _COMMAND.size
    for entry in entries:
        data = entry.data
        if entry.kind is EntryKind.NORMAL and len(data) >= header:
            now_ms, count = _HEADER.unpack_from(data, 0)
            if count <= BATCH_COMMANDS_MAX and len(data) >= header + count * command and now_ms > latest:
                latest = now_ms
    return int(latest)


@runtime_checkable
class CheckpointingMachine(Protocol):
    """A machine whose state is itself a durable store: the log is compacted by a checkpoint.

    The node then writes a full snapshot file only when a follower needs one, instead of copying
    the whole store at every compaction (a 10 GB queue store against a 64 MiB log)."""

    def checkpoint(self) -> int:
        """Return an applied index whose state is durable (0: this machine cannot; copy instead).

        The node compacts the log up to it, so everything up to that index must survive any crash.
        It may be older than the applied index: a machine may make its state durable in the
        background and answer its newest finished checkpoint (the queue's LMDB store does, so
        that no apply waits for an fsync); the log is then kept one checkpoint longer."""
        ...


class PinnedCopy(Protocol):
    """A state pinned for copying: `index` is exactly the applied index it reflects."""

    index: int

    def write(self, path: Path) -> int:
        """Write the pinned state to `path`; returns `index`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class CopyPinningMachine(Protocol):
    """A machine that can pin its state between applies and have it copied beside later applies."""

    def open_copy(self) -> PinnedCopy | None:
        """Pin the state now (called between applies); None when this store cannot."""
        ...


@runtime_checkable
class GroupCommittingMachine(Protocol):
    """A machine that may keep applied entries in an open store transaction across applies.

    The node commits it when the apply pipeline goes idle, so a quiet store is current on disk."""

    @property
    def uncommitted(self) -> bool:
        """Entries were applied since the store last committed."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """Drop what was applied since the last commit, after a storage failure: nothing may be
        committed on the way out, and the next start replays those entries from the log."""
        ...


@runtime_checkable
class ClockedMachine(Protocol):
    """A machine whose reads decide by time (due, ready, expired): they must read the log's clock.

    The node hands it a reader of its `LogClock` (log_clock.py) before anything else, and learns
    from it, at start and after a snapshot install, the time its applied state has reached (the
    entries behind it are not replayed, so their stamps are not seen again)."""

    def use_clock(self, read_ms: Callable[[], int]) -> None:
        """From now on, "now" in a read is `read_ms()` (thread-safe; called in the apply thread)."""
        ...

    def log_time_ms(self) -> int:
        """The greatest time the applied entries carried (0: none)."""
        ...


class StateMachine(Protocol):
    """What the node needs from a replicated state machine."""

    def applied_index(self) -> int:
        """The last log index whose commands are reflected in the state.

        After a restart this is the durable state's index; a machine that commits groups of
        entries (GroupCommittingMachine) also counts those applied since its last commit, which a
        crash would undo and the node would then replay from the log."""
        ...

    def apply_batch(self, index: int, now_ms: int, commands: Sequence[Command], *, respond: bool = True) -> list[bytes]:
        """Apply the commands of log entry `index` atomically, recording `index` as applied.

        Returns one result per command. A command whose (client_id, seq) was already applied
        returns the stored result of its first application.

        `respond=False`: no client waits for these results (a follower's apply, or a replay after
        a restart), so the machine may leave out what only the answer needs (a lease's payloads,
        or a result nobody will read: b""). The state, and what the session table keeps for
        retries, must be exactly the same."""
        ...

    def note_applied(self, index: int) -> None:
        """Record that entry `index` (a no-op or membership entry) is applied."""
        ...

    def write_snapshot(self, path: Path) -> int:
        """Write a consistent copy of the state to `path`; return the index it reflects."""
        ...

    def restore_snapshot(self, path: Path, index: int) -> None:
        """Replace the whole state by the snapshot at `path`, which reflects `index`."""
        ...

    def close(self) -> None: ...
