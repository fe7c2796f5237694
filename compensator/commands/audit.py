"""``compensator audit verify``: recompute the operator audit chain and name the first broken entry.

    compensator audit verify                      # the store's chain (the leader's), and every replica's head
    compensator audit verify --state COPY.lmdb    # a copy of one node's state store, offline

With several sets (store.control_addresses), the control set (its chain holds the set table's and
settings' writes, tokens and users) and every set of the table are verified in turn, each its own
chain (each set chains its own operator actions): one line per set, exit 1 when any set's chain
is broken, its replicas disagree, or it does not answer (the others are still verified).

Exit 0: every entry's hash covers its content and the previous entry's hash, and the head (count
and last hash) matches. Exit 1: the first entry that does not hold is named on stderr with what is
wrong (its content does not match its hash, its link to the previous entry is broken, an entry is
missing, or the head disagrees); against the store, also a replica whose head is not the
leader's chain at that point. The hash format is in queues/core/audit_chain.py. A running node's
store is copied with `python -m queues.stores copy DATA/queue.lmdb COPY.lmdb` (docs/review.md).

Must never: write to the store or to the file it reads (the file is opened read-only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from compensator.config_processes import parse_address
from compensator.store import control_set, queue_client, store_auth
from queues import ClientError, QueueClient, QueueError
from queues.audit import close_clients, replica_clients
from queues.core.audit_chain import AUDIT_PAGE_MAX, Broken, ChainVerifier, Head, head, verify
from queues.stores import StoreError
from queues.stores.lmdb_store import LmdbStore


class AuditCommandError(ValueError):
    """One line for the operator (the file or the store could not be read); the command exits 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    audit = subparsers.add_parser("audit", help="verify the operator audit chain")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("verify", help="recompute the audit hash chain; exit 1 naming the first broken entry")
    check.add_argument("--state", type=Path, help="a copy of a node's state store (queue.lmdb), read offline")
    add_config_argument(check)
    audit.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.state is not None:
        count, broken, head = verify_file(args.state)
        return _report(count, broken, head, source=str(args.state))
    config = load_for(args)
    if config.store.control_addresses:
        return asyncio.run(_verify_sets(config))
    return asyncio.run(_verify_store(config))


async def _verify_sets(config: Config) -> int:
    """Each set of the table, one after another, as `_verify_store` verifies one set."""
    control = control_set(config)
    try:
        found, _ = await control.read()
    except (ClientError, QueueError) as error:
        raise AuditCommandError(f"the control set at {','.join(config.store.control_addresses)} did not answer: "
                                f"{error}") from None  # fmt: skip
    finally:
        await control.queue.raft.close()
    if found is None:
        raise AuditCommandError("the control set holds no set table yet (run `compensator sets init`)")
    failed = 0
    chains = {"control set": config.store.control_addresses,
              **{f"set {set_id}": addresses for set_id, addresses in sorted(found.addresses().items())}}  # fmt: skip
    for name, addresses in chains.items():
        one = msgspec.structs.replace(config, store=msgspec.structs.replace(config.store, addresses=addresses))
        try:
            failed |= await _verify_store(one, label=f"{name}: ")
        except AuditCommandError as error:
            print(f"compensator audit verify: {name}: {error}", file=sys.stderr)
            failed = 1
    return failed


def verify_file(path: Path) -> tuple[int, Broken | None, Head | None]:
    if not path.is_file():
        raise AuditCommandError(f"{path} is not a file")
    try:
        store = LmdbStore(path, readonly=True)
    except StoreError:
        raise AuditCommandError(f"{path} is not a queue state store with an audit chain") from None
    try:
        view = store.read()
        count, broken = verify(view)
        return count, broken, head(view)
    except StoreError as error:
        raise AuditCommandError(f"cannot read {path}: {error}") from None
    finally:
        store.close()


def _report(count: int, broken: Broken | None, head: Head | None, *, source: str) -> int:
    if broken is not None:
        print(f"compensator audit verify: {source}: broken at {broken.describe()}", file=sys.stderr)
        return 1
    summary: dict[str, object] = {"source": source, "entries": count, "verified": True}
    if head is not None:
        summary["head"] = head.hash.hex()
    print(json.dumps(summary))
    return 0


async def _verify_store(config: Config, label: str = "") -> int:
    queue = queue_client(config)
    try:
        verifier, hashes, stored = await _walk(queue)
    except (ClientError, QueueError) as error:
        raise AuditCommandError(f"the store at {','.join(config.store.addresses)} did not answer: {error}") from None
    finally:
        await queue.raft.close()
    broken = verifier.finish(stored)
    source = label + "store " + ",".join(config.store.addresses)
    if broken is not None:
        return _report(verifier.count, broken, stored, source=source)
    disagreeing = await _replica_heads(config, hashes)
    if disagreeing:
        print(f"compensator audit verify: {label}replicas whose chain is not the leader's: {'; '.join(disagreeing)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return _report(verifier.count, None, stored, source=source)


async def _walk(queue: QueueClient) -> tuple[ChainVerifier, dict[int, bytes], Head]:
    """The leader's chain, a page at a time from its start, through one verifier; the hash of
    every entry (32 bytes each: audit entries are people's actions, thousands, not millions)."""
    verifier = ChainVerifier()
    hashes: dict[int, bytes] = {0: verifier.last_hash}
    after = 0
    while True:
        answer = (await queue.audit_log(after=after, limit=AUDIT_PAGE_MAX)).value
        stored = Head(answer.count, answer.head)
        if not answer.entries or verifier.feed(answer.entries) is not None:
            return verifier, hashes, stored
        hashes.update((entry.seq, entry.hash) for entry in answer.entries)
        after = answer.entries[-1].seq


async def _replica_heads(config: Config, hashes: dict[int, bytes]) -> list[str]:
    """Each replica's head, read from that replica: it must be the leader's chain at its count (a
    replica may lag, never differ). A replica that does not answer is reported, not failed."""
    clients = replica_clients([parse_address(address) for address in config.store.addresses], store_auth(config))
    problems: list[str] = []
    try:
        for name, client in sorted(clients.items()):
            try:
                answer = (await client.audit_log(before=None, limit=1, stale_ok=True)).value
            except (ClientError, QueueError, OSError) as error:
                print(f"compensator audit verify: replica {name} did not answer: {error}", file=sys.stderr)
                continue
            expected = hashes.get(answer.count)
            if expected is None:  # entries written after the leader's chain was read: nothing to compare
                print(f"compensator audit verify: replica {name} is ahead of the chain read; not compared",
                      file=sys.stderr)  # fmt: skip
            elif expected != answer.head:
                problems.append(f"{name}'s head at entry {answer.count} is not the leader's entry {answer.count}")
    finally:
        await close_clients(clients)
    return problems
