"""`python -m bench.queue`'s command line (bench/queue.py runs it): the options, their defaults by
mode, and the combinations refused before any cluster starts."""

from __future__ import annotations

import argparse
from typing import Final

from bench.memory_limit import CgroupUnavailable, MemoryLimit

DESCRIPTION: Final = "Queue benchmark: the queue machine on a 3-node cluster of processes on loopback, fsync on."
MODE_NAMES: Final = ("backlog", "burst", "drain", "enqueue", "lateness")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments, checked (a one-line error and exit 2 otherwise); also how
    bench.peers_queue builds the enqueue mode's, so an option added here reaches it with its default."""
    parser = argparse.ArgumentParser(prog="python -m bench.queue", description=DESCRIPTION)
    parser.add_argument("mode", choices=MODE_NAMES)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--delayed", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=3600.0, help="lateness: due times spread over this window")
    parser.add_argument("--measure-s", type=float, default=60.0, help="lateness: poll the window's first seconds")
    parser.add_argument("--payload-bytes", type=int, default=None,
                        help="default 1024 for enqueue and drain, 256 for the preloaded modes")
    parser.add_argument("--random-keys", action="store_true", help="backlog: UUID idempotency keys, not k0, k1, ...")
    parser.add_argument("--preload", type=int, default=0,
                        help="enqueue: this many delayed messages (UUID keys) enqueued before the window")
    parser.add_argument("--sets", type=int, default=1,
                        help="enqueue: this many sets of 3 nodes, routed by key (bench/queue_sets.py)")
    parser.add_argument("--lose-set", type=int, default=None,
                        help="enqueue --sets N: kill a majority of this set after the first --seconds")
    parser.add_argument("--memory-limit-mib", type=int, default=0,
                        help="backlog: run each node in a memory cgroup of this many MiB (page cache included)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    defaults = {"drain": 100_000, "burst": 500_000, "backlog": 10_000_000}
    if args.messages is None:
        args.messages = defaults.get(args.mode, 0)
    if args.payload_bytes is None:
        args.payload_bytes = 1024 if args.mode in ("enqueue", "drain") else 256
    if args.concurrency <= 0 or args.seconds <= 0 or args.workers <= 0:
        parser.error("--concurrency, --seconds and --workers must be positive")
    if args.preload < 0 or (args.preload and (args.mode != "enqueue" or args.sets > 1)):
        parser.error("--preload: a count of 0 or more, with the enqueue mode of one set")
    if args.memory_limit_mib and args.mode != "backlog":
        parser.error("--memory-limit-mib: only with the backlog mode")
    if args.memory_limit_mib < 0:
        parser.error("--memory-limit-mib must be positive")
    if args.sets < 1 or (args.sets > 1 and args.mode != "enqueue"):
        parser.error("--sets: 1, or more with the enqueue mode")
    if args.lose_set is not None and (args.sets < 2 or not 1 <= args.lose_set <= args.sets):
        parser.error("--lose-set: one of the sets 1..N of --sets N (N at least 2)")
    if args.memory_limit_mib:
        try:
            MemoryLimit("bench-queue-probe", 0)
        except CgroupUnavailable as exc:
            parser.error(f"--memory-limit-mib: {exc}")
    return args
