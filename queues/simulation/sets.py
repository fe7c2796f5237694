"""The multi-set simulation: several queue sets and the control set in one clock, one seed.

`python -m queues.simulation --sets 3 --seed N`: a control set and sets 1..3, each a 3-node
`QueueCluster` (the production Raft core, Ready runner and queue machine, its own crashes,
partitions, clock faults, client-link cuts, workers, expiry driver and operator, and its own
checker of every single-set property), all in one `World` (world.py). Epoch 1 routes over sets
1..N-1; mid-run an operator adds set N (pending epoch, RouteFence on every old set, activate),
pausing and crashing between steps, while routed producers (routers.py) with tables of their own
age keep sending new keys and replays.

Checked at the end, after healing, a drain and a quiet log, besides each set's own end check: no
idempotency key held by two sets; every held key in a set its routing rule names under the final
table; every acknowledged enqueue held by the set that answered it, under the id it answered
(unless purged after its retention); a replay answered with the first answer's set and id; no
key's effect applied in two sets (each set's downstream ledger already allows one per key).

Must never: route a key other than through queues/sets/routing.py, as the facade does.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from queues.core import reads
from queues.model import Code, PutDocument, QueueResult
from queues.sets import routing
from queues.sets import table as tables
from queues.simulation.cluster import STRAGGLERS_MS_MAX
from queues.simulation.net import Client
from queues.simulation.routers import DUAL_SEND, REPLAY, Key, Placed, Router, SetAdder, new_key, read_table
from queues.simulation.world import World, WorldCluster
from raft_store.simulation.cluster import SimulationFailure
from raft_store.simulation.runner import Outcome

SETS_BUGS = ("activate_before_fence",)
"""Planted bugs of the multi-set mode; each must be caught within a few seeds."""
DRAIN_MS_MAX = 30_000
RUN, DRAIN, STOPPED = "run", "drain", "stopped"


def replay_command(seed: int, sets: int, bug: str | None) -> str:
    return f"python -m queues.simulation --sets {sets} --seed {seed}" + (f" --bug {bug}" if bug else "")


class SetsRun:
    def __init__(self, seed: int, sets: int = 3, *, bug: str | None = None) -> None:
        if sets < 2:
            raise ValueError("the multi-set simulation needs at least two sets (one is added mid-run)")
        self.world = World(seed, replay_command(seed, sets, bug))
        seeds = random.Random(seed ^ 0x5E75)
        self.control = WorldCluster(self.world, "control set", seeds.getrandbits(48), enqueuers=0)
        self.sets = {k: WorldCluster(self.world, f"set {k}", seeds.getrandbits(48), enqueuers=0) for k in range(1, sets + 1)}
        self.rng = random.Random(seed)
        """The routers', callers' and set operator's draws."""
        self.addresses = {k: tuple(f"set{k}-n{i}.sim:7000" for i in (1, 2, 3)) for k in self.sets}
        self.initial_sets = tuple(range(1, sets))
        self.added = sets
        self.routers = [Router(self, i) for i in range(3)]
        self.adder = SetAdder(self, activate_before_fence=bug == "activate_before_fence")
        self.keys: list[Key] = []
        self.settled: list[Key] = []
        self.phase = RUN
        self.replays = 0
        self.dual_sends = 0
        self._init_client = Client(self.control.net, "sets-init")

    @property
    def clusters(self) -> list[WorldCluster]:
        return [self.control, *self.sets.values()]

    def log(self, text: str) -> None:
        self.control.log(text)

    def fail(self, reason: str) -> None:
        self.control.fail(f"across sets: {reason}")

    # ---- the actors ------------------------------------------------------------------------
    def bootstrap(self) -> None:
        """`compensator sets init`: epoch 1 over the initial sets, written until it is answered."""
        first = tables.first_table({k: self.addresses[k] for k in self.initial_sets})
        command = PutDocument(namespace=tables.NAMESPACE, name=tables.DOCUMENT, body=tables.encode(first),
                              actor="sim-operator", reason="sets init")  # fmt: skip

        def answered(result: QueueResult | None) -> None:
            if result is None or result.code is not Code.OK:
                self.control.at(self.rng.uniform(50, 200), self.bootstrap)

        self._init_client.submit(command, answered, tries_max=3)

    def caller(self, index: int, count: int = 0) -> None:
        if self.phase != RUN:
            return
        rng = self.rng
        if self.settled and rng.random() < REPLAY:
            key = rng.choice(self.settled)
            self.replays += 1
            key.sends += 1
            rng.choice(self.routers).send(key)
        else:
            count += 1
            key = Key(new_key(self, index, count), sends=1)
            self.keys.append(key)
            first, second = rng.sample(self.routers, 2)
            first.send(key)
            if rng.random() < DUAL_SEND:  # the caller's retry reaches another API replica
                self.dual_sends += 1
                key.sends += 1
                self.control.at(rng.uniform(0, 40), functools.partial(second.send, key))
        self.control.at(rng.uniform(15, 90), functools.partial(self.caller, index, count))

    def on_placed(self, key: Key, placed: Placed) -> None:
        """A send answered OK or EXISTS: the key's first answer, or one that must agree with it."""
        name = key.command.idempotency_key
        if key.placed is None:
            key.placed = placed
            self.settled.append(key)
            return
        first = key.placed
        if placed == first:
            return
        model = self.sets[first.set_id].qchecker.model
        if first.message_id in model.purged or (placed.set_id == first.set_id and model.expired(first.message_id, self.sets[first.set_id].qchecker.log_time)):
            key.placed = placed  # a new message once the first one's retention ended
            return
        self.fail(f"key {name} answered as message {first.message_id} of set {first.set_id} and as message"
                  f" {placed.message_id} of set {placed.set_id}")  # fmt: skip

    # ---- the run ---------------------------------------------------------------------------
    def run(self, chaos_ms: int = 8000) -> dict[str, Any]:
        rng = self.rng
        for cluster in self.clusters:
            cluster.at(100, cluster.operators.chaos)
            cluster.time.schedule_takeovers()
        for cluster in self.sets.values():
            cluster.workload.start()
        self.control.at(0, self.bootstrap)
        for router in self.routers:
            self.control.at(rng.uniform(0, 300), router.refresh_loop)
        for index in range(3):
            self.control.at(rng.uniform(200, 400), functools.partial(self.caller, index))
        self.control.at(rng.uniform(1500, chaos_ms * 0.6), self.adder.begin)
        self.world.run_until(chaos_ms)
        for cluster in self.clusters:
            cluster.heal()
        self.phase = DRAIN
        for cluster in self.sets.values():
            cluster.workload.drain()
        while self.world.now < chaos_ms + DRAIN_MS_MAX and not self.drained():
            self.world.run_until(self.world.now + 250)
        if not self.drained():
            self.fail(f"not settled {DRAIN_MS_MAX} ms after healing: {self.unsettled()}")
        for cluster in self.sets.values():
            cluster.workload.stop()
        self.phase = STOPPED
        self.world.run_until_quiet(self.clusters, self.world.now + 2000, STRAGGLERS_MS_MAX)
        for cluster in self.clusters:
            cluster.qchecker.check_end()
        self.check_sets()
        return self.summary()

    def drained(self) -> bool:
        return not self.unsettled()

    def unsettled(self) -> list[str]:
        found = [f"set {k}: {cluster.workload.unsettled()}" for k, cluster in self.sets.items()
                 if not cluster.workload.drained()]  # fmt: skip
        pending = sum(1 for key in self.keys if key.sends > 0)
        if pending:
            found.append(f"{pending} keys not answered")
        if not self.adder.done:
            found.append(f"the set add is at step {self.adder.step}")
        return found

    # ---- the end check ------------------------------------------------------------------------
    def check_sets(self) -> None:
        final = read_table(self.control, fresh=True)
        if final is None or final.pending() is not None or len(final.active()) != 2:
            self.fail(f"the set add did not complete: {final}")
        assert final is not None
        epochs = final.active()
        names = [key.command.idempotency_key for key in self.keys]
        held: dict[str, list[tuple[int, int]]] = {}
        for set_id, cluster in self.sets.items():
            node = cluster.fresh_node()
            if node is None:
                self.fail(f"set {set_id} has no leader to read after healing")
            assert node is not None
            for view in reads.by_idempotency_keys(cluster.machines[node].view, names, now_ms=cluster.read_clock(node),
                                                  with_history=False):  # fmt: skip
                held.setdefault(view.idempotency_key, []).append((set_id, view.message_id))
        for name, holders in held.items():
            if len(holders) > 1:
                self.fail(f"key {name} is held by two sets: " + ", ".join(f"set {s} as {m}" for s, m in holders))
            (set_id, _), = holders
            if routing.home(name, epochs, [set_id]) != set_id:
                self.fail(f"key {name} is held by set {set_id}; its candidates are {routing.candidates(name, epochs)}")
        for key in self.keys:
            placed = key.placed
            if placed is None:
                continue
            checker = self.sets[placed.set_id].qchecker
            if placed.message_id in checker.model.purged or checker.model.expired(placed.message_id, checker.log_time):
                continue  # its retention ended: a replay since may have made a new message (checked per set)
            if held.get(key.command.idempotency_key) != [(placed.set_id, placed.message_id)]:
                self.fail(f"acknowledged {key.command.idempotency_key} (set {placed.set_id}, message"
                          f" {placed.message_id}) is held as {held.get(key.command.idempotency_key)}")  # fmt: skip
        effects: dict[str, list[int]] = {}
        for set_id, cluster in self.sets.items():
            for name in {call.key for call in cluster.workload.downstream.calls if call.applied}:
                effects.setdefault(name, []).append(set_id)
        for name, set_ids in effects.items():
            if len(set_ids) > 1 and not any(
                any(m.key == name for m in self.sets[s].qchecker.model.purged.values()) for s in set_ids
            ):
                self.fail(f"the effect of {name} was applied in sets {set_ids}")
        self.moved = sum(1 for name in names if routing.lookups(name, epochs))

    def summary(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"sets": len(self.sets), "keys": len(self.keys), "replays": self.replays,
                                 "dual_sends": self.dual_sends, "operator_crashes": self.adder.crashes,
                                 "route_stale": sum(r.stale for r in self.routers),
                                 "lookups": sum(r.lookups for r in self.routers), "moved_keys": getattr(self, "moved", 0),
                                 "sim_ms": self.world.now}  # fmt: skip
        for label, cluster in [("control", self.control), *((f"set{k}", c) for k, c in self.sets.items())]:
            part = cluster.summary()
            for name in ("faults", "crashes", "partitions", "acked_enqueues", "duplicate_deliveries", "dead_letters"):
                stats[name] = stats.get(name, 0) + int(part.get(name, 0))
            stats[f"{label}_acked_enqueues"] = int(part.get("acked_enqueues", 0))
        return stats


def sentence(outcomes: list[Outcome]) -> str:
    """The figure for several seeds of the multi-set mode."""
    passed = [o.stats for o in outcomes if o.failure is None]
    total = {name: sum(int(s.get(name, 0)) for s in passed) for name in (
        "faults", "crashes", "partitions", "keys", "acked_enqueues", "replays", "dual_sends", "operator_crashes",
        "route_stale", "lookups", "moved_keys", "sim_ms")}  # fmt: skip
    return (f"{len(passed)} multi-set seeds passed, {len(outcomes) - len(passed)} failed: {total['faults']} faults "
            f"({total['crashes']} crashes, {total['partitions']} partitions, control set included), {total['keys']} keys "
            f"routed ({total['acked_enqueues']} acked enqueues, {total['replays']} replays, {total['dual_sends']} sent "
            f"through two routers), {total['moved_keys']} keys whose candidate changed with the add, "
            f"{total['lookups']} cross-set lookups, {total['route_stale']} ROUTE_STALE answers, "
            f"{total['operator_crashes']} operator crashes mid-add, 0 keys in two sets, "
            f"{total['sim_ms'] / 3_600_000:.2f} simulated hours")  # fmt: skip


def run_sets_seed(seed: int, *, sets: int = 3, bug: str | None = None, chaos_ms: int = 8000) -> Outcome:
    run = SetsRun(seed, sets, bug=bug)
    try:
        stats = run.run(chaos_ms=chaos_ms)
    except SimulationFailure as failure:
        return Outcome(seed, run.summary(), failure)
    return Outcome(seed, stats)
