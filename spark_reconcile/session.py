"""Building the SparkSession: the one place that knows about masters, jars and JVM flags.

Owns: settings that make Spark cheap on one machine (few shuffle partitions, no UI, UTC) without
getting in the way on a cluster: under ``spark-submit`` the master and resources come from the
submit command and are not overridden.

Must never: create a session at import time.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

from spark_reconcile.params import JDBC_JAR

LOCAL_MASTER: Final = "local[*]"
# C1-only JIT and the serial collector roughly halve start-up CPU; worth it for short runs and tests,
# not for the 10M-row benchmark, where C2-compiled code wins.
FAST_START_JAVA_OPTIONS: Final = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    app_name: str = "compensator-reconcile"
    master: str | None = None  # None: spark-submit's master, else local[*]
    shuffle_partitions: int = 8
    driver_memory: str = "2g"
    fast_start: bool = False
    ui: bool = False
    jars: tuple[str, ...] = (JDBC_JAR,)
    extra: tuple[tuple[str, str], ...] = ()

    def validate(self) -> None:
        if not 1 <= self.shuffle_partitions <= 100_000:
            raise ValueError("shuffle partitions must be within 1..100000")


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands PySpark a gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build(config: SessionConfig) -> SparkSession:
    config.validate()
    builder = SparkSession.builder.appName(config.app_name)
    if not under_spark_submit():
        builder = builder.master(config.master or LOCAL_MASTER).config("spark.driver.memory", config.driver_memory)
        if config.fast_start:
            builder = builder.config("spark.driver.extraJavaOptions", FAST_START_JAVA_OPTIONS)
    jars = [jar for jar in config.jars if Path(jar).exists()]
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": str(config.ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        **({"spark.jars": ",".join(jars)} if jars else {}),
        **dict(config.extra),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
