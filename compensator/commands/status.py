"""``compensator status``: the set's health and backlog on one screen, for the on-call engineer.

    compensator status [--config FILE] [--json]

Answers "is the store up, who leads, is anyone behind, how much is waiting and for how long, which
downstream is cut off, how far behind are the ledger projector and the events publisher" from one
status call per node and five reads served by the leader, all at once, plus one query of the
ledger's PostgreSQL for the projector's cursor (COMPENSATOR_PG_DSN, or the local run's embedded
server when it is up; never one started from here), so it answers within a second. The Kafka
ingest's lag is the broker's to tell: its metric, `compensator_kafka_ingest_lag`. Exit 0 when a leader answered and every node is within
`api.ready_lag_entries_max` of its commit index; 1 (with the picture printed) when not; a one-line
error when no node answers at all.

With `store.control_addresses` it also lists the control set and every set of its table (leader,
commit, nodes up), and the kinds' depths and oldest due ages are the whole store's: every set's,
summed (a set that serves no reads is marked, and its requests are missing from the sums).

Must never: write to the store (reading the health of a sick set must not add to its load), or
print a token or secret.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compensator.commands.run import local_pg_data
from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from compensator.store import control_set, queue_client, raft_client
from ledger import pg
from ledger.kinds import DOWNSTREAM_OF
from queues import ClientError, QueueClient, QueueError, SetsClient, State
from services.kafka.publisher_lease import NAMESPACE as PUBLISHER_NAMESPACE
from services.projector import ledger_writer
from services.worker.breaker import holder

_STATES = [state.value for state in State]


class StatusError(ValueError):
    """No node answered: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    status = subparsers.add_parser("status", help="the set's health, depth per kind and state, breakers")
    add_config_argument(status)
    status.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    status.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_for(args)
    report = asyncio.run(gather(config))
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["healthy"] else 1


async def gather(config: Config) -> dict[str, Any]:
    queue = queue_client(config)
    try:
        nodes = await queue.node_statuses()
        if all("error" in node for node in nodes):
            raise StatusError("no store node answered: " + "; ".join(f"{n['address']}: {n['error']}" for n in nodes))
        try:
            counts, ages, kinds, digest, publishers = await asyncio.gather(
                queue.counts(), queue.oldest_due_age_ms(), queue.kinds(), queue.events_digest(0, 0),
                queue.documents(PUBLISHER_NAMESPACE),
            )  # fmt: skip
        except (ClientError, QueueError) as error:
            raise StatusError(f"the nodes answer but the set serves no reads (no leader?): {error}") from None
    finally:
        await queue.raft.close()
    last_seq = digest.value.last_seq
    followers = [_publisher(doc.name, doc.body, doc.updated_ms, last_seq, counts.now_ms) for doc in publishers.value.documents]
    followers.append(await _projector(config, last_seq, config.store.set_id))
    sets, others = await _sets(config) if config.store.control_addresses else ([], [])
    for other in others:
        followers.append(await _projector(config, other.last_seq, other.set_id))
    leaders = [node for node in nodes if node.get("role") == "leader"]
    leader = max(leaders, key=lambda node: int(node.get("term", 0)), default=None)
    commit = (
        int(leader["commit"]) if leader else max(int(node.get("commit", 0)) for node in nodes if "error" not in node)
    )
    lag_max = config.api.ready_lag_entries_max
    node_rows = [_node_row(node, commit) for node in nodes]
    healthy = leader is not None and all(row["lag"] is not None and row["lag"] <= lag_max for row in node_rows)
    depth: dict[str, dict[str, int]] = {}
    oldest = dict(ages.value)
    for found in [counts.value, *(other.counts for other in others)]:
        for (kind, state), count in found.items():
            by_state = depth.setdefault(kind, dict.fromkeys(_STATES, 0))
            by_state[state] = by_state.get(state, 0) + count
    for other in others:
        for kind, age in other.ages.items():
            oldest[kind] = max(age, oldest.get(kind, age))
    pauses = {view.kind: view.pauses for view in kinds.value}
    breakers = []
    for downstream in sorted(set(DOWNSTREAM_OF.values())):
        names = sorted(kind.value for kind, target in DOWNSTREAM_OF.items() if target == downstream)
        held = [p for name in names for p in pauses.get(name, ()) if p.holder == holder(downstream)]
        breakers.append({"downstream": downstream, "state": "open" if held else "closed", "kinds": names,
                         "since_ms": held[0].since_ms if held else None, "reason": held[0].reason if held else None})  # fmt: skip
    return {
        "healthy": healthy and all(found["healthy"] for found in sets),
        "sets": sets,
        "leader": int(leader["node"]) if leader else None,
        "term": int(leader["term"]) if leader else None,
        "commit": commit,
        "nodes": node_rows,
        "depth": dict(sorted(depth.items())),
        "oldest_due_age_ms": dict(sorted(oldest.items())),
        "paused": {kind: [p.holder for p in held] for kind, held in sorted(pauses.items()) if held},
        "breakers": breakers,
        "last_event_seq": last_seq,
        "followers": followers,
        "now_ms": counts.now_ms,
    }


def _publisher(topic: str, body: bytes | None, updated_ms: int, last_seq: int, now_ms: int) -> dict[str, Any]:
    """An events publisher's cursor in the store (services/kafka/publisher_lease.py's document)."""
    document = json.loads(body) if body else {}
    cursor = int(document.get("cursor", 0))
    live = document.get("holder") is not None and now_ms - updated_ms < int(document.get("lease_ms", 0))
    return {"name": f"events publisher ({topic})", "cursor": cursor, "lag_events": max(0, last_seq - cursor),
            "holder": document.get("holder") if live else None}  # fmt: skip


async def _projector(config: Config, last_seq: int, set_id: int) -> dict[str, Any]:
    """A set's ledger projector's cursor, from its PostgreSQL: the configured one, or the local run's
    embedded server if it is running (never started from here)."""
    name = "ledger projector" if not config.store.control_addresses else f"ledger projector (set {set_id})"
    row: dict[str, Any] = {"name": name, "cursor": None, "lag_events": None, "holder": None}
    dsn = pg.dsn_from_env() or pg.EmbeddedPostgres(local_pg_data(config)).running_dsn()
    if dsn is None:
        return row | {"error": "no ledger database (COMPENSATOR_PG_DSN) to read its cursor from"}
    import asyncpg

    try:
        connection = await asyncpg.connect(dsn, timeout=1.0)
        try:
            found = await connection.fetchrow("SELECT * FROM projector_cursors WHERE set_id = $1", set_id)
            locked = await ledger_writer.lock_held(connection, set_id)
        finally:
            await connection.close()
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        return row | {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
    if found is None:
        return row | {"error": "no cursor yet: the projector has not written this set"}
    cursor = int(found["last_seq"])
    return row | {"cursor": cursor, "lag_events": max(0, last_seq - cursor), "holder": found["owner"] or None,
                  "lock_held": locked, "stopped": found.get("stopped_reason")}  # fmt: skip


def _projector_holder(follower: dict[str, Any]) -> str:
    """Who projects the set: the cursor row's owner is only the last process that wrote, and a set
    with no batch yet has none, so whether a projector holds the lock now is said beside it."""
    owner, held = str(follower["holder"] or ""), bool(follower["lock_held"])
    if owner and held:
        return owner
    if owner:
        return f"last written by {owner}; no projector holds its lock"
    return "a projector holds its lock; nothing written yet" if held else "nobody holds it"


@dataclass(frozen=True)
class _OtherSet:
    """What a set other than the home set adds to the picture: its depth, its oldest due ages and
    its last event (for its projector's lag)."""

    set_id: int
    counts: dict[tuple[str, str], int]
    ages: dict[str, int]
    last_seq: int


async def _sets(config: Config) -> tuple[list[dict[str, Any]], list[_OtherSet]]:
    """The control set and each set of its table: id, addresses, leader, commit, healthy (every
    node within `api.ready_lag_entries_max` of its leader's commit); and each other set's depth,
    so that the kinds' table is the whole store's. Never raises: a control set that cannot be read,
    or a set that serves no reads, is a row saying so."""
    control = control_set(config)
    rows = [_set_row(0, config.store.control_addresses, await control.queue.node_statuses(), config)]
    try:
        sets = await SetsClient.from_control(control, connect=lambda _set_id, addresses: QueueClient(
            raft_client(config, control.queue.raft.auth, addresses)))  # fmt: skip
    except (ClientError, QueueError, ValueError) as error:
        rows[0]["error"] = f"the set table could not be read: {error}"
        rows[0]["healthy"] = False
        await control.queue.raft.close()
        return rows, []
    try:
        rows += [_set_row(found.set_id, found.addresses, found.nodes, config) for found in await sets.statuses()]
        wanted = [row for row in rows[1:] if row["set"] != config.store.set_id and row["set"] in sets.clients]
        # All at once: a set without a leader costs the whole picture one store deadline, not one per set.
        found = await asyncio.gather(*(_other(row, sets.clients[row["set"]]) for row in wanted))
    finally:
        await sets.close()
    return rows, [other for other in found if other is not None]


async def _other(row: dict[str, Any], queue: QueueClient) -> _OtherSet | None:
    """A set's depth, ages and last event; None (and its row marked) when it serves no reads."""
    try:
        counts, ages, digest = await asyncio.gather(queue.counts(), queue.oldest_due_age_ms(), queue.events_digest(0, 0))
    except (ClientError, QueueError) as error:
        row["error"] = f"serves no reads (its requests are not in the table below): {error}"
        row["healthy"] = False
        return None
    return _OtherSet(row["set"], dict(counts.value), dict(ages.value), digest.value.last_seq)


def _set_row(set_id: int, addresses: Sequence[str], nodes: list[dict[str, Any]], config: Config) -> dict[str, Any]:
    leaders = [node for node in nodes if node.get("role") == "leader"]
    leader = max(leaders, key=lambda node: int(node.get("term", 0)), default=None)
    commit = int(leader["commit"]) if leader else None
    lags = [commit - int(node.get("applied", 0)) for node in nodes if commit is not None and "error" not in node]
    healthy = leader is not None and len(lags) == len(nodes) and max(lags) <= config.api.ready_lag_entries_max
    return {"set": set_id, "addresses": list(addresses), "leader": int(leader["node"]) if leader else None,
            "commit": commit, "nodes_up": sum(1 for node in nodes if "error" not in node), "nodes": len(nodes),
            "healthy": healthy, "error": None}  # fmt: skip


def _node_row(node: dict[str, Any], commit: int) -> dict[str, Any]:
    if "error" in node:
        return {"address": node["address"], "node": None, "role": "down", "term": None, "applied": None,
                "lag": None, "error": node["error"]}  # fmt: skip
    applied = int(node.get("applied", 0))
    return {"address": node["address"], "node": int(node["node"]), "role": str(node.get("role", "?")),
            "term": int(node.get("term", 0)), "applied": applied, "lag": max(0, commit - applied), "error": None}  # fmt: skip


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(report: dict[str, Any]) -> str:
    lines = []
    if report["leader"] is None:
        lines.append("store: NO LEADER")
    else:
        lines.append(f"store: leader node {report['leader']}, term {report['term']}, commit {report['commit']}"
                     + ("" if report["healthy"] else "  (UNHEALTHY)"))  # fmt: skip
    for row in report["nodes"]:
        if row["error"]:
            lines.append(f"  {row['address']:<21} DOWN  {row['error']}")
        else:
            lines.append(f"  {row['address']:<21} node {row['node']}  {row['role']:<9} term {row['term']:<4}"
                         f" applied {row['applied']:<10} lag {row['lag']}")  # fmt: skip
    for found in report.get("sets", []):
        name = "control set" if found["set"] == 0 else f"set {found['set']}"
        state = found["error"] or (f"leader node {found['leader']}, commit {found['commit']}" if found["leader"]
                                   else "NO LEADER")  # fmt: skip
        lines.append(f"{name:<12} {','.join(found['addresses'])}  {state}, {found['nodes_up']}/{found['nodes']} nodes up"
                     + ("" if found["healthy"] else "  (UNHEALTHY)"))  # fmt: skip
    lines.append("")
    header = f"{'kind':<14}" + "".join(f"{state:>11}" for state in _STATES) + f"{'oldest due':>12}  paused by"
    lines.append(header)
    for kind, by_state in report["depth"].items():
        paused = ", ".join(report["paused"].get(kind, [])) or "-"
        lines.append(f"{kind:<14}" + "".join(f"{by_state[state]:>11}" for state in _STATES)
                     + f"{_age(report['oldest_due_age_ms'].get(kind)):>12}  {paused}")  # fmt: skip
    if not report["depth"]:
        lines.append("(no requests)")
    lines.append("")
    lines.append(f"events: last seq {report['last_event_seq']}")
    for follower in report["followers"]:
        if follower.get("error"):
            lines.append(f"  {follower['name']}: {follower['error']}")
        else:
            holder = (_projector_holder(follower) if "lock_held" in follower else follower["holder"]) or "nobody holds it"
            lines.append(f"  {follower['name']}: cursor {follower['cursor']}, {follower['lag_events']} behind ({holder})")
            if follower.get("stopped"):
                lines.append(f"    STOPPED: {follower['stopped']}")
    lines.append("")
    for breaker in report["breakers"]:
        state = breaker["state"]
        if state == "open":
            open_s = (report["now_ms"] - breaker["since_ms"]) / 1000
            state = f"OPEN for {_age(int(open_s * 1000))}: {breaker['reason'] or 'no reason given'}"
        lines.append(f"breaker {breaker['downstream']:<11} {state}  ({', '.join(breaker['kinds'])})")
    return "\n".join(lines)
