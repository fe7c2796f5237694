"""The replica audit: finds a replica whose state has diverged from the others', while the set runs.

    python -m queues.audit --addresses h1:p1,h2:p2,h3:p3 --secret-file F --once   # exit 0: agree, 1: diverged or corrupt
    python -m queues.audit --addresses h1:p1,h2:p2,h3:p3 --secret-file F          # every 10 s, logs at ERROR

Why: Raft makes every replica's *log* the same; their *states* are the same only if each applies
the log deterministically, with the same code, on a store nothing corrupted. A replica that breaks
that (a nondeterminism bug, mixed software versions during an upgrade, a flipped bit in its store's
file) keeps answering reads, and once it leads, it leases and deduplicates from a state no other
replica has, and nothing says so. CockroachDB's consistency checker and TigerBeetle's state
checksums exist for the same reason.

How: the event log is the replicated record of every effect (enqueued, leased, attempt failed,
succeeded, dead-lettered, redriven, discarded, ...), append-only and identical on every replica
once applied. The auditor asks each replica, by a stale read that replica serves itself, for the
digest of the same seq range (`EventsDigest`), and where the digests differ it bisects to the
first differing event and names the replicas that disagree with the majority. Its cursor follows
the log as the replicas apply it, up to the newest event every reachable replica has, so the
replicas never need to be at the same index. Events purged past their retention before the
auditor reached them are skipped and counted, never compared short.

Events carry no payload bytes, so each round also scrubs a range of messages on every replica
(`ScrubPayloads`): the replica recomputes each message's content hash from the kind, ref key and
payload it stores and names those that no longer match the hash stored at enqueue (or, for an
operator's edited payload, the hash stored with the edit). The scrub walks the ids and starts
over at the end, as a RAID or ZFS scrub does.

What it does not see: state that is in neither an event nor a content hash (an edited payload
written before edits stored their hash has none to be checked against).

Must never: write, or stop a replica. It reports (ERROR log, `AuditStats`, exit 1 with --once) and
a person decides; the usual repair is to wipe the diverged replica's data and let it rejoin, which
installs the leader's snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from queues import query_codec as qc
from queues.client import EventsPurged, QueueClient, QueueError
from queues.model import Event
from raft_store import cli as raft_cli
from raft_store.auth import StoreAuth
from raft_store.client import ClientError, RaftClient
from raft_store.process import configure_logging

log = logging.getLogger("queues.audit")

CHUNK_EVENTS = 4096
"""Events per compared range: one stale read of about 4096 rows per replica."""
SCRUB_CHUNK = 2000
"""Messages scrubbed per replica per round. A scrub read runs on the node's event loop: 2000
payloads of 1 KiB took 12 ms there (in process, warm cache; a digest of 4096 events 9 ms), so a
round never holds a node up for long. At one round per 10 s a replica of 10 M messages is
scrubbed end to end in about 14 hours."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first event where the replicas' logs differ, and who sides with whom."""

    seq: int
    agree: tuple[str, ...]
    """The majority (more than half of the replicas compared); empty when there is none."""
    differ: tuple[str, ...]
    events: Mapping[str, Event | None]
    """The event at `seq` as each replica stores it (None: it has none there)."""

    def describe(self) -> str:
        who = ",".join(self.differ)
        if self.agree:
            head = f"replica {who} diverged from {','.join(self.agree)} at event seq {self.seq}"
        else:
            head = f"replicas {who} disagree at event seq {self.seq} with no majority"
        shown = "; ".join(f"{name}: {_short(event)}" for name, event in sorted(self.events.items()))
        return f"{head} ({shown})"


def _short(event: Event | None) -> str:
    if event is None:
        return "none"
    # Not the event's data: it may hold a downstream's error text, and this line goes to logs.
    return f"{event.type.value} of message {event.message_id} at index {event.log_index} ts {event.ts_ms}"


@dataclass(slots=True)
class AuditStats:
    rounds: int = 0
    audited_through: int = 0
    """Every event up to this seq was compared on at least two replicas (or skipped as purged): the
    auditor's cursor, from which its next round starts."""
    events_compared: int = 0
    skipped_purged: int = 0
    """Events purged past their retention before the auditor reached them: never compared."""
    unreachable: int = 0
    """Rounds cut short because fewer than two replicas answered."""
    divergences: int = 0
    """Distinct divergences found (the same one found again in later rounds counts once)."""
    payloads_scrubbed: int = 0
    scrub_passes: int = 0
    """Passes completed over every message id, summed over the replicas."""
    corrupt_payloads: int = 0
    """(replica, message) pairs found corrupt, each counted once."""


@dataclass(slots=True)
class ReplicaAuditor:
    replicas: Mapping[str, QueueClient]
    """Name -> a client whose reader talks to that one replica (see `replica_clients`)."""
    chunk: int = CHUNK_EVENTS
    scrub_chunk: int = SCRUB_CHUNK
    stats: AuditStats = field(default_factory=AuditStats)
    last: Divergence | None = None
    """The divergence the latest round found, None when it found none."""
    corrupt: dict[str, set[int]] = field(default_factory=dict)
    """Per replica, the messages whose payload failed the latest scrub of their id."""
    _scrubbed: dict[str, int] = field(default_factory=dict)
    _reported: set[tuple[str, int]] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        if len(self.replicas) < 2:
            raise ValueError("an audit needs at least two replicas")
        if not 1 <= self.chunk <= qc.EVENTS_LIMIT_MAX or not 1 <= self.scrub_chunk <= qc.EVENTS_LIMIT_MAX:
            raise ValueError(f"chunks must be in [1, {qc.EVENTS_LIMIT_MAX}]")

    async def audit_once(self, *, scrub: bool = True) -> Divergence | None:
        """Compare every event from the cursor up to the newest one all reachable replicas have,
        then (with `scrub`) scrub the next `scrub_chunk` messages on every replica.

        Returns the first divergence (the cursor then stays before it, so the next round finds it
        again until it is repaired), or None when everything compared agreed. Corrupt payloads
        are in `corrupt`."""
        self.stats.rounds += 1
        found = await self._audit()
        if found is not None and (self.last is None or (found.seq, found.differ) != (self.last.seq, self.last.differ)):
            self.stats.divergences += 1
            log.error("replica divergence: %s", found.describe())
        self.last = found
        if scrub:
            await asyncio.gather(*(self._scrub(name, self.scrub_chunk) for name in sorted(self.replicas)))
        return found

    async def scrub_all(self) -> None:
        """One whole pass over every replica's messages, from wherever each scrub stands."""

        async def one(name: str) -> None:
            while not await self._scrub(name, qc.EVENTS_LIMIT_MAX):
                pass

        await asyncio.gather(*(one(name) for name in sorted(self.replicas)))

    async def _scrub(self, name: str, limit: int) -> bool:
        """Scrub the next `limit` ids of one replica. True when that finished a pass (or failed)."""
        after = self._scrubbed.get(name, 0)
        try:
            answer = (await self.replicas[name].scrub_payloads(after, limit, stale_ok=True)).value
        except (ClientError, QueueError, OSError) as error:
            log.warning("audit: replica %s did not answer the scrub: %r", name, error)
            self._scrubbed.pop(name, None)
            return True
        self.stats.payloads_scrubbed += answer.checked
        known = self.corrupt.setdefault(name, set())
        known.difference_update(range(after + 1, answer.through + 1))  # rechecked: only what failed now stays
        for message_id in answer.corrupt:
            known.add(message_id)
            if (name, message_id) not in self._reported:
                self._reported.add((name, message_id))
                self.stats.corrupt_payloads += 1
                log.error("replica %s stores message %d with a payload that does not match its content hash",
                          name, message_id)
        if not known:
            del self.corrupt[name]
        if answer.through >= answer.last_id:
            self._scrubbed[name] = 0
            self.stats.scrub_passes += 1
            return True
        self._scrubbed[name] = answer.through
        return False

    async def _audit(self) -> Divergence | None:
        bounds = await self._digests(self.stats.audited_through, 0, tuple(sorted(self.replicas)))
        if len(bounds) < 2:
            self.stats.unreachable += 1
            return None
        names = tuple(sorted(bounds))
        common = min(answer.last_seq for answer in bounds.values())
        while True:
            self._skip_purged(bounds)
            if self.stats.audited_through >= common:
                return None
            after = self.stats.audited_through
            answers = await self._digests(after, min(self.chunk, common - after), names)
            if len(answers) < len(names):
                self.stats.unreachable += 1
                return None
            if any(answer.first_seq > after + 1 for answer in answers.values()):
                bounds = answers  # a purge ran meanwhile: move past it and compare again
                continue
            if len({(a.through, a.count, a.digest) for a in answers.values()}) == 1:
                through = next(iter(answers.values())).through
                self.stats.events_compared += through - after
                self.stats.audited_through = through
                continue
            return await self._bisect(after, max(a.through for a in answers.values()), names)

    def _skip_purged(self, answers: Mapping[str, qc.DigestAnswer]) -> None:
        first = max(answer.first_seq for answer in answers.values())
        if self.stats.audited_through < first - 1:
            self.stats.skipped_purged += first - 1 - self.stats.audited_through
            self.stats.audited_through = first - 1

    async def _bisect(self, low: int, high: int, names: tuple[str, ...]) -> Divergence | None:
        """The first seq in (low, high] where the replicas differ; (low, high] is known to differ."""
        while high - low > 1:
            middle = (low + high) // 2
            answers = await self._digests(low, middle - low, names)
            if len(answers) < len(names) or any(a.first_seq > low + 1 for a in answers.values()):
                return None  # a replica went away or a purge ran: the next round starts over
            if len({(a.count, a.digest) for a in answers.values()}) == 1:
                low = middle
            else:
                high = middle
        answers = await self._digests(low, 1, names)
        if len(answers) < len(names):
            return None
        groups: dict[tuple[int, bytes], list[str]] = {}
        for name, answer in answers.items():
            groups.setdefault((answer.count, answer.digest), []).append(name)
        largest = max(groups.values(), key=len)
        agree = tuple(sorted(largest)) if 2 * len(largest) > len(names) else ()
        differ = tuple(name for name in names if name not in agree)
        return Divergence(seq=high, agree=agree, differ=differ, events=await self._events_at(high, names))

    async def _digests(self, after: int, limit: int, names: tuple[str, ...]) -> dict[str, qc.DigestAnswer]:
        async def one(name: str) -> qc.DigestAnswer | None:
            try:
                read = await self.replicas[name].events_digest(after, limit, stale_ok=True)
            except (ClientError, QueueError, OSError) as error:
                log.warning("audit: replica %s did not answer: %r", name, error)
                return None
            return read.value

        found = await asyncio.gather(*(one(name) for name in names))
        return {name: answer for name, answer in zip(names, found, strict=True) if answer is not None}

    async def _events_at(self, seq: int, names: tuple[str, ...]) -> dict[str, Event | None]:
        events: dict[str, Event | None] = {}
        for name in names:
            try:
                read = await self.replicas[name].events_after(seq - 1, limit=1, stale_ok=True)
            except (ClientError, QueueError, EventsPurged, OSError):
                events[name] = None
                continue
            events[name] = read.value[0] if read.value and read.value[0].seq == seq else None
        return events

    # ---- as a background task --------------------------------------------------------------
    def start(self, every_s: float = 10.0) -> asyncio.Task[None]:
        assert self._task is None, "already started"
        self._task = asyncio.get_running_loop().create_task(self.run(every_s), name="replica-audit")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self, every_s: float = 10.0) -> None:
        while True:
            await self.audit_once()
            await asyncio.sleep(every_s)


def replica_clients(addresses: list[tuple[str, int]], auth: StoreAuth) -> dict[str, QueueClient]:
    """One read-only QueueClient per replica, named host:port, each reading from that replica only."""
    clients: dict[str, QueueClient] = {}
    for host, port in addresses:
        raft = RaftClient([(host, port)], auth=auth, attempt_timeout_s=2.0, deadline_s=4.0)
        clients[f"{host}:{port}"] = QueueClient(raft, coalesce=False)
    return clients


async def close_clients(clients: Mapping[str, QueueClient]) -> None:
    for client in clients.values():
        await client.raft.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not host:port: {text!r}")
    return host, int(port)


async def _main(addresses: list[tuple[str, int]], auth: StoreAuth, *, once: bool, every_s: float) -> int:
    clients = replica_clients(addresses, auth)
    try:
        auditor = ReplicaAuditor(clients)
        if not once:
            await auditor.run(every_s)
        found = await auditor.audit_once(scrub=False)
        await auditor.scrub_all()
        corrupt = {name: sorted(ids) for name, ids in sorted(auditor.corrupt.items())}
        print(json.dumps({**asdict(auditor.stats), "diverged": found is not None, "corrupt": corrupt}), flush=True)
        if found is not None:
            print(f"queues.audit: {found.describe()}", file=sys.stderr)
            return 1
        if corrupt:
            listed = "; ".join(f"{name}: {', '.join(map(str, ids[:10]))}" for name, ids in corrupt.items())
            print(f"queues.audit: payloads that do not match their content hash: {listed}", file=sys.stderr)
            return 1
        if auditor.stats.unreachable:
            print("queues.audit: fewer than two replicas answered; nothing was compared", file=sys.stderr)
            return 2
        return 0
    finally:
        await close_clients(clients)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queues.audit", description=__doc__.split("\n\n")[1])
    parser.add_argument("--addresses", required=True, help="every replica of the set: host:port,host:port,...")
    parser.add_argument("--once", action="store_true", help="audit up to the newest common event, then exit")
    parser.add_argument("--every-s", type=float, default=10.0, help="seconds between rounds (without --once)")
    raft_cli.add_auth_arguments(parser)
    args = parser.parse_args(argv)
    try:
        addresses = [_address(a) for a in args.addresses.split(",") if a]
    except ValueError as error:
        parser.error(str(error))
    if len(addresses) < 2:
        parser.error("--addresses needs at least two replicas")
    if args.every_s <= 0:
        parser.error("--every-s must be positive")
    try:
        auth = raft_cli.store_auth(args)
    except raft_cli.UsageError as error:
        parser.error(str(error))
    configure_logging("warning")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(addresses, auth, once=args.once, every_s=args.every_s))
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
