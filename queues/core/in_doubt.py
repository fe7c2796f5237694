"""A message's in-doubt deadline: until when, by the store's clock, a request that one of its
deliveries sent may still take effect downstream (docs/worker.md, "What each downstream
guarantees"). The rules fold each delivery's into the message's when the delivery ends:

- a worker that fails or hands back an attempt reports how long its requests stay in doubt, as a
  duration (`in_doubt_ms`) the store adds to its own clock, never past the lease's deadline; 0
  when every request it sent was answered (the deadline stays as it was);
- a delivery that reports nothing (its worker died, stalled, or does not track it) is in doubt
  until its lease's deadline: the one bound that survives a kill -9.

The message keeps the later of its deadline and the delivery's; the next grant carries what is
left of it (`Grant.in_doubt_ms`), and a reported deadline also holds the retry back.

Must never: read a clock (the time is the applying entry's), or move a deadline earlier.
"""

from __future__ import annotations


def until(*, lease_deadline_ms: int | None, now_ms: int, in_doubt_ms: int | None) -> int | None:
    """The delivery's deadline: what its worker said, capped at the lease's deadline (which is the
    answer when it said nothing); None when it said nothing it sent is in doubt."""
    if in_doubt_ms == 0:
        return None
    deadline = lease_deadline_ms if lease_deadline_ms is not None else now_ms
    return deadline if in_doubt_ms is None else min(deadline, now_ms + in_doubt_ms)


def fold(message_ms: int | None, delivery_ms: int | None) -> int | None:
    """The message's deadline after a delivery's: the later of the two (None leaves it as it was)."""
    if delivery_ms is None:
        return message_ms
    return delivery_ms if message_ms is None else max(message_ms, delivery_ms)
