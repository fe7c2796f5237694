"""How a long-running process of the service runs CPython's cyclic garbage collector, applied once
its start-up is complete (the API's lifespan, the process shell's `serve` for the others).

Why: a collection stops the event loop while it walks the objects of the generations it collects.
Under `bench.api --phases single` the API process (FastAPI, pydantic, OpenTelemetry: ~100,000
objects alive from start-up) ran 160 gen0 collections a second at CPython's threshold of 700, and
so promoted the in-flight requests' objects into the older generations, which then ran a full
collection every 0.75 s that took 50-80 ms and freed nothing: one pause of every in-flight
request, the whole of the single POST's p99 (docs/benchmarks.md, "i23g"). Two settings remove it:

- `gc.freeze()` after start-up moves every object alive then (modules, classes, the app, the
  schemas) into the permanent generation, which no collection walks again;
- a gen0 threshold of 50,000 (not 700): CPython counts tracked allocations minus deallocations,
  so a request's objects freed by reference counting never add up to a collection; one runs only
  when that many objects outlive their requests (reference cycles among them included, so cycles
  are still collected: a leak is worse than a pause). Such a collection walks at most about that
  many young objects, ~15 ms here, where the old full ones walked the whole heap.

The collector is never disabled. The objects frozen at start-up live as long as the process; a
cycle among them that became garbage later would never be collected, which is why the freeze
comes after start-up and after one full collection of start-up's own garbage.

Must never: read the configuration (the composition root passes a `GcPolicy`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

GENERATIONS: Final = 3


@dataclass(frozen=True, slots=True)
class GcPolicy:
    freeze: bool = True
    """Freeze what start-up left alive (gc.freeze) once start-up is complete."""
    gen0_threshold: int = 50_000
    """Net tracked allocations between two young collections; 0 keeps CPython's own (700)."""


def apply(policy: GcPolicy) -> None:
    """Once, after start-up: start-up's garbage collected, what is left frozen, the threshold set."""
    if policy.gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(policy.gen0_threshold, gen1, gen2)
    if policy.freeze:
        gc.collect()
        gc.freeze()


class GcPauses(Collector):
    """Prometheus counters of the collections and of the time the process stood still in them, by
    generation (`python_gc_pause_seconds_total`; prometheus_client's own GC collector counts
    collections but not their pauses, and is not in the service's registries). One callback per
    collection: two clock reads and two additions."""

    def __init__(self) -> None:
        self.collections = [0] * GENERATIONS
        self.seconds = [0.0] * GENERATIONS
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    def collect(self) -> Iterator[CounterMetricFamily]:
        collections = CounterMetricFamily(
            "python_gc_pauses", "Cyclic garbage collections run, by generation.", labels=["generation"]
        )
        seconds = CounterMetricFamily(
            "python_gc_pause_seconds", "Time spent in cyclic garbage collections, by generation.", labels=["generation"]
        )
        for generation in range(GENERATIONS):
            collections.add_metric([str(generation)], self.collections[generation])
            seconds.add_metric([str(generation)], self.seconds[generation])
        yield collections
        yield seconds
