"""Routed producers and the operator who adds a set, in the multi-set simulation (docs/sets.md).

A `Router` is one intake process (an API replica) as `SetsClient.enqueue_many` routes: a cached
set table, re-read now and then and on ROUTE_STALE; for each key the pure rule of
queues/sets/routing.py (`lookups` then `home`), linearizable lookups in the older candidates that
differ from the newest one, `route_epoch` = the newest active epoch on every Enqueue. Callers
retry an unknown outcome with the same key, sometimes through another router whose table is
older or newer (the race the fence exists for), and replay keys answered long ago.

`SetAdder` is the operator running `compensator sets add`: pending epoch in the control set's
table, RouteFence on every set of the epoch before, activate. It waits between steps and may
crash between them; it then resumes from the table it reads (`sets add --resume`).

Must never: route a key by anything but the table the router holds and what its lookups found.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from queues.core import documents, reads
from queues.model import BUILTIN_KINDS, Code, Enqueue, EnqueueResult, PutDocument, QueueResult, RouteFence, RouteResult
from queues.sets import routing
from queues.sets import table as tables
from queues.sets.table import SetTable
from queues.simulation.net import Client

if TYPE_CHECKING:
    from queues.simulation.sets import SetsRun
    from queues.simulation.world import WorldCluster

DUAL_SEND = 0.2
"""New keys a caller also sends through a second router a few ms later (its retry reaching
another API replica, whose table may be older or newer)."""
REPLAY = 0.08


def read_table(control: WorldCluster, *, fresh: bool) -> SetTable | None:
    """The table as a read of the control set answers it (None: no answer). `fresh`: a
    linearizable read; else any live node's (a stale read is enough for routing: an active epoch
    read anywhere was fenced before it was written)."""
    node = control.fresh_node() if fresh else control.leader()
    if node is None or node not in control.machines:
        return None
    for document in documents.documents(control.machines[node].view, tables.NAMESPACE):
        if document.name == tables.DOCUMENT:
            return tables.decode(document.body)
    return None


@dataclass(slots=True)
class Placed:
    set_id: int
    message_id: int


@dataclass(slots=True)
class Key:
    command: Enqueue
    placed: Placed | None = None
    sends: int = 0
    """Sends whose outcome is not settled (a dual send has two)."""


class Router:
    def __init__(self, run: SetsRun, index: int) -> None:
        self.run = run
        self.name = f"router-{index}"
        self.table: SetTable | None = None
        self.clients = {set_id: Client(cluster.net, self.name) for set_id, cluster in run.sets.items()}
        self.stale = 0
        self.lookups = 0

    def refresh(self) -> bool:
        found = read_table(self.run.control, fresh=False)
        if found is not None and found.active():
            self.table = found
            return True
        return False

    def refresh_loop(self) -> None:
        self.refresh()
        self.run.control.at(self.run.rng.uniform(300, 2500), self.refresh_loop)

    def send(self, key: Key) -> None:
        """Route the key by this router's table and send it (the caller's one try)."""
        run = self.run
        if self.table is None and not self.refresh():
            run.control.at(run.rng.uniform(50, 200), functools.partial(self.send, key))
            return
        assert self.table is not None
        epochs = self.table.active()
        asked = routing.lookups(key.command.idempotency_key, epochs)
        # The lookups are one round trip, concurrent across sets.
        run.control.at(run.rng.uniform(1, 15) if asked else 0, functools.partial(self.place, key, epochs, asked))

    def place(self, key: Key, epochs: tuple[tables.Epoch, ...], asked: tuple[int, ...]) -> None:
        run = self.run
        holders: list[int] = []
        for set_id in asked:
            self.lookups += 1
            cluster = run.sets[set_id]
            node = cluster.fresh_node()
            if node is None:  # the lookup failed: 503, the caller retries later
                run.control.at(run.rng.uniform(100, 600), functools.partial(self.send, key))
                return
            view = cluster.machines[node].view
            if reads.by_idempotency_keys(view, [key.command.idempotency_key], now_ms=cluster.read_clock(node), with_history=False):
                holders.append(set_id)
        set_id = routing.home(key.command.idempotency_key, epochs, holders)
        cluster = run.sets[set_id]
        rng = run.rng
        command = Enqueue(
            kind=key.command.kind, idempotency_key=key.command.idempotency_key, ref_key=key.command.ref_key,
            payload=key.command.payload, headers={"trace": f"{rng.getrandbits(32):08x}"},
            delay_ms=key.command.delay_ms, route_epoch=epochs[-1].epoch,
            request_id=rng.getrandbits(62) + 1 if rng.random() < 0.8 else 0,
        )
        cluster.qchecker.on_enqueue_sent(key.command)
        run.log(f"{self.name} sends {command.idempotency_key} to set {set_id} (epoch {epochs[-1].epoch}, holders {holders})")
        self.clients[set_id].submit(command, functools.partial(self.answered, key, set_id, command.request_id),
                                    tries_max=rng.randint(2, 5))  # fmt: skip

    def answered(self, key: Key, set_id: int, request_id: int, result: QueueResult | None) -> None:
        run = self.run
        run.sets[set_id].qchecker.on_enqueue_answer(key.command.idempotency_key, result, request_id)
        if isinstance(result, RouteResult) and result.code is Code.ROUTE_STALE:
            self.stale += 1
            self.refresh()  # the facade re-reads the table, waits while the epoch is pending, routes again
            pending = self.table is None or self.table.newest_active().epoch < result.min_route_epoch
            run.control.at(run.rng.uniform(50, 100) if pending else 0, functools.partial(self.send, key))
            return
        if result is None:  # unknown: the caller retries the same key (the first may have landed)
            run.control.at(run.rng.uniform(100, 1500), functools.partial(self.send, key))
            return
        key.sends -= 1
        if not isinstance(result, EnqueueResult) or result.code not in (Code.OK, Code.EXISTS):
            run.sets[set_id].qchecker.violation(f"enqueue {key.command.idempotency_key} refused: {result}")
            return
        run.on_placed(key, Placed(set_id, result.message_id))


@dataclass(slots=True)
class SetAdder:
    """The operator adding the last set; `activate_before_fence` is the planted bug."""

    run: SetsRun
    activate_before_fence: bool = False
    step: str = "idle"
    crashes: int = 0
    generation: int = 0
    """Bumps on every crash: what the crashed incarnation had scheduled does nothing."""
    fenced: set[int] = field(default_factory=set)
    client: Client | None = None
    set_clients: dict[int, Client] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client = Client(self.run.control.net, "set-operator")
        self.set_clients = {s: Client(c.net, "set-operator") for s, c in self.run.sets.items()}

    @property
    def done(self) -> bool:
        return self.step == "done"

    def begin(self) -> None:
        """Read the table (linearizably) and take the next step it calls for (`--resume`)."""
        if self.done:
            return
        found = read_table(self.run.control, fresh=True)
        if found is None:
            self.later(self.begin)
            return
        pending = found.pending()
        if pending is None and len(found.epochs) == 1:
            addresses = self.run.addresses[self.run.added]
            new, _ = tables.with_new_sets(found, [addresses])
            self.step = "pending"
            self.put(new, self.after_pending)
        elif pending is not None:
            self.step = "fence"
            self.after_pending()
        else:
            self.step = "done"
            self.run.log("set-operator: the new epoch is active")

    def later(self, action: Callable[[], None]) -> None:
        """The next step after a pause (an operator's, or a slow command); sometimes it crashes first."""
        run = self.run
        if run.rng.random() < 0.2:
            self.crashes += 1
            self.generation += 1
            self.step = "crashed"
            self.fenced = set()
            run.log("set-operator crashes; resumes later with `sets add --resume`")
            run.control.at(run.rng.uniform(300, 2500), self.begin)
            return
        generation = self.generation
        run.control.at(run.rng.uniform(20, 800), lambda: self._go(generation, action))

    def _go(self, generation: int, action: Callable[[], None]) -> None:
        if generation == self.generation:
            action()

    def put(self, new: SetTable, then: Callable[[], None]) -> None:
        assert self.client is not None
        command = PutDocument(namespace=tables.NAMESPACE, name=tables.DOCUMENT, body=tables.encode(new),
                              actor="sim-operator", reason="sets add")  # fmt: skip

        generation = self.generation

        def answered(result: QueueResult | None) -> None:
            if generation != self.generation:
                return
            if result is None or result.code is not Code.OK:
                self.later(self.begin)  # unknown: read the table again and carry on from it
                return
            self.later(then)

        self.client.submit(command, answered, tries_max=3)

    def after_pending(self) -> None:
        if self.activate_before_fence:
            self.activate(then=self.fence_all)
        else:
            self.fence_all()

    def fence_all(self) -> None:
        found = read_table(self.run.control, fresh=True)
        if found is None:
            self.later(self.fence_all)
            return
        newest = found.epochs[-1]
        before = found.epochs[-2]
        missing = [s for s in before.sets if s not in self.fenced]
        if not missing:
            if self.activate_before_fence:
                self.step = "done"
                return
            self.activate(then=None)
            return
        for set_id in missing:
            self.set_clients[set_id].submit(RouteFence(epoch=newest.epoch, actor="sim-operator", reason="sets add"),
                                            functools.partial(self.fence_answered, self.generation, set_id), tries_max=3)  # fmt: skip

    def fence_answered(self, generation: int, set_id: int, result: QueueResult | None) -> None:
        if generation != self.generation:
            return
        if isinstance(result, RouteResult) and result.code is Code.OK:
            self.fenced.add(set_id)
            self.run.log(f"set-operator: set {set_id} fenced at {result.min_route_epoch}")
            before = self.run.initial_sets
            if all(s in self.fenced for s in before):
                self.later(self.fence_all)
            return
        self.later(self.fence_all)

    def activate(self, then: Callable[[], None] | None) -> None:
        found = read_table(self.run.control, fresh=True)
        if found is None:
            self.later(functools.partial(self.activate, then))
            return
        pending = found.pending()
        if pending is None:
            self.step = "done" if then is None else self.step
            if then is not None:
                self.later(then)
            return
        self.step = "activate"
        self.put(tables.activated(found, pending.epoch), then if then is not None else self.finish)

    def finish(self) -> None:
        self.step = "done"
        self.run.log("set-operator: the new epoch is active")


def new_key(run: SetsRun, caller: int, count: int) -> Enqueue:
    rng = run.rng
    delay_ms = rng.randint(1, 1500) if rng.random() < 0.2 else 0
    return Enqueue(kind=rng.choice(BUILTIN_KINDS), idempotency_key=f"c{caller}-{count}", ref_key=f"ref{rng.randrange(40)}",
                   payload=rng.randbytes(rng.randint(8, 48)), delay_ms=delay_ms)  # fmt: skip
