"""What the ledger needs that the events do not carry, read from the store's messages.

The enqueued event names the request (kind, keys, due time) but not its payload: the queue keeps
payloads opaque and out of its event log (an event log of 256 KiB payloads would be the message
store twice). So the projector reads the amount and currency from the message itself, once per
batch for all the batch's new and edited requests, and the downstream's HTTP status of a failed
attempt from the attempt's error text, where the worker writes it as ``[HTTP 503]``.

A message stays in the store at least as long as its events when the message retention is at
least the event retention (the default: both 7 days), so a message the batch needs is found
unless the projector fell that far behind; `rows.fold` then stops with `ProjectionError`.

Must never: guess a fact. A payload that is not a valid request of its kind has no amount (the
ledger says so with NULL, and the metric counts it); a missing message is an error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Final

import pydantic

from ledger.kinds import Kind, Money, decode_payload, money_of
from queues import QueueClient
from queues.model import MessageView
from queues.query_codec import IDS_PER_QUERY_MAX
from services.projector.rows import MessageFacts

log = logging.getLogger(__name__)

_STATUS: Final = re.compile(r"\bHTTP ([1-5][0-9]{2})\b")
"""How services/worker/runner.py puts the downstream's status into a failure's text."""


class FactsReader:
    def __init__(self, queue: QueueClient) -> None:
        self._queue = queue
        self.unreadable_payloads = 0
        """Requests whose payload was not a valid request of their kind (recorded without an
        amount), each counted once: a message is read again by every batch that touches it."""
        self._unreadable: set[tuple[int, bytes]] = set()

    async def read(self, wanted: Mapping[int, bool], *, applied_index: int | None = None) -> dict[int, MessageFacts]:
        """Facts of the messages still in the store (a purged one is simply absent); `wanted` maps
        each id to whether its amounts are needed (rows.facts_needed). They must be at least as
        new as the events they complete: read linearizably, or, given the applied index the
        events' read reflected, from the node the client talks to (no ReadIndex round), and again
        linearizably when that node had not applied as far."""
        found: dict[int, MessageFacts] = {}
        message_ids = list(wanted)
        for start in range(0, len(message_ids), IDS_PER_QUERY_MAX):
            chunk = message_ids[start : start + IDS_PER_QUERY_MAX]
            read = await self._queue.get_many(chunk, with_history=True, stale_ok=applied_index is not None)
            if applied_index is not None and read.applied_index < applied_index:
                read = await self._queue.get_many(chunk, with_history=True)
            for view in read.value:
                found[view.message_id] = self.facts_of(view, money=wanted[view.message_id])
        return found

    def facts_of(self, view: MessageView, *, money: bool) -> MessageFacts:
        statuses: dict[int, int] = {}
        for attempt in view.history:
            match = _STATUS.search(attempt.error_text or "") if attempt.outcome == "failed" else None
            if match is not None:
                statuses[attempt.attempt] = int(match[1])
        if not money:
            return MessageFacts(money=None, edited_money=None, statuses=statuses)
        edited = None if view.edited_payload is None else self._money(view, view.edited_payload)
        return MessageFacts(money=self._money(view, view.payload), edited_money=edited, statuses=statuses)

    def _money(self, view: MessageView, payload: bytes) -> Money | None:
        try:
            kind = Kind(view.kind)
        except ValueError:
            return None  # a kind the ledger has no schema for carries no amount it could know
        try:
            return money_of(decode_payload(kind, payload))
        except pydantic.ValidationError:
            if (view.message_id, payload) not in self._unreadable:  # only invalid payloads are kept: few
                self._unreadable.add((view.message_id, payload))
                self.unreadable_payloads += 1
                log.warning("message %d: its payload is not a valid %s; recorded without an amount", view.message_id, kind)
            return None
