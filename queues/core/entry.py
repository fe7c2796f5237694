"""One log entry's application: its time, its counters, and the events and audit entries it writes.

Every command of an entry runs on one `Entry`: the entry's log index and time (the leader's stamp,
never earlier than the time of the entry before: a new leader whose clock is behind cannot make a
due time or a lease deadline come twice), the counters every command draws from (message ids,
fencing tokens, event sequence numbers), read once and written once per entry, and the net change
of messages per (kind, phase), added to the counts once at the end.

`Catalog` keeps what nearly every command consults and almost none changes (the kinds with their
policies, the paused kinds, the retentions in force), read once and kept until a command changes
it, an entry rolls back or the state is replaced.

Must never: read a clock, or touch anything but the port it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from delay.policy import RetryPolicy
from queues import codec
from queues.core import audit_chain, keys
from queues.core.config import QueueConfig
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import Meta, encode, int_decoder, meta_decoder
from queues.model import OPERATOR_EVENT_TYPES, EventType, EventValue, Phase

_OPERATOR_TYPES: Final = frozenset(t.value for t in OPERATOR_EVENT_TYPES)
_policy_decoder: Final = msgspec.msgpack.Decoder(RetryPolicy)
MIN_ROUTE_EPOCH: Final = b"min_route_epoch"
"""The SETTINGS row RouteFence writes (absent until a set is first fenced: old states need nothing)."""


def load_meta(view: KvRead) -> Meta:
    stored = view.get(Table.META, keys.STATE)
    return Meta() if stored is None else meta_decoder.decode(stored)


class Catalog:
    """Registered kinds, pauses and retentions, cached across entries (see the module docstring)."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self._kinds: dict[str, RetryPolicy] | None = None
        self._paused: frozenset[str] | None = None
        self._retention: tuple[int, int] | None = None
        self._route_epoch: int | None = None

    def forget(self) -> None:
        self._kinds = self._paused = self._retention = self._route_epoch = None

    def forget_route_epoch(self) -> None:
        self._route_epoch = None

    def min_route_epoch(self, view: KvRead) -> int:
        """The set's fence (RouteFence): new keys routed by an older epoch are refused. 0: never fenced."""
        if self._route_epoch is None:
            stored = view.get(Table.SETTINGS, MIN_ROUTE_EPOCH)
            self._route_epoch = 0 if stored is None else int_decoder.decode(stored)
        return self._route_epoch

    def forget_kinds(self) -> None:
        self._kinds = None

    def forget_pauses(self) -> None:
        self._paused = None

    def forget_retention(self) -> None:
        self._retention = None

    def kinds(self, view: KvRead) -> dict[str, RetryPolicy]:
        """Registered kinds and their policies, by name."""
        if self._kinds is None:
            self._kinds = {key.decode(): _policy_decoder.decode(value) for key, value in view.scan(Table.KINDS)}
        return self._kinds

    def paused(self, view: KvRead) -> frozenset[str]:
        if self._paused is None:
            self._paused = frozenset(key.split(b"\x00", 1)[0].decode() for key, _ in view.scan(Table.PAUSES))
        return self._paused

    def retention(self, view: KvRead) -> tuple[int, int]:
        """(tombstone retention, event retention) in force: SetRetention's values, else the config's."""
        if self._retention is None:
            self._retention = retention_in_force(view, self.config)
        return self._retention


def retention_in_force(view: KvRead, config: QueueConfig) -> tuple[int, int]:
    def setting(name: str, default: int) -> int:
        stored = view.get(Table.SETTINGS, name.encode())
        return default if stored is None else int_decoder.decode(stored)

    return setting("retention_ms", config.retention_ms), setting("event_retention_ms", config.event_retention_ms)


def holders(view: KvRead, kind: str) -> tuple[str, ...]:
    """Who holds `kind` paused, by name."""
    prefix = keys.kind_prefix(kind)
    return tuple(key[len(prefix) :].decode() for key, _ in view.scan(Table.PAUSES, prefix, keys.after(prefix)))


class Entry:
    """The context of one log entry's commands (see the module docstring)."""

    __slots__ = ("catalog", "config", "index", "meta", "moved", "now_ms", "responding", "tx")

    def __init__(self, tx: KvWrite, index: int, now_ms: int, catalog: Catalog, *, responding: bool) -> None:
        self.tx = tx
        self.index = index
        self.meta = load_meta(tx)
        self.now_ms = max(now_ms, self.meta.clock_ms)
        self.catalog = catalog
        self.config = catalog.config
        self.responding = responding
        """False: no client reads this entry's results (a follower's apply, a replay)."""
        self.moved: dict[tuple[str, int], int] = {}

    def move(self, kind: str, before: Phase | None, after: Phase | None) -> None:
        """One message of `kind` leaves phase `before` (None: new) for `after` (None: purged)."""
        moved = self.moved
        if before is not None:
            key = (kind, before._value_)  # the plain int: an enum member hashes in Python
            moved[key] = moved.get(key, 0) - 1
        if after is not None:
            key = (kind, after._value_)
            moved[key] = moved.get(key, 0) + 1

    def finish(self) -> None:
        """Write what the entry's commands counted: the phase counts and the counters."""
        tx = self.tx
        for (kind, phase), delta in sorted(self.moved.items()):
            if delta:
                key = keys.kind_prefix(kind) + bytes((phase,))
                stored = tx.get(Table.PHASE_COUNTS, key)
                count = delta + (0 if stored is None else int_decoder.decode(stored))
                if count:
                    tx.put(Table.PHASE_COUNTS, key, encode(count))
                else:
                    tx.delete(Table.PHASE_COUNTS, key)
        self.meta.applied_index = self.index
        self.meta.clock_ms = self.now_ms
        tx.put(Table.META, keys.STATE, encode(self.meta))

    # ---- events and audit entries ---------------------------------------------------------------
    def emit(self, type_: EventType, message_id: int, kind: str, data: dict[str, EventValue]) -> None:
        meta = self.meta
        seq = meta.next_event_seq
        meta.next_event_seq = seq + 1
        name: str = type_._value_  # the plain attribute: `.value` is a descriptor call per event
        # The EventRow layout as a plain tuple (array-like: the same bytes, without the object).
        row = (self.index, self.now_ms, name, message_id, kind, codec.encode_event_data(data))
        self.tx.put(Table.EVENTS, keys.u64(seq), encode(row), append=True)
        if name in _OPERATOR_TYPES:
            self.tx.put(Table.OPERATOR_EVENTS, keys.pair(message_id, seq), b"")

    def emit_audited(self, type_: EventType, message_id: int, kind: str, data: dict[str, EventValue]) -> None:
        """Emit an operator's event and write its audit entry, derived from the same data, in the
        same apply: every operator command goes through here, so none can act without a record."""
        self.emit(type_, message_id, kind, data)
        fields = audit_chain.audit_of_event(type_, message_id, kind, data)
        self.audit(
            actor=fields.actor, action=fields.action, target=fields.target, reason=fields.reason,
            before=fields.before, after=fields.after, message_ids=(message_id,) if message_id else (),
        )  # fmt: skip

    def audit(
        self, *, actor: str, action: str, target: str, reason: str, before: audit_chain.Detail,
        after: audit_chain.Detail, message_ids: Sequence[int] = (),
    ) -> int:  # fmt: skip
        """Write an audit entry for an action that is not one event (an edit, a proposal's decision)."""
        return audit_chain.append(
            self.tx, self.meta, log_index=self.index, ts_ms=self.now_ms, actor=actor, action=action, target=target,
            reason=reason, before=before, after=after, message_ids=message_ids,
        )  # fmt: skip
