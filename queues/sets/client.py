"""Many sets as one store: intake routed by key, operations on a message routed by its set, and
reads that span the sets merged (docs/sets.md).

    sets = SetsClient(table, connect=lambda set_id, addresses: QueueClient(RaftClient(...)),
                      control=ControlSet(control_queue))
    placed = await sets.enqueue_many([Enqueue(...), ...])   # [(set id, result), ...] in input order

Owns: the cached set table and one `QueueClient` per set; routing an enqueue by the table's
active epochs (queues/sets/routing.py), with the linearizable cross-set lookup for the few keys
whose candidate changed between epochs; retrying a batch part a set refused as ROUTE_STALE once
the table is re-read. Calls to different sets run concurrently and each is bounded by its own
client's deadline, so a set without a majority fails only the keys routed to it.

Must never: send a new key to a set other than its home by the table it read, or let one set's
failure fail another set's items.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from queues.client import QueueClient, with_request_id
from queues.client_reads import QueueError
from queues.model import Code, Enqueue, EnqueueResult, ErrorResult, MessageView, RouteFence, RouteResult
from queues.sets import routing, settings, table
from queues.sets.frames import IN_FLIGHT, HeldFrames
from queues.sets.table import SetTable, TableError
from raft_store import codec
from raft_store.client import ClientError, Unavailable

log = logging.getLogger("queues.sets")

STALE_RETRIES: Final = 2
"""Times a batch part refused as ROUTE_STALE is routed again after re-reading the table (a second
add during the first retry is the only reason for more than one)."""

RETIRE_AFTER_S: Final = 1.0
"""How long after its last possible call a moved set's old client is closed (`SetsClient._retire`)."""
READ_WAIT_MAX_S: Final = codec.READ_WAIT_MS_MAX / 1000

STALE_PAUSE_S: Final = 0.05
"""How long to wait before routing again when the table read is older than a set's fence: the
newer epoch is pending (its add fences, then activates it, within milliseconds)."""

Placed = tuple[int, EnqueueResult | ClientError | QueueError]
"""An enqueue's set and its result, or the error of the call to that set (the item's own answer)."""
Connect = Callable[[int, tuple[str, ...]], QueueClient]
RepairObserver = Callable[[list[int], "dict[int, list[settings.Setting] | Exception] | None"], None]
"""Told of each pass of the settings repair: the sets compared, and what it re-applied per set or
the error that kept a set from being compared (None: the intended settings could not be read)."""


class UnknownSet(LookupError):
    """A set id the table does not name (an id of a set that does not exist: the API's 404)."""


class ControlSet:
    """The control set: a queue machine whose `sets` documents hold the set table."""

    def __init__(self, queue: QueueClient) -> None:
        self.queue = queue

    async def read(self) -> tuple[SetTable | None, int]:
        """The table (None while none was written) and the namespace's version, linearizably."""
        answer = (await self.queue.documents(table.NAMESPACE)).value
        for document in answer.documents:
            if document.name == table.DOCUMENT:
                return table.decode(document.body), answer.version
        return None, answer.version

    async def write(self, new: SetTable, *, expected_version: int, actor: str, reason: str) -> int:
        """Replace the table, audited with actor and reason. Refused (TableError) when the table
        changed since `expected_version` was read: two operators adding sets at once must not
        both write an epoch N, so the write is a compare and set in the control set's log."""
        result = await self.queue.put_document(table.NAMESPACE, table.DOCUMENT, table.encode(new), actor=actor,
                                               reason=reason, expected_version=expected_version)  # fmt: skip
        if result.code is Code.CONFLICT:
            raise TableError(f"the set table changed while this command ran (version {result.version}, read"
                             f" {expected_version}); run it again")  # fmt: skip
        if result.code is not Code.OK:
            raise TableError(f"the control set refused the table: {result.code.name}")
        return result.version


@dataclass(frozen=True, slots=True)
class SetStatus:
    set_id: int
    addresses: tuple[str, ...]
    nodes: list[dict[str, object]]


class RetiredClients:
    """Moved sets' old clients, each closed once no call on it can still run: every call ends by its
    client's deadline plus the longest a read may wait at the node (`RETIRE_AFTER_S` beyond that).
    Without a running loop (a table given at construction) one waits for `SetsClient.close`."""

    def __init__(self) -> None:
        self.clients: list[QueueClient] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, old: QueueClient) -> None:
        self.clients.append(old)
        try:
            task = asyncio.get_running_loop().create_task(self._close_later(old), name="sets-retire")
        except RuntimeError:
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_later(self, old: QueueClient) -> None:
        await asyncio.sleep(old.raft.deadline_s + READ_WAIT_MAX_S + RETIRE_AFTER_S)
        if old in self.clients:
            self.clients.remove(old)
            await old.raft.close()

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class SetsClient:
    """The facade over every set of the table (see the module docstring)."""

    def __init__(
        self, set_table: SetTable, *, connect: Connect, control: ControlSet | None = None, refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic, in_flight: int = IN_FLIGHT,
    ) -> None:  # fmt: skip
        self._connect = connect
        self._in_flight = in_flight
        self.control = control
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at = clock()
        self._refreshing: asyncio.Future[bool] | None = None
        self.clients: dict[int, QueueClient] = {}
        self.frames: dict[int, HeldFrames] = {}  # intake to each set, one frame on its way (frames.py)
        self._retired = RetiredClients()
        self.table = SetTable()
        self._use(set_table)

    @classmethod
    def single(cls, set_id: int, queue: QueueClient) -> SetsClient:
        """One set and no control set: today's deployment seen through the facade."""
        one = table.first_table({set_id: tuple(f"{host}:{port}" for host, port in queue.raft.addresses)})
        return cls(one, connect=lambda _set_id, _addresses: queue)

    @classmethod
    async def from_control(cls, control: ControlSet, *, connect: Connect, refresh_s: float = 30.0) -> SetsClient:
        """The sets of the table the control set holds now (TableError while it holds none)."""
        found, _ = await control.read()
        if found is None or not found.active():
            raise TableError("the control set holds no set table yet (run `compensator sets init`)")
        return cls(found, connect=connect, control=control, refresh_s=refresh_s)

    @classmethod
    def lazy(cls, control: ControlSet, *, connect: Connect, refresh_s: float = 30.0) -> SetsClient:
        """No table yet: the first `refresh` (or enqueue) reads it. For a process built before its
        loop runs (the API under uvicorn)."""
        return cls(SetTable(), connect=connect, control=control, refresh_s=refresh_s)

    def _use(self, new: SetTable) -> None:
        for entry in new.sets:
            current = self.clients.get(entry.id)
            if current is None or self.table.addresses().get(entry.id) != entry.addresses:
                if current is not None:
                    self._retired.add(current)
                self.clients[entry.id] = self._connect(entry.id, entry.addresses)
                self.frames[entry.id] = HeldFrames(self.clients[entry.id], in_flight=self._in_flight)
        self.table = new

    @property
    def set_ids(self) -> list[int]:
        return sorted(self.clients)

    def client(self, set_id: int) -> QueueClient:
        try:
            return self.clients[set_id]
        except KeyError:
            raise UnknownSet(set_id) from None

    async def client_of(self, set_id: int) -> QueueClient:
        """The set's client, re-reading the table first if the set is new to this process."""
        if set_id not in self.clients:
            await self.refresh()
        return self.client(set_id)

    # ---- the table -------------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """Re-read the table from the control set (one read for every concurrent caller). False
        when it cannot be read: the cached table stays in use."""
        if self.control is None:
            return False
        if self._refreshing is not None:
            return await asyncio.shield(self._refreshing)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._refreshing = future
        try:
            found, _ = await self.control.read()
            if found is not None and found.active():
                self._use(found)
            self._read_at = self._clock()
            future.set_result(True)
        except (ClientError, QueueError, TableError) as error:
            log.warning("the set table could not be read from the control set; the cached one stays: %s", error)
            future.set_result(False)
        finally:
            self._refreshing = None
        return future.result()

    async def refresh_if_due(self) -> None:
        """Re-read the table when the cached one is older than the refresh period (readers that
        span every set call it first, so a set added since is read too)."""
        await self._fresh_enough()

    async def _fresh_enough(self) -> None:
        if self.control is not None and self._clock() - self._read_at >= self._refresh_s:
            self._read_at = self._clock()  # one refresh per period, whatever its outcome
            await self.refresh()

    # ---- intake ----------------------------------------------------------------------------------
    async def enqueue_many(self, items: Sequence[Enqueue]) -> list[Placed]:
        """Each enqueue in its key's home set, the results in input order with their set's id.
        Items whose set failed carry the error (`Unavailable`, `OutcomeUnknown`: retry with the
        same key), the other sets' items their results."""
        await self._fresh_enough()
        if not self.table.active() and not (await self.refresh() and self.table.active()):
            unknown = Unavailable("no set table read from the control set yet: nothing was stored",
                                  last_error="no set table", last_address=None)  # fmt: skip
            return [(0, unknown) for _ in items]
        stamped = [with_request_id(item) for item in items]
        placed: list[Placed | None] = [None] * len(stamped)
        waiting = list(range(len(stamped)))
        for attempt in range(STALE_RETRIES + 1):
            stale = await self._route_and_send(stamped, waiting, placed)
            if not stale:
                break
            if attempt == STALE_RETRIES or not await self.refresh():
                for index, set_id, result in stale:  # nothing stored: the caller may retry (503)
                    placed[index] = (set_id, Unavailable(
                        f"set {set_id} is fenced at route epoch {result.min_route_epoch}, newer than the set"
                        " table this process could read: nothing was stored",
                        last_error="ROUTE_STALE", last_address=None))  # fmt: skip
                break
            if self.table.newest_active().epoch < max(result.min_route_epoch for _, _, result in stale):
                await asyncio.sleep(STALE_PAUSE_S * (attempt + 1))  # the epoch is still pending: its add is mid-way
                await self.refresh()
            waiting = [index for index, _, _ in stale]
        assert all(p is not None for p in placed)
        return [p for p in placed if p is not None]

    async def _route_and_send(
        self, items: Sequence[Enqueue], waiting: Sequence[int], placed: list[Placed | None]
    ) -> list[tuple[int, int, RouteResult]]:
        """Route and send the waiting items; those refused as ROUTE_STALE, to route again."""
        epochs = self.table.active()
        epoch = epochs[-1]
        homes: dict[int, int] = {}
        asked: dict[int, list[int]] = {}
        for index in waiting:
            lookups = routing.lookups(items[index].idempotency_key, epochs)
            if not lookups:
                homes[index] = routing.candidate(items[index].idempotency_key, epoch)
            for set_id in lookups:
                asked.setdefault(set_id, []).append(index)
        if asked:
            holders = await self._holders(items, asked, placed)
            for index in {i for indexes in asked.values() for i in indexes}:
                if placed[index] is None:
                    homes[index] = routing.home(items[index].idempotency_key, epochs, holders.get(index, ()))
        by_set: dict[int, list[int]] = {}
        for index, set_id in homes.items():
            by_set.setdefault(set_id, []).append(index)
        stale: list[tuple[int, int, RouteResult]] = []

        async def send(set_id: int, indexes: list[int]) -> None:
            commands = [msgspec.structs.replace(items[i], route_epoch=epoch.epoch) for i in indexes]
            try:
                self.client(set_id)  # UnknownSet
                results = await self.frames[set_id].submit_many(commands)
            except (ClientError, QueueError) as error:
                for index in indexes:
                    placed[index] = (set_id, error)
                return
            for index, result in zip(indexes, results, strict=True):
                if isinstance(result, RouteResult) and result.code is Code.ROUTE_STALE:
                    stale.append((index, set_id, result))
                elif isinstance(result, EnqueueResult):
                    placed[index] = (set_id, result)
                else:
                    placed[index] = (set_id, QueueError(result if isinstance(result, ErrorResult) else repr(result)))

        await asyncio.gather(*(send(set_id, indexes) for set_id, indexes in sorted(by_set.items())))
        return stale

    async def _holders(
        self, items: Sequence[Enqueue], asked: dict[int, list[int]], placed: list[Placed | None]
    ) -> dict[int, list[int]]:
        """Which of the asked sets hold each item's key: one linearizable read per set. An item
        whose lookup failed cannot be placed safely and is answered with that set's error."""
        holders: dict[int, list[int]] = {}

        async def ask(set_id: int, indexes: list[int]) -> None:
            keys = sorted({items[i].idempotency_key for i in indexes})
            try:
                found = (await self.client(set_id).by_idempotency_keys(keys)).value
            except (ClientError, QueueError) as error:
                for index in indexes:
                    placed[index] = (set_id, error)
                return
            held = {view.idempotency_key for view in found}
            for index in indexes:
                if items[index].idempotency_key in held:
                    holders.setdefault(index, []).append(set_id)

        await asyncio.gather(*(ask(set_id, indexes) for set_id, indexes in sorted(asked.items())))
        return holders

    # ---- reads across the sets --------------------------------------------------------------------
    async def by_ref_key(self, ref_key: str) -> list[tuple[int, MessageView]]:
        """Every set's requests of this ref key, by creation time. Raises the first set's error
        when a set cannot answer: a timeline with a set left out would read as complete."""
        reads = await asyncio.gather(*(self.client(s).by_ref_key(ref_key) for s in self.set_ids), return_exceptions=True)
        merged: list[tuple[int, MessageView]] = []
        for set_id, read in zip(self.set_ids, reads, strict=True):
            if isinstance(read, BaseException):
                raise read
            merged.extend((set_id, view) for view in read.value)
        return sorted(merged, key=lambda pair: (pair[1].created_ms, pair[0], pair[1].message_id))

    async def counts(self) -> dict[tuple[str, str], int]:
        """Requests per (kind, state), summed over the sets."""
        reads = await asyncio.gather(*(self.client(s).counts() for s in self.set_ids))
        total: dict[tuple[str, str], int] = {}
        for read in reads:
            for key, count in read.value.items():
                total[key] = total.get(key, 0) + count
        return total

    async def statuses(self) -> list[SetStatus]:
        """Each set's nodes (role, term, commit, applied, or the error): never raises."""
        found = await asyncio.gather(*(self.client(s).node_statuses() for s in self.set_ids))
        addresses = self.table.addresses()
        return [SetStatus(s, addresses.get(s, ()), nodes) for s, nodes in zip(self.set_ids, found, strict=True)]

    async def fence(self, set_ids: Iterable[int], epoch: int, *, actor: str, reason: str) -> dict[int, int]:
        """Commit RouteFence(epoch) on each of these sets; their minimum route epochs after it.
        Raises the first failure (the add stops and can be resumed: a fence is idempotent)."""
        ids = sorted(set_ids)
        results = await asyncio.gather(
            *(self.client(s).submit(RouteFence(epoch=epoch, actor=actor, reason=reason)) for s in ids)
        )
        fenced: dict[int, int] = {}
        for set_id, result in zip(ids, results, strict=True):
            if not isinstance(result, RouteResult) or result.code is not Code.OK:
                raise QueueError(f"set {set_id} refused the fence: {result!r}")
            fenced[set_id] = result.min_route_epoch
        return fenced

    # ---- cluster-wide settings ---------------------------------------------------------------------
    async def broadcast(self, setting: settings.Setting, *, actor: str) -> settings.BroadcastOutcome:
        """A pause, policy, retention or settings document written to every set of the table (the
        intent first, in the control set), each audited in its set with `actor`: the caller answers
        success only when `outcome.unreachable` is empty (queues/sets/settings.py)."""
        await self._fresh_enough()
        if not self.table.sets and not await self.refresh():
            raise settings.IntentUnavailable(Unavailable("no set table read from the control set yet: nothing was changed",
                                                         last_error="no set table", last_address=None))  # fmt: skip
        clients = {entry.id: self.clients[entry.id] for entry in self.table.sets}
        return await settings.broadcast(None if self.control is None else self.control.queue, clients, setting,
                                        actor=actor)  # fmt: skip

    async def repair_settings(self, set_ids: Iterable[int] | None = None) -> dict[int, list[settings.Setting] | Exception]:
        """Re-apply, in these sets (default: every set of the table), the intended settings they
        do not hold. Nothing to compare with when there is no control set."""
        if self.control is None:
            return {}
        ids = [entry.id for entry in self.table.sets] if set_ids is None else sorted(set_ids)
        return await settings.repair(self.control.queue, {s: self.client(s) for s in ids})

    async def repair_settings_forever(self, period_s: float, observe: RepairObserver | None = None, *,
                                      keep_ms: int = settings.ABSENCE_KEEP_MS) -> None:  # fmt: skip
        """`repair_settings` every `period_s` (the table re-read first, so a set added later is
        compared too) until cancelled, then `prune_settings` when every set was compared; a pass
        that fails is logged and tried again. `observe` is told of each pass: the sets compared
        and the report (None: the control set was not read)."""
        while True:
            await asyncio.sleep(period_s)
            await self.refresh()
            compared = [entry.id for entry in self.table.sets]
            try:
                report = await self.repair_settings(compared)
            except (ClientError, QueueError) as error:
                log.warning("the intended settings cannot be read from the control set (next pass retries): %s", error)
                if observe is not None:
                    observe(compared, None)
                continue
            failed = {set_id: failure for set_id, failure in report.items() if isinstance(failure, Exception)}
            for set_id, failure in failed.items():
                log.warning("set %d cannot be compared with the intended settings (next pass retries): %s",
                            set_id, failure)  # fmt: skip
            if observe is not None:
                observe(compared, report)
            if not failed:
                try:
                    await self.prune_settings(keep_ms=keep_ms)
                except (ClientError, QueueError) as error:
                    log.warning("old absences were not pruned from the intended settings (next pass retries): %s", error)

    async def prune_settings(self, *, keep_ms: int = settings.ABSENCE_KEEP_MS) -> list[str]:
        """settings.prune over every set of the table: the intended absences deleted (none without a control set)."""
        control = None if self.control is None else self.control.queue
        return await settings.prune(control, {e.id: self.client(e.id) for e in self.table.sets}, keep_ms=keep_ms)

    async def close(self) -> None:
        self._retired.cancel()
        closing = {id(c): c for c in [*self.clients.values(), *self._retired.clients]}
        if self.control is not None:
            closing[id(self.control.queue)] = self.control.queue
        for client in closing.values():
            await client.raft.close()
