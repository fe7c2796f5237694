"""The end-to-end benchmark's figures, from what the store and the ledgers hold at the end.

Pure: the store's message views (with their attempt history), the acknowledged requests, and the
ledger rows go in; plain dictionaries for the JSON come out. Times are the store's: `created_ms`
is stamped by the leader when the enqueue is applied, `terminal_ms` when the ack is, so a time to
done is intake to ack on one clock.

Must never: do I/O or read a clock.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from bench.e2e_load import Planned
from handlers.contract import UNKNOWN_OUTCOME
from ledger.kinds import Kind
from queues import MessageView

DONE: Final = "done"
Id = TypeVar("Id")
"""A request's id: the API's (set and message id) for the store, a job id for the peers."""
TERMINAL: Final = frozenset({"done", "dead", "discarded"})


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds to 0.1, as every figure prints them."""
    return None if seconds is None else round(seconds * 1000, 1)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest rank: the smallest value with at least `fraction` of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def spread_ms(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50_ms": percentile(values, 0.5), "p90_ms": percentile(values, 0.9), "p99_ms": percentile(values, 0.99),
            "max_ms": max(values) if values else None, "count": len(values)}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    """Milliseconds on the store's clock, one list entry per done request."""

    first_try: list[float]
    """Intake to ack, for requests done at their first attempt."""
    retried: list[float]
    """Intake to ack, for requests done after one or more failed attempts."""
    waited: list[float]
    """Intake to the first lease, every done request: time in the queue before a worker took it."""
    handled: list[float]
    """The last lease to the ack, every done request: the attempt, the settle, the ack's commit."""


def timings(views: Iterable[MessageView]) -> Timings:
    first_try: list[float] = []
    retried: list[float] = []
    waited: list[float] = []
    handled: list[float] = []
    for view in views:
        if view.state.value != DONE or view.terminal_ms is None:
            continue
        total = float(view.terminal_ms - view.created_ms)
        (first_try if view.attempts == 1 else retried).append(total)
        if view.history:
            attempts = sorted(view.history, key=lambda a: a.attempt)
            waited.append(float(attempts[0].leased_ms - view.created_ms))
            handled.append(float(view.terminal_ms - attempts[-1].leased_ms))
    return Timings(first_try=first_try, retried=retried, waited=waited, handled=handled)


def parked(view: MessageView) -> bool:
    """A transfer whose outcome stayed unknown where the payment system guarantees nothing: a dead
    letter of class unknown_outcome is finance's to decide (redrive or discard), not lost."""
    return view.state.value == "dead" and view.last_error_class == UNKNOWN_OUTCOME


def outcomes(acknowledged: Mapping[Id, Planned], views: Mapping[Id, MessageView]) -> dict[str, Any]:
    """Final states, what was lost (not done and not parked for finance), how many attempts it
    took, by kind too."""
    states = Counter(views[i].state.value if i in views else "missing" for i in acknowledged)
    parked_ids = [i for i in acknowledged if i in views and parked(views[i])]
    pending = sum(n for state, n in states.items() if state not in TERMINAL and state != "missing")
    done = [views[i] for i in acknowledged if i in views and views[i].state.value == DONE]
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in Kind:
        ids = [i for i, p in acknowledged.items() if p.kind is kind]
        kind_done = [views[i] for i in ids if i in views and views[i].state.value == DONE]
        first = [float(v.terminal_ms - v.created_ms) for v in kind_done if v.attempts == 1 and v.terminal_ms]
        by_kind[kind.value] = {
            "acknowledged": len(ids), "done": len(kind_done),
            "first_attempt_failed": sum(1 for v in kind_done if v.attempts > 1),
            "time_to_done_first_try_p50_ms": percentile(first, 0.5),
            "time_to_done_first_try_p99_ms": percentile(first, 0.99),
        }  # fmt: skip
    attempts = [v.attempts for v in done]
    failures = Counter(
        f"{a.outcome}:{a.error_class}" for i in acknowledged if i in views for a in views[i].history
        if a.outcome not in (None, "succeeded")
    )  # fmt: skip
    return {
        "states": dict(sorted(states.items())),
        "lost": len(acknowledged) - states[DONE] - len(parked_ids),
        "parked_unknown_outcome": len(parked_ids),
        "pending_at_end": pending,
        "missing": states["missing"],
        "first_attempt_failed": sum(1 for a in attempts if a > 1),
        "first_attempt_failed_ratio": round(sum(1 for a in attempts if a > 1) / len(attempts), 4) if attempts else None,
        "attempts_per_done": round(sum(attempts) / len(attempts), 3) if attempts else None,
        "attempts_max_seen": max(attempts, default=0),
        "failed_attempts_by_class": dict(failures.most_common()),
        "by_kind": by_kind,
    }  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Ledgers:
    """Rows per effect key in the stand-ins' ledgers (see `Planned.effect`)."""

    payment_transfers: Mapping[str, int]
    """transfer_id -> rows in payment_transfers."""
    red_packet_versions: Mapping[str, int]
    """"red_packet_id/receiver/version" -> rows in red_packet_versions."""
    callback_deliveries: Mapping[str, int]
    """The request's store key -> deliveries counted by the receiver."""


def effects(acknowledged: Mapping[Id, Planned], views: Mapping[Id, MessageView], ledgers: Ledgers,
            *, store_key_prefix: str) -> dict[str, Any]:  # fmt: skip
    """Did each done request leave its effect once, and nothing else appear? `double_paid` counts
    transfer ids with more than one row and rows for transfer ids the run never asked for (with
    the payment stand-in's dedup off, each row is one payment); `parked_but_paid`, transfers parked
    as unknown_outcome that the payment system did make (lookups that missed a payment)."""
    done_ids = {message_id for message_id, view in views.items() if view.state.value == DONE}
    parked_ids = {message_id for message_id, view in views.items() if parked(view)}
    return effects_of(acknowledged, done_ids, parked_ids, ledgers, store_key_prefix=store_key_prefix)


def effects_of(acknowledged: Mapping[Id, Planned], done_ids: Set[Id], parked_ids: Set[Id], ledgers: Ledgers,
               *, store_key_prefix: str) -> dict[str, Any]:  # fmt: skip
    """`effects` by request id: which acknowledged requests are done, and which parked (any queue's)."""
    wanted: dict[Kind, set[str]] = {kind: set() for kind in Kind}
    done: dict[Kind, set[str]] = {kind: set() for kind in Kind}
    parked_transfers: set[str] = set()
    for message_id, planned in acknowledged.items():
        wanted[planned.kind].add(planned.effect)
        if message_id in done_ids:
            done[planned.kind].add(planned.effect)
        if message_id in parked_ids:
            parked_transfers.add(planned.effect)
    transfers = ledgers.payment_transfers
    versions = ledgers.red_packet_versions
    deliveries = {key.removeprefix(store_key_prefix): n for key, n in ledgers.callback_deliveries.items()}
    unexpected_transfers = sum(n for key, n in transfers.items() if key not in wanted[Kind.TRANSFER])
    return {
        "double_paid": sum(n - 1 for n in transfers.values() if n > 1) + unexpected_transfers,
        "payment_rows": sum(transfers.values()),
        "payment_rows_unrequested": unexpected_transfers,
        "parked_but_paid": len(parked_transfers & transfers.keys()),
        "list_versions_applied_twice": sum(n - 1 for n in versions.values() if n > 1),
        "list_versions_unrequested": sum(n for key, n in versions.items() if key not in wanted[Kind.LIST_UPDATE]),
        "callback_repeats": sum(n - 1 for n in deliveries.values() if n > 1),
        "done_without_effect": {
            Kind.TRANSFER.value: len(done[Kind.TRANSFER] - transfers.keys()),
            Kind.LIST_UPDATE.value: len(done[Kind.LIST_UPDATE] - versions.keys()),
            Kind.CALLBACK.value: len(done[Kind.CALLBACK] - deliveries.keys()),
        },
    }  # fmt: skip


def cpu_per_request(cpu_s: Mapping[str, float], done: int, window_s: float) -> dict[str, Any]:
    """CPU per done request by process group, and the cores each kept busy over the `window_s`
    the CPU was read across (the machine's too: other processes are the rest of it)."""
    groups = {name: seconds for name, seconds in cpu_s.items() if name != "machine_busy"}
    ours = sum(groups.values())
    busy = cpu_s.get("machine_busy", 0.0)
    per_request = {name: round(1e6 * s / done, 1) if done else None
                   for name, s in sorted(groups.items(), key=lambda item: -item[1])}  # fmt: skip
    return {
        "cpu_us_per_request": {**per_request, "total": round(1e6 * ours / done, 1) if done else None},
        "cpu_share": {name: round(s / ours, 3) if ours else None for name, s in groups.items()},
        "cores_busy": {name: round(s / window_s, 2) for name, s in groups.items()} if window_s > 0 else {},
        "machine_busy_cores": round(busy / window_s, 2) if window_s > 0 else None,
        "other_processes_cores": round(max(0.0, busy - ours) / window_s, 2) if window_s > 0 else None,
    }  # fmt: skip


_SAMPLE: Final = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
_LABEL: Final = re.compile(r'(\w+)="([^"]*)"')
HANDLER: Final = "compensator_worker_handler_seconds"


def worker_metrics(pages: Iterable[str]) -> dict[str, Any]:
    """The workers' Prometheus pages summed: each kind's handler time (mean, and the histogram's
    bucket bounds holding the median and the 99th percentile), attempts and completions."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    attempts: Counter[str] = Counter()
    completions: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for page in pages:
        for sample in _SAMPLE.finditer(page):
            labels = dict(_LABEL.findall(sample["labels"]))
            name, value = sample["name"], float(sample["value"])
            if name == f"{HANDLER}_bucket":
                bound = buckets.setdefault(labels["kind"], {})
                le = float(labels["le"])
                bound[le] = bound.get(le, 0.0) + value
            elif name == f"{HANDLER}_sum":
                sums[labels["kind"]] = sums.get(labels["kind"], 0.0) + value
            elif name == f"{HANDLER}_count":
                counts[labels["kind"]] = counts.get(labels["kind"], 0.0) + value
            elif name == "compensator_worker_attempts_total":
                attempts[f"{labels['kind']}/{labels['outcome']}"] += int(value)
            elif name == "compensator_worker_completions_total":
                completions[f"{labels['action']}/{labels['result']}"] += int(value)
            elif name == "compensator_worker_handler_events_total":
                events[f"{labels['downstream']}/{labels['event']}"] += int(value)
    handler = {kind: {"mean_ms": round(1000 * sums[kind] / counts[kind], 1) if counts[kind] else None,
                      "p50_at_most_ms": _bound_ms(buckets.get(kind, {}), counts[kind], 0.5),
                      "p99_at_most_ms": _bound_ms(buckets.get(kind, {}), counts[kind], 0.99)}
               for kind in sorted(counts)}  # fmt: skip
    return {"handler": handler, "attempts": dict(sorted(attempts.items())),
            "completions": dict(sorted(completions.items())), "handler_events": dict(sorted(events.items()))}  # fmt: skip


def _bound_ms(cumulative: Mapping[float, float], count: float, fraction: float) -> float | None:
    """The smallest bucket bound with at least `fraction` of the observations at or below it."""
    for bound in sorted(cumulative):
        if count and cumulative[bound] >= fraction * count:
            return bound * 1000 if math.isfinite(bound) else None
    return None


def histogram(pages: Iterable[str], name: str) -> list[tuple[float, float]]:
    """One histogram's cumulative (upper bound, count) buckets, summed over the pages."""
    found: dict[float, float] = {}
    for page in pages:
        for sample in _SAMPLE.finditer(page):
            if sample["name"] == f"{name}_bucket":
                le = float(dict(_LABEL.findall(sample["labels"]))["le"])
                found[le] = found.get(le, 0.0) + float(sample["value"])
    return sorted(found.items())


def counter(pages: Iterable[str], name: str) -> float:
    """An unlabelled counter's value, summed over the pages."""
    pattern = re.compile(rf"^{re.escape(name)} (\S+)$", re.MULTILINE)
    return sum(float(found[1]) for page in pages for found in pattern.finditer(page))


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the rank."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return round(lower, 3)
            return round(lower + (upper - lower) * (rank - below) / max(count - below, 1e-9), 3)
        lower, below = upper, count
    return round(lower, 3)
