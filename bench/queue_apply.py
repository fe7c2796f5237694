"""The queue state machine's apply cost, in one process, without Raft.

    python -m bench.queue_apply --messages 100000 --json
    python -m bench.queue_apply --messages 200000 --per-entry 256 --random-keys --json
    python -m bench.queue_apply --messages 100000 --per-entry 32 --random-keys --enqueue-lanes 1 --json

Why it exists: on 2 shared cores every replica applies every command, so the microseconds that
`QueueMachine.apply_batch` spends per command bound the cluster's throughput more than the log
does. This isolates that cost for the three hot commands, on a file-backed LMDB store as a node
opens it: enqueue (1 KiB payloads, `--per-entry` per log entry, without session lanes as
QueueClient sends them; `--enqueue-lanes N`: on N session lanes instead, as the API's single POST
travelled before 2026-11-28; `--random-keys`: UUID idempotency and ref keys, as real callers send
them, instead of k0, k1, ...), lease (1000 grants per command, on a session lane) and ack (one
AckMany of 1000, as QueueClient.ack_many sends them).
Figures are microseconds per command per replica, wall and CPU (CPU is steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from queues import codec
from queues.machine import QueueMachine
from queues.model import Ack, AckMany, Enqueue, Grant, Lease, LeaseResult
from raft_store.state_machine import Command

BATCH = 1000


def run(
    messages: int, payload_bytes: int, per_entry: int = BATCH, random_keys: bool = False, enqueue_lanes: int = 0
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="queue-apply-") as tmp:
        machine = QueueMachine(str(Path(tmp) / "queue.lmdb"), threaded=False)
        index = 0
        now = 1_700_000_000_000
        payload = b"x" * payload_bytes
        lanes = 1024

        def entry(commands: list[bytes], base: int, *, sessions: int = lanes) -> list[bytes]:
            """On `sessions` session lanes, or none (0)."""
            nonlocal index
            index += 1
            batch = [
                Command(1 + (base + i) % sessions, 1 + (base + i) // sessions, data) if sessions else Command(0, 0, data)
                for i, data in enumerate(commands)
            ]
            return machine.apply_batch(index, now, batch)

        keys = [str(uuid.uuid4()) for _ in range(messages)] if random_keys else [f"{i}" for i in range(messages)]
        sent = 0
        start, cpu = time.perf_counter(), time.process_time()
        while sent < messages:
            count = min(per_entry, messages - sent)
            commands = [
                codec.encode_command(
                    Enqueue(kind="transfer", idempotency_key=f"k{keys[sent + i]}", ref_key=f"r{keys[sent + i]}",
                            payload=payload)
                )
                for i in range(count)
            ]
            entry(commands, sent, sessions=enqueue_lanes)
            sent += count
        machine.commit()
        enqueue_s, enqueue_cpu = time.perf_counter() - start, time.process_time() - cpu

        seq = messages
        grants: list[Grant] = []
        start, cpu = time.perf_counter(), time.process_time()
        while True:
            now += 1
            result = codec.decode_result(
                entry([codec.encode_command(Lease(worker_id="w", count_max=BATCH, lease_ms=600_000))], seq)[0]
            )
            seq += 1
            assert isinstance(result, LeaseResult)
            if not result.grants:
                break
            grants.extend(result.grants)
        machine.commit()
        lease_s, lease_cpu = time.perf_counter() - start, time.process_time() - cpu

        start, cpu = time.perf_counter(), time.process_time()
        for offset in range(0, len(grants), BATCH):
            chunk = grants[offset : offset + BATCH]
            acks = tuple(Ack(message_id=g.message_id, token=g.token) for g in chunk)
            entry([codec.encode_command(AckMany(acks=acks))], seq)
            seq += 1
        machine.commit()
        ack_s, ack_cpu = time.perf_counter() - start, time.process_time() - cpu
        machine.close()
    assert len(grants) == messages, (len(grants), messages)
    return {
        "messages": messages,
        "payload_bytes": payload_bytes,
        "per_entry": per_entry,
        "random_keys": random_keys,
        "enqueue_lanes": enqueue_lanes,
        "enqueue_us": round(enqueue_s / messages * 1e6, 1),
        "lease_us_per_grant": round(lease_s / messages * 1e6, 1),
        "ack_us": round(ack_s / messages * 1e6, 1),
        "cpu_us": {
            "enqueue": round(enqueue_cpu / messages * 1e6, 1),
            "lease_per_grant": round(lease_cpu / messages * 1e6, 1),
            "ack": round(ack_cpu / messages * 1e6, 1),
        },
        "machine": f"{platform.machine()} {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--per-entry", type=int, default=BATCH, help="enqueues per log entry")
    parser.add_argument("--random-keys", action="store_true", help="UUID keys instead of k0, k1, ...")
    parser.add_argument("--enqueue-lanes", type=int, default=0,
                        help="enqueues on this many session lanes (0: sessionless, as QueueClient sends them)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    if args.per_entry < 1:
        parser.error("--per-entry must be at least 1")
    if args.enqueue_lanes < 0:
        parser.error("--enqueue-lanes must be at least 0")
    result = run(args.messages, args.payload_bytes, args.per_entry, args.random_keys, args.enqueue_lanes)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
