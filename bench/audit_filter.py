"""How long a filtered page of the audit chain takes to read, over a chain of 100,000 entries.

    python -m bench.audit_filter --entries 100000 --json

In process, on an LMDB store as a node opens it, built with `audit_chain.append` (each entry hashed
and indexed as an operator command writes it): 60% sign-ins (session and login documents), 5% user
and password documents, the rest review actions by ten reviewers, one person who acted ten times in
the whole chain, and a leader time one second apart. Each filter's page of 50, newest first, is read
`--repeat` times; the median and the worst are reported, with the index that drives the read and
how many entries it read to fill the page.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from queues import AuditFilter
from queues.core import audit_chain, keys
from queues.core.entry import load_meta
from queues.core.port import KvRead, Table
from queues.core.records import encode
from queues.stores.lmdb_store import LmdbStore

SIGN_INS = ("document:sessions/", "document:logins/")
T0_MS = 1_790_000_000_000


def build(store: LmdbStore, entries: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    rare = set(rng.sample(range(entries), 10))
    for start in range(0, entries, 1000):
        with store.write() as tx:
            meta = load_meta(tx)
            for i in range(start, min(entries, start + 1000)):
                draw = rng.random()
                message_id = 0
                if i in rare:
                    actor, action, target = "auditor-x", "discarded", f"message:{i}"
                    message_id = i
                elif draw < 0.4:
                    actor, action, target = f"reviewer-{i % 10}", "document_put", f"document:sessions/{i:064x}"
                elif draw < 0.6:
                    actor, action, target = f"reviewer-{i % 10}", "document_put", f"document:logins/reviewer-{i % 10}"
                elif draw < 0.65:
                    actor, action, target = "admin", "document_put", f"document:users/user-{i % 50}"
                elif draw < 0.9:
                    actor, action, target, message_id = f"reviewer-{i % 10}", "redriven", f"message:{i}", i
                elif draw < 0.95:
                    actor, action, target, message_id = f"reviewer-{i % 10}", rng.choice(("propose", "approve")), f"proposal:{i // 3}", i
                elif draw < 0.98:
                    actor, action, target, message_id = f"reviewer-{i % 10}", "edit_redrive", f"message:{i}", i
                else:
                    actor, action, target, message_id = f"reviewer-{i % 10}", "discarded", f"message:{i}", i
                audit_chain.append(
                    tx, meta, log_index=i + 1, ts_ms=T0_MS + i * 1000, actor=actor, action=action, target=target,
                    reason="bench", before={"state": "dead"}, after={"state": "ready"},
                    message_ids=(message_id,) if message_id else (),
                )  # fmt: skip
            tx.put(Table.META, keys.STATE, encode(meta))
        store.commit()


def filters(view: KvRead, entries: int) -> dict[str, AuditFilter | None]:
    middle = T0_MS + entries // 2 * 1000
    proposal = next(e.target for e in audit_chain.entries_after(view, entries // 2, limit=1000)
                    if e.target.startswith("proposal:"))  # fmt: skip
    default = AuditFilter(exclude_target_prefixes=SIGN_INS)
    return {
        "none": None,
        "sign-ins hidden (the page's default)": default,
        "actor with 10 entries in the chain": AuditFilter(actor="auditor-x", exclude_target_prefixes=SIGN_INS),
        "action edit_redrive": AuditFilter(actions=("edit_redrive",), exclude_target_prefixes=SIGN_INS),
        "target prefix document:users/": AuditFilter(target_prefix="document:users/"),
        "target proposal:<n>": AuditFilter(target=proposal),
        "a request (message id)": AuditFilter(message_id=entries // 2 + 1),
        "one hour in the middle": AuditFilter(from_ms=middle, to_ms=middle + 3_600_000, exclude_target_prefixes=SIGN_INS),
        "actor and one hour": AuditFilter(actor="reviewer-3", from_ms=middle, to_ms=middle + 3_600_000),
    }


def measure(view: KvRead, entries: int, repeat: int) -> list[dict[str, Any]]:
    results = []
    for name, selected in filters(view, entries).items():
        timings = []
        found = 0
        for _ in range(repeat):
            started = time.perf_counter()
            found = len(audit_chain.entries_before(view, None, limit=50, selected=selected))
            timings.append((time.perf_counter() - started) * 1000)
        results.append({"filter": name, "entries": found, "median_ms": round(statistics.median(timings), 2),
                        "max_ms": round(max(timings), 2), "index": audit_chain.driver(selected)})  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = LmdbStore(Path(directory) / "audit.lmdb")
        started = time.perf_counter()
        build(store, args.entries)
        built_s = time.perf_counter() - started
        results = measure(store.read(), args.entries, args.repeat)
        store.close()
    if args.json:
        print(json.dumps({"entries": args.entries, "build_s": round(built_s, 1), "pages": results}, indent=1))
        return
    for result in results:
        print(f"{result['filter']:40} {result['entries']:3} entries  median {result['median_ms']:8.2f} ms"
              f"  max {result['max_ms']:8.2f} ms  {result['index']}")  # fmt: skip


if __name__ == "__main__":
    main()
