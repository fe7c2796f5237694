"""Counters and small histograms a node keeps about itself, exported through `status`.

Plain numbers, no exporter here: the service's composition root turns them into OpenTelemetry
instruments, so raft_store stays free of the service's dependencies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Upper bounds of the fsync batch-size buckets (entries per fsync).
BATCH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class NodeMetrics:
    fsyncs: int = 0
    fsync_seconds_total: float = 0.0
    fsync_seconds_max: float = 0.0
    fsync_entries_total: int = 0
    fsync_batch_histogram: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BUCKETS) + 1))
    proposed_commands: int = 0
    applied_commands: int = 0
    stale_reads: int = 0
    """Stale client reads taken (long polls included, each once)."""
    snapshots: int = 0
    checkpoints: int = 0
    torn_tails: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    """Connections refused before they were let in, by reason (the transport counts them)."""

    def observe_fsync(self, entries: int, seconds: float) -> None:
        self.fsyncs += 1
        self.fsync_seconds_total += seconds
        self.fsync_seconds_max = max(self.fsync_seconds_max, seconds)
        self.fsync_entries_total += entries
        for position, bound in enumerate(BATCH_BUCKETS):
            if entries <= bound:
                self.fsync_batch_histogram[position] += 1
                return
        self.fsync_batch_histogram[-1] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "fsyncs": self.fsyncs,
            "fsync_ms_avg": round(1000 * self.fsync_seconds_total / self.fsyncs, 3) if self.fsyncs else 0.0,
            "fsync_ms_max": round(1000 * self.fsync_seconds_max, 3),
            "fsync_entries_total": self.fsync_entries_total,
            "fsync_batch_buckets": dict(
                zip([str(b) for b in BATCH_BUCKETS] + ["inf"], self.fsync_batch_histogram, strict=True)
            ),
            "proposed_commands": self.proposed_commands,
            "applied_commands": self.applied_commands,
            "stale_reads": self.stale_reads,
            "snapshots": self.snapshots,
            "checkpoints": self.checkpoints,
            "torn_tails": self.torn_tails,
            "refused": dict(self.refused),
        }
