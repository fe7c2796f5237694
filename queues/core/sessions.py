"""Exactly-once client sessions (Raft dissertation 6.3), as replicated state.

A client sends each command on a lane (client_id) with a sequence number, and retries with the
same one: a command whose (client_id, seq) is the session's last is answered from the session,
not applied again; an older one is refused (SESSION_RESULT_STALE: its client already got or gave
up on that answer). Enqueues travel without a lane (client id 0): their idempotency key makes
them exactly-once.

A Lease's session keeps its (message id, token) pairs, not its payloads: a retried Lease gets back
the grants that are still its live leases (payloads read again), never a second grant; keeping up
to 8 MiB of payloads per lease on every replica cost more than the lease.

Sessions are evicted oldest first past SESSIONS_MAX, on every SESSION_EVICT_EVERY-th log index:
deterministic on every replica, off the hot path.

Owns: SESSIONS (client id -> seq, stored result, index last touched) and SESSIONS_TOUCHED (that
index, client id), by which eviction finds the oldest. Must never: read a clock.
"""

from __future__ import annotations

from typing import Final

import msgspec

from queues.core import keys
from queues.core.port import KvRead, KvWrite, Table
from queues.core.records import SessionRow, encode, session_decoder

SESSION_RESULT_STALE: Final = b"\x00stale-session"
"""Answered to a command whose seq is older than its session's last applied seq."""
SESSIONS_MAX: Final = 100_000
SESSION_EVICT_EVERY: Final = 1024
LEASE_SESSION: Final = b"\x00lease-session"


class LeaseSession(msgspec.Struct, frozen=True, array_like=True):
    expired: int
    grants: tuple[tuple[int, int], ...]


lease_session_encoder: Final = msgspec.msgpack.Encoder()
lease_session_decoder: Final = msgspec.msgpack.Decoder(LeaseSession)


def load(view: KvRead, client_id: int) -> SessionRow | None:
    stored = view.get(Table.SESSIONS, keys.u64(client_id))
    return None if stored is None else session_decoder.decode(stored)


def store(tx: KvWrite, client_id: int, seq: int, result: bytes, index: int, before: SessionRow | None) -> None:
    if before is not None:
        tx.delete(Table.SESSIONS_TOUCHED, keys.pair(before.touched_index, client_id))
    tx.put(Table.SESSIONS, keys.u64(client_id), encode(SessionRow(seq, result, index)))
    tx.put(Table.SESSIONS_TOUCHED, keys.pair(index, client_id), b"")


def evict(tx: KvWrite) -> None:
    """Past SESSIONS_MAX, forget the sessions touched longest ago (a client idle that long starts anew)."""
    excess = tx.count(Table.SESSIONS) - SESSIONS_MAX
    if excess <= 0:
        return
    doomed = []
    for key, _ in tx.scan(Table.SESSIONS_TOUCHED):
        doomed.append(key)
        if len(doomed) == excess:
            break
    for key in doomed:
        tx.delete(Table.SESSIONS_TOUCHED, key)
        tx.delete(Table.SESSIONS, keys.u64(keys.pair_of(key)[1]))
