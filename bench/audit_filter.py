"""How long a filtered page of the audit chain takes to read, over a chain of 100,000 entries.

    python -m bench.audit_filter --entries 100000 --json

In process, on a SQLite file built with the store's own tables and `audit_chain.append` (each
entry hashed and indexed as the machine writes it): 60% sign-ins (session and login documents),
5% user and password documents, the rest review actions by ten reviewers, one person who acted
ten times in the whole chain, and a leader time one second apart. Each filter's page of 50, newest
first, is read `--repeat` times; the median and the worst are reported, with SQLite's plan.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from queues import AuditFilter, audit_chain

SIGN_INS = ("document:sessions/", "document:logins/")
T0_MS = 1_790_000_000_000


def build(path: Path, entries: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    conn = sqlite3.connect(path)
    audit_chain.create_tables(conn)
    rare = set(rng.sample(range(entries), 10))
    for i in range(entries):
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
            conn, log_index=i + 1, ts_ms=T0_MS + i * 1000, actor=actor, action=action, target=target,
            reason="bench", before={"state": "dead"}, after={"state": "ready"},
            message_ids=(message_id,) if message_id else (),
        )  # fmt: skip
    conn.commit()
    conn.close()


def filters(conn: sqlite3.Connection, entries: int) -> dict[str, AuditFilter | None]:
    middle = T0_MS + entries // 2 * 1000
    (proposal,) = conn.execute(
        "SELECT target FROM audit WHERE seq > ? AND substr(target, 1, 9) = 'proposal:' LIMIT 1", (entries // 2,)
    ).fetchone()
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


def measure(path: Path, entries: int, repeat: int) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    results = []
    for name, selected in filters(conn, entries).items():
        timings = []
        found = 0
        for _ in range(repeat):
            started = time.perf_counter()
            found = len(audit_chain.entries_before(conn, None, limit=50, selected=selected))
            timings.append((time.perf_counter() - started) * 1000)
        where, params = audit_chain._selection(selected)
        plan = conn.execute(
            f"EXPLAIN QUERY PLAN SELECT seq FROM audit WHERE seq < ?{where} ORDER BY seq DESC LIMIT 50",
            (1 << 62, *params),
        ).fetchall()
        results.append({"filter": name, "entries": found, "median_ms": round(statistics.median(timings), 2),
                        "max_ms": round(max(timings), 2), "plan": " | ".join(str(row[-1]) for row in plan)})  # fmt: skip
    conn.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "audit.sqlite"
        started = time.perf_counter()
        build(path, args.entries)
        built_s = time.perf_counter() - started
        results = measure(path, args.entries, args.repeat)
    if args.json:
        print(json.dumps({"entries": args.entries, "build_s": round(built_s, 1), "pages": results}, indent=1))
        return
    for result in results:
        print(f"{result['filter']:40} {result['entries']:3} entries  median {result['median_ms']:8.2f} ms"
              f"  max {result['max_ms']:8.2f} ms  {result['plan']}")  # fmt: skip


if __name__ == "__main__":
    main()
