"""What one WAL sync costs on this disk: writing into a file that grows against writing into a
preallocated (zero-filled, synced) segment, the choice behind `node.wal_preallocate`
(docs/storage.md, "Preallocated segments").

    python -m bench.wal_sync --json

Each mode writes `--syncs` batches of `--batch-bytes` and syncs after each, through the WAL's own
file layer (`raft_store.files`): `grown` in a new empty segment (a plain create, as without
preallocation), `preallocated` in a spare filled by `raft_store.wal_spare` and adopted by rename,
`fallocated` in a spare made by `posix_fallocate` instead of zeros (the cheaper-looking choice).
The modes alternate `--rounds` times in one directory of `--dir` (default: the temp directory, so
run it on the disk the nodes use); the figures are per sync, and the ratio is within each round.

Must never: leave its files behind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import code_revision
from raft_store.files import AppendFile, FileSystem
from raft_store.wal_spare import fill_zeros

MODES = ("grown", "preallocated", "fallocated")


def _one(directory: Path, mode: str, syncs: int, batch: bytes) -> dict[str, float]:
    fs = FileSystem()
    path = directory / f"{mode}.wal"
    size = syncs * len(batch) + (1 << 20)
    spare = directory / "bench.spare"
    if mode == "preallocated":
        fill_zeros(spare, size, threading.Event())
        file: AppendFile = fs.adopt(spare, path)
    elif mode == "fallocated":
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        file = fs.adopt(spare, path)
    else:
        file = fs.create(path)
    fs.fsync_dir(directory)
    took: list[float] = []
    try:
        for _ in range(syncs):
            start = time.perf_counter()
            file.write(batch)
            file.sync()
            took.append(time.perf_counter() - start)
    finally:
        file.close()
        path.unlink()
    took.sort()
    return {
        "mean_us": round(sum(took) / len(took) * 1e6, 1),
        "p50_us": round(took[len(took) // 2] * 1e6, 1),
        "p99_us": round(took[int(len(took) * 0.99)] * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wal_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--syncs", type=int, default=2000)
    parser.add_argument("--batch-bytes", type=int, default=16 * 1100, help="default: 16 enqueues of 1 KiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the temp directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.syncs < 1 or args.batch_bytes < 1 or args.rounds < 1:
        parser.error("--syncs, --batch-bytes and --rounds must be at least 1")
    directory = Path(tempfile.mkdtemp(prefix="bench-wal-sync-", dir=args.dir))
    batch = b"x" * args.batch_bytes
    rounds: list[dict[str, Any]] = []
    try:
        for _ in range(args.rounds):
            one: dict[str, Any] = {mode: _one(directory, mode, args.syncs, batch) for mode in MODES}
            for mode in MODES[1:]:
                one[f"{mode}_over_grown"] = round(one[mode]["mean_us"] / one["grown"]["mean_us"], 2)
            rounds.append(one)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "time_utc": time.strftime("%H:%M", time.gmtime()),
        "revision": code_revision(),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "syncs": args.syncs,
        "batch_bytes": args.batch_bytes,
        "rounds": rounds,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for i, r in enumerate(rounds, 1):
            print(f"round {i}: " + ", ".join(f"{m} {r[m]['mean_us']} µs/sync (p99 {r[m]['p99_us']})" for m in MODES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
