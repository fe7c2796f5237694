"""Progress of a run, visible while it runs: stage names, rows processed, Spark task counts.

Owns: one line per event on a text stream (stderr by default), and a bounded background poller of
Spark's status tracker so a long shuffle shows movement. On a cluster, each stage is also the Spark
job description, so the Spark UI shows the same names.

Must never: affect results; reporting failures are swallowed by the poller, never by the job.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Final, TextIO

from pyspark.sql import SparkSession

POLL_INTERVAL_S: Final = 5.0


class Progress:
    """Stage-by-stage log lines: ``reconcile stage=<name> state=<start|done> elapsed_s=.. rows=..``."""

    def __init__(self, stream: TextIO | None = None, *, spark: SparkSession | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._spark = spark
        self._started = time.monotonic()
        self.timings_s: dict[str, float] = {}

    def emit(self, **fields: object) -> None:
        text = " ".join(f"{key}={value}" for key, value in fields.items())
        print(
            f"reconcile {text} elapsed_s={time.monotonic() - self._started:.1f}",
            file=self._stream,
            flush=True,
        )

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._spark is not None:
            self._spark.sparkContext.setJobDescription(f"reconcile: {name}")
        self.emit(stage=name, state="start")
        begun = time.monotonic()
        yield
        self.timings_s[name] = round(time.monotonic() - begun, 3)
        self.emit(stage=name, state="done", stage_s=self.timings_s[name])

    def rows(self, stage: str, **counts: int) -> None:
        self.emit(stage=stage, **{f"rows_{name}": count for name, count in counts.items()})

    @contextlib.contextmanager
    def spark_tasks(self, interval_s: float = POLL_INTERVAL_S) -> Iterator[None]:
        """While the block runs, report active Spark stages every ``interval_s`` seconds."""
        if self._spark is None:
            yield
            return
        stop = threading.Event()
        tracker = self._spark.sparkContext.statusTracker()

        def poll() -> None:
            while not stop.wait(interval_s):
                with contextlib.suppress(Exception):
                    for stage_id in tracker.getActiveStageIds():
                        info = tracker.getStageInfo(stage_id)
                        if info is not None:
                            self.emit(spark_stage=stage_id, tasks_done=info.numCompletedTasks, tasks=info.numTasks)

        thread = threading.Thread(target=poll, name="reconcile-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=interval_s)
