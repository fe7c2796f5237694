"""bench.e2e over several sets: the figures per set, the read-back of every set, and
`--compare-sets N,M`, the two runs one after the other and the ratio the issue's check reads.

    python -m bench.e2e --sets 3 --json
    python -m bench.e2e --compare-sets 1,3 --json

On one 2-core machine more sets cannot add cores: what a second and third set may cost is CPU per
done request, so `--compare-sets` runs the same load with N sets, then M, in one command (the same
machine, minutes apart, the load average recorded for each) and prints
`cpu_us_per_done_ratio` = the total CPU per done request of the run with more sets over the one
with fewer (whichever ran first), with `within_15_percent`.

Must never: report a ratio of runs that lost a request, paid twice or did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from bench.e2e_figures import DONE
from bench.e2e_store import RunStore
from ledger.request_ids import RequestId
from queues import MessageView

if TYPE_CHECKING:
    from bench.e2e import Settings

SETS_MAX: Final = 5
"""As `compensator run --sets`: set k's ports are free ones here, but 5 sets are 18 node processes."""
RATIO_LIMIT: Final = 1.15


def parse_compare(text: str) -> tuple[int, int] | None:
    """"1,3" as (1, 3); None for anything else."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return None
    first, second = (int(p) for p in parts)
    return (first, second) if 1 <= first <= SETS_MAX and 1 <= second <= SETS_MAX else None


async def _read(store: RunStore, ids: Iterable[RequestId]) -> dict[RequestId, MessageView]:
    reader = store.reader()
    try:
        return await reader.views(ids)
    finally:
        await reader.close()


def read_views(store: RunStore | None, ids: Iterable[RequestId]) -> dict[RequestId, MessageView]:
    """Every acknowledged request's view, from the set its id names."""
    assert store is not None
    return asyncio.run(_read(store, ids))


def per_set(
    acknowledged: Mapping[RequestId, object], views: Mapping[RequestId, MessageView],
    leaders: Mapping[int, Mapping[str, float]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """By set: requests acknowledged there, their share, done there, and (`leaders`: each set's
    leader's progress over the window) its leader's log entries, commands, fsyncs and stale reads
    per request done there."""
    taken = Counter(request.set_id for request in acknowledged)
    done = Counter(request.set_id for request, view in views.items() if view.state.value == DONE and request in acknowledged)
    total = sum(taken.values())
    found: dict[str, Any] = {
        str(set_id): {"requests": taken[set_id], "share": round(taken[set_id] / total, 4) if total else None,
                      "done": done[set_id]}
        for set_id in sorted(taken)
    }  # fmt: skip
    for set_id, progress in (leaders or {}).items():
        if str(set_id) in found and done[set_id]:
            found[str(set_id)]["store_per_done"] = {f"leader_{name}": round(n / done[set_id], 3) for name, n in progress.items()}
    return found


def idle(cores: float, done_per_s: float | None) -> dict[str, Any]:
    """The nodes' CPU with nothing in flight (read before the first POST), and what it comes to
    per done request at the run's rate: the part of `cpu_us_per_request.nodes` each set costs
    whatever the load (on a machine with cores to spare it is paid by idle cores)."""
    return {"cores": cores, "cpu_us_per_done_at_run_rate": round(1e6 * cores / done_per_s, 1) if done_per_s else None}


RunOne = Callable[["Settings", argparse.Namespace], tuple[dict[str, Any], list[str]]]


def compare(settings: Settings, args: argparse.Namespace, run_one: RunOne) -> int:
    """Run with each of `--compare-sets`' counts in turn; print both results and the ratio."""
    counts = parse_compare(args.compare_sets)
    assert counts is not None  # parse_settings refused anything else
    runs: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for count in counts:
        result, errors = run_one(dataclasses.replace(settings, sets=count), args)
        runs[str(count)] = result
        failed += [f"--sets {count}: {error}" for error in errors]
    fewer, more = (runs[str(c)].get("cpu_us_per_request", {}).get("total") for c in sorted(counts))
    ratio = round(more / fewer, 3) if fewer and more else None
    summary: dict[str, Any] = {
        "compare_sets": list(counts),
        "ratio_of": f"--sets {max(counts)} over --sets {min(counts)}",
        "cpu_us_per_done": {str(c): runs[str(c)].get("cpu_us_per_request", {}).get("total") for c in counts},
        "cpu_us_per_done_ratio": ratio if not failed else None,
        "within_15_percent": ratio is not None and not failed and ratio <= RATIO_LIMIT,
        "done_per_s": {str(c): runs[str(c)].get("done_per_s") for c in counts},
        "nodes_idle": {str(c): runs[str(c)].get("nodes_idle") for c in counts},
        "cpu_us_per_done_by_process": {str(c): runs[str(c)].get("cpu_us_per_request") for c in counts},
        "lost": {str(c): runs[str(c)].get("lost") for c in counts},
        "double_paid": {str(c): runs[str(c)].get("double_paid") for c in counts},
        "errors": failed,
        "runs": runs,
    }
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 1 if failed else 0
