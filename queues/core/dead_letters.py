"""The dead-letter tier: which dead letters a filter matches, in (dead_ms, id) order, and its summary.

Dead letters are indexed by group, (kind, error class, currency, has an integer amount), each
group in (dead_ms, id) order with the amount and attempts beside the key, and each group keeps
its count and total as letters enter and leave it (queues.core.messages). So:
  * a page, or a redrive's filter, merges the matching groups' scans from the cursor on: O(groups
    + page), and only a ref key filter reads the rows it passes;
  * a summary whose filter names only kind, error class and currency is a read of the groups'
    aggregates and one key per group for the oldest: a million dead letters answer in
    microseconds, on the apply thread, without holding applies;
  * one that adds an amount range reads the groups' amount buckets (queues.core.dead_amounts):
    the buckets inside the range from their aggregates, the two holding its bounds letter by
    letter;
  * a summary with a time, attempts or ref key bound scans the matching groups.

Must never: read a clock, or scan a group the filter excludes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import msgspec

from queues.core import dead_amounts, keys, messages
from queues.core.port import KvRead, KvWrite
from queues.core.records import DeadEntry, sum_of
from queues.model import DeadLetterFilter, DeadLetterSummary


def amount_index_current(view: KvRead) -> bool:
    """Whether the amount index holds as many letters as the tier's groups with amounts: false on a
    store written before the index existed (or a snapshot of one), which `rebuild_amount_index`
    mends."""
    expected = sum(group.count for (_, _, _, has_amount), group in messages.dead_groups(view) if has_amount)
    return dead_amounts.letters(view) == expected


def rebuild_amount_index(tx: KvWrite) -> None:
    dead_amounts.rebuild(tx, [group.group for (_, _, _, has_amount), group in messages.dead_groups(tx) if has_amount])


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
    `without_amount`. From the aggregates when the filter allows, else by a scan."""
    if _aggregated(selected):
        return _from_groups(view, selected)
    if _amount_aggregated(selected):
        return _from_buckets(view, selected)
    return scanned_summary(view, selected)


def _amount_aggregated(selected: DeadLetterFilter) -> bool:
    """The filter names an amount range and otherwise nothing a group's aggregate does not answer."""
    return _money_bounded(selected) and _aggregated(
        msgspec.structs.replace(selected, amount_min_minor=None, amount_max_minor=None)
    )


class _Tally:
    def __init__(self) -> None:
        self.count = self.without_amount = 0
        self.by_currency: dict[str, tuple[int, int]] = {}
        self.oldest: tuple[int, int] | None = None

    def add(self, currency: str | None, count: int, total: int | None, oldest: tuple[int, int] | None) -> None:
        self.count += count
        if total is not None and currency is not None:
            matched, summed = self.by_currency.get(currency, (0, 0))
            self.by_currency[currency] = (matched + count, summed + total)
        else:
            self.without_amount += count
        if oldest is not None and (self.oldest is None or oldest < self.oldest):
            self.oldest = oldest

    def summary(self) -> DeadLetterSummary:
        oldest = self.oldest
        return DeadLetterSummary(
            count=self.count, by_currency=tuple((c, n, t) for c, (n, t) in sorted(self.by_currency.items())),
            without_amount=self.without_amount, oldest_dead_ms=None if oldest is None else oldest[0],
            oldest_id=None if oldest is None else oldest[1],
        )  # fmt: skip


def _from_groups(view: KvRead, selected: DeadLetterFilter) -> DeadLetterSummary:
    """The groups' aggregates, and one key per group for the oldest."""
    tally = _Tally()
    for name, group in messages.dead_groups(view):
        if not group.count or not _group_selected(selected, name):
            continue
        _, _, currency, has_amount = name
        oldest = None
        for key, _ in messages.dead_in_group(view, group.group, None):
            oldest = keys.pair_of(key)
            break
        tally.add(currency, group.count, sum_of(group.total) if has_amount else None, oldest)
    return tally.summary()


def _from_buckets(view: KvRead, selected: DeadLetterFilter) -> DeadLetterSummary:
    """The amount buckets inside the range whole, the two at its bounds letter by letter."""
    low = dead_amounts.INT64_MIN if selected.amount_min_minor is None else selected.amount_min_minor
    high = dead_amounts.INT64_MAX if selected.amount_max_minor is None else selected.amount_max_minor
    tally = _Tally()
    for name, group in messages.dead_groups(view):
        if not group.count or not _group_selected(selected, name):
            continue
        count, total, oldest = dead_amounts.in_range(view, group.group, low, high)
        if count:
            tally.add(name[2], count, total, oldest)
    return tally.summary()


def scanned_summary(view: KvRead, selected: DeadLetterFilter) -> DeadLetterSummary:
    """The summary by a scan of every matching letter: any filter, O(the selected groups' letters)."""
    tally = _Tally()
    for dead_ms, message_id, entry, (_, _, currency, _) in scan(view, selected):
        tally.add(currency, 1, entry.amount, (dead_ms, message_id))
    return tally.summary()
