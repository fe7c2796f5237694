"""Which publisher of a set is active, and where it got to: one settings document in the store.

The document ``kafka_publisher/<events topic>`` holds ``{"v": 1, "holder", "cursor", "lease_ms"}``:
the active publisher's name, the last event sequence number every record up to which the broker
acknowledged, and how long the holder's claim lasts without renewal. It lives in the store because
the store is already the one replicated, majority-acknowledged place every process reaches, and
the cursor must survive whatever the store survives.

The claim is judged by the store's clock: a claim is live while the store's `now_ms` is within
`lease_ms` of the document's `updated_ms` (the store leader's time when the write applied), so
publishers' clocks never have to agree. The holder itself counts its lease from *before* it sent
the write, on its own monotonic clock, so it gives up no later than anyone else may take over.

Every write is a compare-and-set on the namespace's version as the writer read it (documents'
`expected_version`): a standby takes over only the claim it saw expired, and a holder renews only
the claim it saw it still held. Of two standbys that find the claim expired, one write lands and
the other's is refused (CONFLICT), so it reads again and finds the claim live. A holder paused
between its read and its renewal finds its write refused once another took over, and stands
down. The only overlap left is a holder whose whole process stalled past its own lease (a slow
round alone does not: the publisher renews while a round runs), and it stops at its next renewal:
that only publishes some events twice, which consumers drop by sequence number; it never
loses one, because a cursor is only ever written by a publisher that had every event up to it
acknowledged, starting from a cursor with the same property (docs/kafka.md).

Every write is an event in the store (document_put): a publisher renews every third of its lease,
never per batch, so its own bookkeeping cannot feed itself.

Must never: write a cursor past what the broker acknowledged, or renew a claim another holder took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from queues import Code, QueueClient

NAMESPACE: Final = "kafka_publisher"
DOCUMENT_VERSION: Final = 1


class LeaseBody(msgspec.Struct, frozen=True, kw_only=True):
    v: int = DOCUMENT_VERSION
    holder: str | None
    cursor: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Claim:
    """The document as read, with the store's time of the read."""

    body: LeaseBody
    updated_ms: int
    now_ms: int

    @property
    def live(self) -> bool:
        return self.body.holder is not None and self.now_ms - self.updated_ms < self.body.lease_ms


WRITE_TRIES: Final = 3
"""Compare-and-set attempts before giving up for this round: a refusal means the namespace moved
since the read, which is another publisher's claim (read again: it decides) or, rarely, another
topic's document in the same namespace (try again)."""


class PublisherLease:
    def __init__(
        self, queue: QueueClient, *, name: str, holder: str, lease_ms: int,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        assert lease_ms > 0
        self._queue = queue
        self._name = name
        self.holder = holder
        self._lease_ms = lease_ms
        self._clock_s = clock_s
        self._valid_until_s = float("-inf")
        """Invariant: before this (own clock) no other publisher can have taken over."""

    @property
    def valid(self) -> bool:
        return self._clock_s() < self._valid_until_s

    async def acquire(self) -> int | None:
        """The cursor to resume from if this publisher now holds the claim, else None."""
        for _ in range(WRITE_TRIES):
            claim, version = await self._read()
            if claim is not None and claim.live and claim.body.holder != self.holder:
                return None
            cursor = 0 if claim is None else claim.body.cursor
            started_s = self._clock_s()
            if await self._write(self.holder, cursor, version):
                self._valid_until_s = started_s + self._lease_ms / 1000
                return cursor
        return None

    async def renew(self, cursor: int) -> bool:
        """Extend the claim and save the cursor; False if the claim was lost (this publisher must
        stop publishing: another may have taken over)."""
        for _ in range(WRITE_TRIES):
            if not self.valid:
                return False
            claim, version = await self._read()
            if claim is None or claim.body.holder != self.holder:
                break
            started_s = self._clock_s()
            if await self._write(self.holder, cursor, version):
                self._valid_until_s = started_s + self._lease_ms / 1000
                return True
        self._valid_until_s = float("-inf")
        return False

    async def release(self, cursor: int) -> None:
        """Save the cursor and free the claim at once, so a standby takes over without waiting."""
        for _ in range(WRITE_TRIES):
            if not self.valid:
                break
            claim, version = await self._read()
            if claim is None or claim.body.holder != self.holder or await self._write(None, cursor, version):
                break
        self._valid_until_s = float("-inf")

    def drop(self) -> None:
        self._valid_until_s = float("-inf")

    async def _read(self) -> tuple[Claim | None, int]:
        """The claim (None if never written) and the namespace's version it was read at."""
        read = await self._queue.documents(NAMESPACE)
        for document in read.value.documents:
            if document.name == self._name:
                body = msgspec.json.decode(document.body, type=LeaseBody)
                return Claim(body, document.updated_ms, read.now_ms), read.value.version
        return None, read.value.version

    async def _write(self, holder: str | None, cursor: int, version: int) -> bool:
        """False when the namespace moved on since `version` was read (nothing written)."""
        body = msgspec.json.encode(LeaseBody(holder=holder, cursor=cursor, lease_ms=self._lease_ms))
        result = await self._queue.put_document(NAMESPACE, self._name, body, actor="events-publish",
                                                reason="publisher lease and cursor", expected_version=version)  # fmt: skip
        if result.code is Code.CONFLICT:
            return False
        if result.code is not Code.OK:
            raise LeaseError(f"the store refused the publisher's document: {result.code.name}")
        return True


class LeaseError(Exception):
    """The store refused the lease document (a programmer or capacity error, not a race)."""
