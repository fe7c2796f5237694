"""The figure testing.md asks for, summed over passing seeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_SUMMED = ("faults", "acked", "acked_enqueues", "lost", "unexpected", "duplicate_deliveries", "duplicate_effects",
           "recovered", "dead_letters", "late_acks", "fenced_calls", "clock_went_back", "machine_ts_behind_log_time",
           "purged", "events_purged", "reused_keys", "retention_changes", "retention_refusals", "client_cuts", "sim_ms",
           "clock_faults")
_HIGHEST = ("log_ahead_max_ms", "log_behind_max_ms", "log_still_max_ms", "lease_early_max_ms")


@dataclass(slots=True)
class Totals:
    seeds: int = 0
    failures: int = 0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SUMMED, 0))
    highest: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_HIGHEST, 0))

    def add(self, stats: dict[str, Any]) -> None:
        self.seeds += 1
        for key in _SUMMED:
            self.sums[key] += int(stats.get(key, 0))
        for key in _HIGHEST:
            self.highest[key] = max(self.highest[key], int(stats.get(key, 0)))

    def sentence(self) -> str:
        s, h = self.sums, self.highest
        hours = s["sim_ms"] / 3_600_000
        return (
            f"{s['faults']} faults injected ({s['client_cuts']} client links cut), {s['acked']} acked requests ({s['acked_enqueues']} enqueues), "
            f"{s['lost']} lost, {s['unexpected']} unexpected, {s['duplicate_deliveries']} duplicate deliveries, "
            f"{s['duplicate_effects']} duplicate effects, {self.seeds} simulation seeds ({hours:.2f} simulated hours); "
            f"{s['recovered']} recovered enqueues, {s['dead_letters']} dead letters, {s['late_acks']} late acks, "
            f"{s['fenced_calls']} fenced calls, stamped clock went back {s['clock_went_back']} times "
            f"(machine log time {s['machine_ts_behind_log_time']} times); {s['purged']} tombstones and "
            f"{s['events_purged']} events purged, "
            f"{s['reused_keys']} keys taken again after their retention, {s['retention_changes']} retention changes "
            f"({s['retention_refusals']} more refused under the floor); {s['clock_faults']} clock faults, the log's "
            f"clock at most {h['log_ahead_max_ms']} ms ahead of and {h['log_behind_max_ms']} ms behind true time, "
            f"still for at most {h['log_still_max_ms']} ms, a lease expired at most {h['lease_early_max_ms']} ms early"
        )
