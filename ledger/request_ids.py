"""Public request ids: ``{set}-{message id}``, e.g. ``1-42``.

The store numbers its messages densely from 1 within one Raft set. The public id carries the set,
so that a second set (requests routed by a hash of their idempotency key) is a configuration
change: a GET finds the set from the id, and two sets' message 42 never share an id.

Here, with the rest of the shared vocabulary, because the API answers with these ids, the projector
writes them into the compensation ledger, and the reconciliation and the benchmarks read them:
none of those may import another's modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_SHAPE: Final = re.compile(r"^([1-9][0-9]{0,4})-([1-9][0-9]{0,18})$")
MESSAGE_ID_MAX: Final = (1 << 63) - 1
NUMBER_MAX: Final = 1 << 62
"""The largest proposal or job number a route takes: the store's integers are 64-bit, so a number
of 2**64 or more is refused at the edge (a 422 naming it), never handed to the store to overflow."""
PUBLIC_ID_LENGTH_MAX: Final = 40
"""A public request id's longest text (``99999-9223372036854775807`` is 25): longer is not an id."""


@dataclass(frozen=True, slots=True)
class RequestId:
    set_id: int
    message_id: int

    def __str__(self) -> str:
        return f"{self.set_id}-{self.message_id}"

    @classmethod
    def parse(cls, text: str) -> RequestId | None:
        """None for anything that is not an id we could have issued (the caller answers 404)."""
        match = _SHAPE.match(text)
        if match is None or int(match[2]) > MESSAGE_ID_MAX:
            return None
        return cls(int(match[1]), int(match[2]))
