"""bench.e2e over several sets: the figures per set, the read-back of every set, and
`--compare-sets N,M`, the two runs one after the other and the ratio the issue's check reads.

    python -m bench.e2e --sets 3 --json
    python -m bench.e2e --compare-sets 1,3 --json

On one 2-core machine more sets cannot add cores: what a second and third set may cost is CPU per
done request, so `--compare-sets` runs the same load with N sets, then M, in one command (the same
machine, minutes apart, the load average recorded for each) and prints
`cpu_us_per_done_ratio` = the total CPU per done request of the run with more sets over the one
with fewer (whichever ran first), with `within_15_percent`; `--compare-rounds R` repeats the pair
R times in alternating order (ABBA) and reads the ratio of the rounds' means.

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench.e2e's options for sets: how many, how hosted, and the comparison."""
    parser.add_argument("--sets", type=int, default=1, help="sets of 3 nodes (more: with a control set)")
    parser.add_argument("--process-per-replica", action="store_true", help="several sets: a process per node, not 3 hosts")
    parser.add_argument("--compare-sets", metavar="N,M", help="run with N sets, then M; the CPU per done ratio (more sets over fewer)")
    parser.add_argument("--compare-rounds", type=int, default=1, metavar="R",
                        help="--compare-sets: R rounds, every other one in the reverse order; the ratio of the means")  # fmt: skip


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.sets <= SETS_MAX or (args.compare_sets and parse_compare(args.compare_sets) is None):
        parser.error(f"--sets must be in 1..{SETS_MAX}, --compare-sets two such counts (e.g. 1,3)")
    if not 1 <= args.compare_rounds <= 10 or (args.compare_rounds > 1 and not args.compare_sets):
        parser.error("--compare-rounds must be in 1..10, and goes with --compare-sets")


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


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _by_process(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each process group's CPU per done, averaged over the rounds that report it."""
    groups = sorted({group for result in results for group in result.get("cpu_us_per_request", {})})
    return {group: _mean([r["cpu_us_per_request"][group] for r in results if group in r.get("cpu_us_per_request", {})])
            for group in groups}  # fmt: skip


def compare(settings: Settings, args: argparse.Namespace, run_one: RunOne) -> int:
    """Run with each of `--compare-sets`' counts in turn; print both results and the ratio.

    With `--compare-rounds R` the pair runs R times, every other round in the reverse order
    (N,M then M,N: ABBA), and the ratio is that of the rounds' mean CPU per done: on this shared
    machine one run's CPU per done moves by 5-15 % with the minute (the stand-ins', which no set
    count changes, as much as the service's), and whichever count runs in a slow minute loses;
    alternating the order cancels a drift over the runs instead of charging it to one count."""
    counts = parse_compare(args.compare_sets)
    assert counts is not None  # parse_settings refused anything else
    rounds_wanted: int = getattr(args, "compare_rounds", 1)
    runs: dict[str, list[dict[str, Any]]] = {str(c): [] for c in counts}
    rounds: list[dict[str, Any]] = []
    failed: list[str] = []
    for round_index in range(rounds_wanted):
        order = counts if round_index % 2 == 0 else counts[::-1]
        for count in order:
            result, errors = run_one(dataclasses.replace(settings, sets=count), args)
            runs[str(count)].append(result)
            prefix = f"--sets {count}" if rounds_wanted == 1 else f"round {round_index + 1}, --sets {count}"
            failed += [f"{prefix}: {error}" for error in errors]
        totals = {str(c): runs[str(c)][-1].get("cpu_us_per_request", {}).get("total") for c in order}
        fewer, more = (totals[str(c)] for c in sorted(counts))
        rounds.append({"order": list(order), "cpu_us_per_done": totals,
                       "cpu_us_per_done_ratio": round(more / fewer, 3) if fewer and more else None,
                       "times_utc": {str(c): runs[str(c)][-1].get("time_utc") for c in order}})  # fmt: skip
    mean_total = {str(c): _mean([r["cpu_us_per_request"]["total"] for r in runs[str(c)]
                                 if r.get("cpu_us_per_request", {}).get("total")]) for c in counts}  # fmt: skip
    fewer, more = (mean_total[str(c)] for c in sorted(counts))
    ratio = round(more / fewer, 3) if fewer and more else None
    one = rounds_wanted == 1
    summary: dict[str, Any] = {
        "compare_sets": list(counts),
        "ratio_of": f"--sets {max(counts)} over --sets {min(counts)}" + ("" if one else f", mean over {rounds_wanted} rounds (ABBA)"),
        "cpu_us_per_done": mean_total,
        "cpu_us_per_done_ratio": ratio if not failed else None,
        "within_15_percent": ratio is not None and not failed and ratio <= RATIO_LIMIT,
        "done_per_s": {str(c): _mean([r["done_per_s"] for r in runs[str(c)] if r.get("done_per_s")]) for c in counts},
        "nodes_idle": {str(c): runs[str(c)][-1].get("nodes_idle") for c in counts},
        "cpu_us_per_done_by_process": {str(c): _by_process(runs[str(c)]) for c in counts},
        "lost": {str(c): sum(r.get("lost") or 0 for r in runs[str(c)]) for c in counts},
        "double_paid": {str(c): sum(r.get("double_paid") or 0 for r in runs[str(c)]) for c in counts},
        "rounds": rounds,
        "errors": failed,
        "runs": {str(c): runs[str(c)][0] if one else runs[str(c)] for c in counts},
    }
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 1 if failed else 0
