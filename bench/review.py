"""What finance review costs the store: the dead-letter tier's reads and a bulk redrive job's applies,
in one process, without Raft.

    python -m bench.review --dead 100000 --json

Why it exists: the review pages ask the store for a filter's count and totals on every list view,
and a bulk redrive of a whole outage's dead letters is one log entry that creates the job, then
entries that redrive a few hundred items each. Queries run on the node's apply thread between
applies, and applies hold every replica's apply pipeline, so their duration is what a reviewer's
click costs the set.
The store is the real machine on the LMDB store, as a node opens it; the
dead letters are made as workers make them (enqueue in batches of 1000, lease, fail permanently),
transfers of 1.00-9.99 in CNY and JPY.

Figures (milliseconds, the median of `--repeat` runs, with the minimum): the summary of the whole
tier, of one currency (both answered from the tier's aggregates), of a currency-and-amount filter
(from the amount buckets' aggregates: 3.00-7.00, one bound inside a bucket) and of one whose two
bounds both fall inside buckets (3.05-6.95: two edge buckets read letter by letter), a first page
of 100 under the filter, the creation of a job holding every dead letter (one apply), and one step
of 300 items (one apply).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from queues import codec
from queues import query_codec as qc
from queues.model import (
    DeadLetterFilter,
    Enqueue,
    EnqueueResult,
    Fail,
    Lease,
    LeaseResult,
    RedriveJob,
    ReviewResult,
    StepJob,
)
from queues.replicated import ReplicatedQueueMachine
from raft_store.state_machine import Command

BATCH = 1000
START_MS = 1_700_000_000_000


class Store:
    """The machine with a leader clock the benchmark moves, one command list per log entry."""

    def __init__(self, root: Path) -> None:
        self.now_ms = START_MS
        self.machine = ReplicatedQueueMachine(str(root / "queue.lmdb"), clock_ms=lambda: self.now_ms, threaded=False)
        self.index = 0

    def apply(self, commands: list[Any]) -> list[Any]:
        self.index += 1
        results = self.machine.apply_batch(self.index, self.now_ms, [Command(0, 0, codec.encode_command(c)) for c in commands])
        return [codec.decode_result(r) for r in results]

    def ask(self, query: qc.QueueQuery) -> qc.QueryAnswer:
        return qc.decode_answer(self.machine.query(qc.encode_query(query)))


def fill(store: Store, dead: int) -> list[int]:
    ids: list[int] = []
    for start in range(0, dead, BATCH):
        batch = []
        for n in range(start, min(dead, start + BATCH)):
            currency = "JPY" if n % 5 == 0 else "CNY"
            payload = {"transfer_id": f"t{n}", "payer": "escrow", "payee": f"user-{n}",
                       "amount_minor": 100 + n % 900, "currency": currency}  # fmt: skip
            batch.append(Enqueue(kind="transfer", idempotency_key=f"p:k{n}", ref_key=f"rp-{n}",
                                 payload=json.dumps(payload).encode()))  # fmt: skip
        results = store.apply(batch)
        ids += [r.message_id for r in results if isinstance(r, EnqueueResult)]
    while True:
        (leased,) = store.apply([Lease(worker_id="w", count_max=BATCH, lease_ms=60_000, kinds=("transfer",))])
        assert isinstance(leased, LeaseResult)
        if not leased.grants:
            return ids
        store.apply([Fail(message_id=g.message_id, token=g.token, error_class="insufficient_funds", permanent=True)
                     for g in leased.grants])  # fmt: skip


def timed(repeat: int, call: Callable[[], object]) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return {"median_ms": round(statistics.median(samples), 2), "min_ms": round(min(samples), 2)}


def run(dead: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-review-") as tmp:
        store = Store(Path(tmp))
        started = time.perf_counter()
        ids = fill(store, dead)
        fill_s = time.perf_counter() - started
        everything = qc.DeadLetterSummary(filter=DeadLetterFilter(kind="transfer"))
        summary = store.ask(everything)
        assert isinstance(summary, qc.DeadLetterSummaryAnswer) and summary.summary.count == dead, summary
        money = DeadLetterFilter(kind="transfer", currency="CNY", amount_min_minor=300, amount_max_minor=700)
        edges = DeadLetterFilter(kind="transfer", currency="CNY", amount_min_minor=305, amount_max_minor=695)
        currency = DeadLetterFilter(kind="transfer", currency="CNY")
        figures: dict[str, Any] = {
            "summary_all": timed(repeat, lambda: store.ask(everything)),
            "summary_currency": timed(repeat, lambda: store.ask(qc.DeadLetterSummary(filter=currency))),
            "summary_money_filter": timed(repeat, lambda: store.ask(qc.DeadLetterSummary(filter=money))),
            "summary_money_edges": timed(repeat, lambda: store.ask(qc.DeadLetterSummary(filter=edges))),
            "page_of_100_money_filter": timed(repeat, lambda: store.ask(qc.DeadLetters(filter=money, limit=100))),
        }
        job_ids = tuple(ids[:100_000])
        started = time.perf_counter()
        (created,) = store.apply([RedriveJob(actor="bench", reason="bench", ids=job_ids, rate_per_s=10_000)])
        figures["create_job_ms"] = round((time.perf_counter() - started) * 1000, 2)
        assert isinstance(created, ReviewResult) and created.job_id is not None, created
        steps = []
        for _ in range(repeat):
            store.now_ms += 1000  # a second of leader time: the bucket holds a full burst
            start = time.perf_counter()
            store.apply([StepJob(job_id=created.job_id, limit=300)])
            steps.append((time.perf_counter() - start) * 1000)
        figures["step_of_300"] = {"median_ms": round(statistics.median(steps), 2), "min_ms": round(min(steps), 2)}
        return {"dead": dead, "job_items": len(job_ids), "fill_s": round(fill_s, 1), **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.review", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dead", type=int, default=100_000, help="dead letters in the tier")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.dead < 1000:
        parser.error("--dead: at least 1000")
    report = {"bench": "review", "machine": platform.machine(), "cpus": os.cpu_count(),
              "python": platform.python_version(), **run(args.dead, args.repeat)}  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
