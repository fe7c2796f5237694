"""Four eyes: which review actions need a second person, decided at the edge from configuration.

The store enforces what it can decide alone (the approver is not the proposer, the proposal has
not expired: queues/review.py); what needs a proposal at all is policy, configured per
deployment: money-moving kinds at or above an amount, and any action on more requests than a
bulk count. Also the discard reason codes and the diff an edit shows.

Must never: talk to the store, or read the configuration (the composition root builds `FourEyes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from queues import MessageView

DISCARD_REASON_CODES: Final = (
    "duplicate", "paid_manually", "cancelled_by_customer", "invalid_request", "obsolete", "other",
)  # fmt: skip
"""Why finance discards a request: a closed list, so reports can count them; the comment says more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FourEyes:
    money_moving_kinds: frozenset[str] = frozenset({"transfer"})
    amount_threshold_minor: int = 0
    """An action on a money-moving request of at least this amount needs approval (0: every amount)."""
    bulk_count_max: int = 10
    """An action on more requests than this needs approval, whatever their kind."""
    proposal_ttl_ms: int = 24 * 3600 * 1000
    discard_reason_codes: tuple[str, ...] = DISCARD_REASON_CODES

    def needs_approval(self, targets: Sequence[MessageView], extra_payloads: Iterable[bytes] = ()) -> str | None:
        """Why this action needs a second person, or None. `extra_payloads`: an edit's new payload,
        whose amount counts as much as the original's."""
        bulk = self.bulk_reason(len(targets))
        if bulk is not None:
            return bulk
        extras = list(extra_payloads)
        for view in targets:
            if view.kind not in self.money_moving_kinds:
                continue
            amounts = [amount_minor(payload) for payload in (current_payload(view), *extras)]
            if self.amount_threshold_minor == 0 or any(a is None or a >= self.amount_threshold_minor for a in amounts):
                return f"{view.kind} moves money" + (
                    f" (at least {self.amount_threshold_minor} minor units)" if self.amount_threshold_minor else ""
                )
        return None


    def bulk_reason(self, count: int) -> str | None:
        """Why an action on `count` requests needs a second person whatever they are, or None."""
        return f"it acts on {count} requests, more than {self.bulk_count_max}" if count > self.bulk_count_max else None

    def described(self) -> str:
        """To what four eyes apply, in one phrase for a page ("a redrive of ..."): "more than 10
        requests or of any transfer"."""
        kinds = " or ".join(sorted(self.money_moving_kinds))
        money = "" if not kinds else (
            f" or of any {kinds}" if self.amount_threshold_minor == 0
            else f" or of a {kinds} of at least {self.amount_threshold_minor} minor units"
        )  # fmt: skip
        return f"more than {self.bulk_count_max} requests{money}"


def current_payload(view: MessageView) -> bytes:
    return view.edited_payload if view.edited_payload is not None else view.payload


def amount_minor(payload: bytes) -> int | None:
    """The payload's `amount_minor`, or None when it has none (counted as above any threshold)."""
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    amount = document.get("amount_minor") if isinstance(document, dict) else None
    return amount if isinstance(amount, int) and not isinstance(amount, bool) else None


def diff(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Field -> {"before", "after"} for every field that differs, nested objects as dotted paths."""
    changes: dict[str, dict[str, Any]] = {}
    for name in sorted(set(before) | set(after)):
        path = f"{prefix}{name}"
        old, new = before.get(name), after.get(name)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changes.update(diff(old, new, path + "."))
        elif old != new or (name in before) != (name in after):
            changes[path] = {"before": old, "after": new}
    return changes
