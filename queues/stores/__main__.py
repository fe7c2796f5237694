"""Copy a node's LMDB queue store while the node runs.

    python -m queues.stores copy DATA/queue.lmdb COPY.lmdb

The copy is one consistent state (an LMDB read transaction, which the node's writes do not
disturb), compacted and fsynced: what `compensator audit verify --state COPY.lmdb` reads offline.
Exit 1 with one line when the store cannot be read or the target exists.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lmdb

from queues.stores.lmdb_store import copy_env


def copy(source: Path, target: Path) -> None:
    if target.exists():
        raise ValueError(f"{target} exists already")
    if not source.is_file():
        raise ValueError(f"{source} is not a file")
    env = lmdb.open(str(source), subdir=False, readonly=True, lock=True, max_dbs=64, map_size=1 << 40)
    try:
        copy_env(env, target)
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queues.stores", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    copying = commands.add_parser("copy", help="a consistent copy of a store, beside a running node")
    copying.add_argument("source", type=Path)
    copying.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        copy(args.source, args.target)
    except (ValueError, OSError, lmdb.Error) as error:
        print(f"queues.stores copy: {error}", file=sys.stderr)
        return 1
    print(f"{args.source} copied to {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
