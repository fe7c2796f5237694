"""The dead-letter tier: which dead letters a filter matches, in (dead_ms, id) order, and its summary.

Dead letters are indexed by group, (kind, error class, currency, has an integer amount), each
group in (dead_ms, id) order with the amount and attempts beside the key, and each group keeps
its count and total as letters enter and leave it (queues.core.messages). So:
  * a page, or a redrive's filter, merges the matching groups' scans from the cursor on: O(groups
    + page), and only a ref key filter reads the rows it passes;
  * a summary whose filter names only kind, error class and currency is a read of the groups'
    aggregates and one key per group for the oldest: a million dead letters answer in
    microseconds, on the apply thread, without holding applies; a summary with a time, amount,
    attempts or ref key bound scans the matching groups.

Must never: read a clock, or scan a group the filter excludes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from queues.core import keys, messages
from queues.core.port import KvRead
from queues.core.records import DeadEntry
from queues.model import DeadLetterFilter, DeadLetterSummary


def _money_bounded(selected: DeadLetterFilter) -> bool:
    return selected.amount_min_minor is not None or selected.amount_max_minor is not None


def _group_selected(selected: DeadLetterFilter, name: messages.GroupName) -> bool:
    kind, error_class, currency, has_amount = name
    return (
        (selected.kind is None or kind == selected.kind)
        and (selected.error_class is None or error_class == selected.error_class)
        and (selected.currency is None or currency == selected.currency)
        and (has_amount or not _money_bounded(selected))
    )


def _aggregated(selected: DeadLetterFilter) -> bool:
    """The filter names nothing a group's aggregate does not answer."""
    return (
        selected.ref_key is None
        and selected.dead_from_ms is None
        and selected.dead_to_ms is None
        and selected.attempts_min is None
        and selected.attempts_max is None
        and not _money_bounded(selected)
    )


def _entry_selected(selected: DeadLetterFilter, entry: DeadEntry) -> bool:
    if selected.attempts_min is not None and entry.attempts < selected.attempts_min:
        return False
    if selected.attempts_max is not None and entry.attempts > selected.attempts_max:
        return False
    amount = entry.amount
    if selected.amount_min_minor is not None and (amount is None or amount < selected.amount_min_minor):
        return False
    return selected.amount_max_minor is None or (amount is not None and amount <= selected.amount_max_minor)


def scan(
    view: KvRead, selected: DeadLetterFilter, after: tuple[int, int] | None = None
) -> Iterator[tuple[int, int, DeadEntry, messages.GroupName]]:
    """(dead_ms, id, entry, group) of the dead letters matching the filter after (dead_ms, id)."""
    if selected.dead_from_ms is not None and (after is None or after < (selected.dead_from_ms, 0)):
        after = (selected.dead_from_ms, -1)
    streams = [
        _named(messages.dead_in_group(view, group.group, after), name)
        for name, group in messages.dead_groups(view)
        if group.count and _group_selected(selected, name)
    ]
    for key, entry, name in heapq.merge(*streams, key=lambda item: item[0]):
        dead_ms, message_id = keys.pair_of(key)
        if selected.dead_to_ms is not None and dead_ms >= selected.dead_to_ms:
            return
        if not _entry_selected(selected, entry):
            continue
        if selected.ref_key is not None:
            record = messages.load(view, message_id)
            if record is None or record.ref_key != selected.ref_key:
                continue
        yield dead_ms, message_id, entry, name


def _named(
    entries: Iterator[tuple[bytes, DeadEntry]], name: messages.GroupName
) -> Iterator[tuple[bytes, DeadEntry, messages.GroupName]]:
    for key, entry in entries:
        yield key, entry, name


def ids(view: KvRead, selected: DeadLetterFilter, *, limit: int, after: tuple[int, int] | None = None) -> list[int]:
    """Ids of dead letters matching the filter, ordered by (dead_ms, id): deterministic."""
    found: list[int] = []
    for _, message_id, _, _ in scan(view, selected, after):
        found.append(message_id)
        if len(found) == limit:
            break
    return found


def summary(view: KvRead, selected: DeadLetterFilter) -> DeadLetterSummary:
    """How many dead letters match, their amounts per currency and the oldest. A match counts
    under its currency when it has both an integer amount and a currency, else in
    `without_amount`."""
    count = without_amount = 0
    by_currency: dict[str, tuple[int, int]] = {}
    oldest: tuple[int, int] | None = None
    if _aggregated(selected):
        for name, group in messages.dead_groups(view):
            if not group.count or not _group_selected(selected, name):
                continue
            _, _, currency, has_amount = name
            count += group.count
            if has_amount and currency is not None:
                matched, total = by_currency.get(currency, (0, 0))
                by_currency[currency] = (matched + group.count, total + group.total)
            else:
                without_amount += group.count
            for key, _ in messages.dead_in_group(view, group.group, None):
                first = keys.pair_of(key)
                oldest = first if oldest is None else min(oldest, first)
                break
    else:
        for dead_ms, message_id, entry, (_, _, currency, _) in scan(view, selected):
            if oldest is None:
                oldest = (dead_ms, message_id)
            count += 1
            if entry.amount is not None and currency is not None:
                matched, total = by_currency.get(currency, (0, 0))
                by_currency[currency] = (matched + 1, total + entry.amount)
            else:
                without_amount += 1
    return DeadLetterSummary(
        count=count, by_currency=tuple((c, n, t) for c, (n, t) in sorted(by_currency.items())),
        without_amount=without_amount, oldest_dead_ms=None if oldest is None else oldest[0],
        oldest_id=None if oldest is None else oldest[1],
    )  # fmt: skip
