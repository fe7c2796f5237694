"""What a person approves: the money an action will pay, beside what was there before.

Four eyes are only worth the second person if they see the figure that will move. An approver who
read "60.00 USD" on an edit that pays 99,999.00 USD approved something other than what was paid.
So every place that asks someone to approve or confirm shows, from here: for each target, the
amount it *will pay* when the action is done (an edit's new payload; a redrive's current one;
nothing for a discard), the amount before where the action changes it, and the totals per
currency of what will be paid; amounts are written in their currency's major units (ISO 4217
digits, ledger/currencies.py), never as minor units a reader must divide in their head.

Must never: read the store, or format an amount through a float.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from api.review_policy import current_payload
from ledger.currencies import MINOR_UNIT_DIGITS, major_units
from ledger.kinds import Money
from queues import Discard, EditRedrive, MessageView, Redrive, RedriveJob, ReviewAction

AMOUNT_FIELDS: Final = ("amount_minor", "currency")
MONEY_FIELD: Final = "amount"
"""The one row a diff shows for a change of `amount_minor` or `currency`: the money, before and after."""


def display(amount_minor: int | None, currency: str | None) -> str:
    """``123456, "USD"`` -> ``"1,234.56 USD"``; an unknown currency shows its minor units as they are."""
    if amount_minor is None:
        return "—"
    if currency is None or currency not in MINOR_UNIT_DIGITS:
        return f"{amount_minor:,} minor units {currency or ''}".rstrip()
    whole, dot, fraction = major_units(amount_minor, currency).partition(".")
    sign = "-" if whole.startswith("-") else ""
    return f"{sign}{int(whole.lstrip('-')):,}{dot}{fraction} {currency}"


def money_of_document(document: Mapping[str, Any] | None) -> Money | None:
    """A payload's amount at stake: its `amount_minor` (a positive integer) and `currency` (an
    active ISO 4217 code); None for a kind without one. Read from the fields, not through the
    kind's model: a masked payload (its accounts `****1234`) still says how much it pays."""
    if document is None:
        return None
    amount, currency = document.get("amount_minor"), document.get("currency")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return None
    if not isinstance(currency, str) or currency not in MINOR_UNIT_DIGITS:
        return None
    return Money(amount, currency)


def money_of_payload(payload: bytes | None) -> Money | None:
    if payload is None:
        return None
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    return money_of_document(document) if isinstance(document, dict) else None


def money_document(money: Money | None) -> dict[str, Any] | None:
    """Money as the JSON API answers it: minor units (exact), the currency, and the amount in
    major units as a decimal string (``"99999.00"``), what a person reads."""
    if money is None:
        return None
    return {"amount_minor": money.amount_minor, "currency": money.currency,
            "amount": major_units(money.amount_minor, money.currency)}  # fmt: skip


Totals = tuple[tuple[str, int, int], ...]
"""(currency, count, amount_minor total) per currency, sorted."""


def totals(amounts: Iterable[Money | None]) -> tuple[Totals, int]:
    """The totals per currency of these amounts, and how many have none."""
    by_currency: dict[str, tuple[int, int]] = {}
    without = 0
    for money in amounts:
        if money is None:
            without += 1
            continue
        count, total = by_currency.get(money.currency, (0, 0))
        by_currency[money.currency] = (count + 1, total + money.amount_minor)
    return tuple((c, n, a) for c, (n, a) in sorted(by_currency.items())), without


def totals_document(found: Totals) -> list[dict[str, Any]]:
    return [{"currency": c, "count": n, "amount_minor": a, "amount": major_units(a, c)} for c, n, a in found]


@dataclass(frozen=True, slots=True)
class Payment:
    """One target of an action, as its approver must see it."""

    message_id: int
    kind: str
    pays: Money | None
    """What it will pay once the action is done (None: nothing, or a kind without an amount)."""
    before: Money | None
    """What it held before, where the action changes that (an edit's old amount, a discard's)."""

    @property
    def changed(self) -> bool:
        return self.before is not None and self.before != self.pays


@dataclass(frozen=True, slots=True)
class WhatIsPaid:
    """What approving (or confirming) an action pays, target by target and per currency."""

    action: str
    """redrive, edit_redrive, discard or redrive_job."""
    payments: tuple[Payment, ...]
    totals: Totals
    """Of what will be paid."""
    without_amount: int
    """Targets that will pay nothing measurable (a callback, a discard)."""
    before_totals: Totals | None
    """Of what the targets held before, when the action changes any amount (None: the same)."""

    @property
    def pays_nothing(self) -> bool:
        return self.action == "discard"


def what_is_paid(action: ReviewAction, targets: Sequence[MessageView]) -> WhatIsPaid:
    """For an action and its targets as read now: what each target will pay once it is done."""
    payments: list[Payment] = []
    for view in targets:
        current = money_of_payload(current_payload(view))
        if isinstance(action, EditRedrive) and view.message_id == action.message_id:
            payments.append(Payment(view.message_id, view.kind, money_of_payload(action.payload), current))
        elif isinstance(action, Discard):
            payments.append(Payment(view.message_id, view.kind, None, current))
        else:
            payments.append(Payment(view.message_id, view.kind, current, None))
    paid, without = totals(p.pays for p in payments)
    changed = any(p.changed for p in payments)
    before = totals(p.before if p.before is not None else p.pays for p in payments)[0] if changed else None
    return WhatIsPaid(action=_name(action), payments=tuple(payments), totals=paid, without_amount=without,
                      before_totals=before)  # fmt: skip


def _name(action: ReviewAction) -> str:
    if isinstance(action, EditRedrive):
        return "edit_redrive"
    if isinstance(action, Discard):
        return "discard"
    if isinstance(action, RedriveJob):
        return "redrive_job"
    assert isinstance(action, Redrive)
    return "redrive"


def paid_document(paid: WhatIsPaid, public_id: Any, items_max: int) -> dict[str, Any]:
    """`pays` of a proposal as the JSON API answers it (the first `items_max` targets one by one)."""
    return {
        "totals": totals_document(paid.totals), "without_amount": paid.without_amount,
        "before_totals": None if paid.before_totals is None else totals_document(paid.before_totals),
        "items": [{"id": public_id(p.message_id), "amount": money_document(p.pays),
                   "before": money_document(p.before) if p.changed else None} for p in paid.payments[:items_max]],
        "item_count": len(paid.payments),
    }  # fmt: skip


def diff_rows(before: Mapping[str, Any], after: Mapping[str, Any], changes: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An edit's diff (`review_policy.diff`) as rows to show: `{"field", "before", "after", "money"}`.
    A change of `amount_minor` or `currency` is one row, `amount`, whose values are the money
    before and after as text (``60.00 USD`` -> ``99,999.00 USD``); other rows keep their values."""
    rows: list[dict[str, Any]] = []
    old, new = money_of_document(before), money_of_document(after)
    money_changed = any(name in changes for name in AMOUNT_FIELDS) and (old is not None or new is not None)
    if money_changed:
        rows.append({"field": MONEY_FIELD, "money": True,
                     "before": display(old.amount_minor, old.currency) if old else None,
                     "after": display(new.amount_minor, new.currency) if new else None})  # fmt: skip
    for field, change in changes.items():
        if money_changed and field in AMOUNT_FIELDS:
            continue
        rows.append({"field": field, "money": False, "before": change["before"], "after": change["after"]})
    return rows
