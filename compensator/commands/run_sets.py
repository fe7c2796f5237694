"""What `compensator run --sets N` starts beyond one set: a 3-node control set and sets 2..N, hosted
by set 1's three node processes (node i of every set in set 1's node i: `--replica`, docs/sets.md),
each replica its own data directory under `local.data_dir`, and the set table written once.

Set 1 is the set `store.addresses` names (`make run`'s, unchanged). Set k's nodes listen on the
ports of set 1's plus 10 (k - 1), the control set's on set 1's plus 50: fixed, so a data directory
started once keeps matching its addresses on the next start (a node's peers are its set's
addresses), and checked free before anything starts. Every child process is told the control set
(`COMPENSATOR_STORE__CONTROL_ADDRESSES`), so the API routes intake over every set. Each set gets
its own worker process pointed at it (`store.addresses`, `store.set_id`); every worker leases from
every set of the table (`store.open_sets`, re-read every `store.sets_refresh_s`), and the one
projector process projects every set of the table the same way (docs/ledger.md).

Must never: change anything `compensator run` does without `--sets`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from compensator.config import Config
from compensator.config_processes import parse_address
from compensator.store import control_set, raft_client, store_auth
from queues import QueueClient, SetsClient
from queues.maintenance import SERVICE, MaintenanceDriver
from queues.sets import table

SETS_MAX: Final = 5
"""Sets `run` starts on one machine (their port blocks of 10 must not reach the control set's)."""
SET_PORT_STEP: Final = 10
CONTROL_PORT_OFFSET: Final = 50
START_TIMEOUT_S: Final = 60.0


class SetsLaunchError(ValueError):
    """The extra sets could not be started or bootstrapped: one line, exit 1."""


def _shifted(addresses: tuple[str, ...], offset: int) -> list[str]:
    return [f"{host}:{port + offset}" for host, port in (parse_address(a) for a in addresses)]


@dataclass
class LocalSets:
    """The control set and sets 2..N of one `run --sets N` (see the module docstring)."""

    config: Config
    count: int
    control: list[str]
    sets: dict[int, list[str]]
    """Every set's addresses by id, set 1 (store.addresses) included."""
    data_dir: Path = Path()
    drivers: list[tuple[MaintenanceDriver, QueueClient]] = field(default_factory=list)

    @classmethod
    def plan(cls, config: Config, count: int, data_dir: Path) -> LocalSets:
        if not 2 <= count <= SETS_MAX:
            raise SetsLaunchError(f"--sets: from 1 to {SETS_MAX} on one machine")
        base = config.store.addresses
        sets = {k: _shifted(base, SET_PORT_STEP * (k - 1)) for k in range(1, count + 1)}
        control = _shifted(base, CONTROL_PORT_OFFSET)
        with_control = msgspec.structs.replace(config.store, control_addresses=tuple(control))
        return cls(msgspec.structs.replace(config, store=with_control), count, control, sets, data_dir)

    def replica_args(self, node: int) -> list[str]:
        """`--replica` of set 1's node `node` for node `node` of the control set and of sets 2..N:
        three host processes in all, whatever N (docs/sets.md); each replica's data directory the
        one it had as a process of its own."""
        groups = [("control", 0, self.control)] + [(f"set{k}", k, self.sets[k]) for k in range(2, self.count + 1)]
        return [arg for folder, set_id, addresses in groups for arg in ("--replica", json.dumps(
            {"set_id": set_id, "id": node, "addresses": addresses, "data_dir": str(self.data_dir / folder / f"node{node}"),
             **({"tick_ms": self.config.local.control_tick_ms} if set_id == 0 else {})}))]  # the control set's own clock

    @property
    def env(self) -> dict[str, str]:
        """What every child of the run is given: the control set, so the API routes over the sets."""
        return {"COMPENSATOR_STORE__CONTROL_ADDRESSES": ",".join(self.control)}

    def set_env(self, set_id: int) -> dict[str, str]:
        """A worker's environment for one set."""
        return {**self.env, "COMPENSATOR_STORE__ADDRESSES": ",".join(self.sets[set_id]),
                "COMPENSATOR_STORE__SET_ID": str(set_id)}  # fmt: skip

    def addresses(self) -> list[tuple[str, int]]:
        """The ports this run adds (set 1's are the launcher's own check)."""
        extra = [a for k, found in self.sets.items() if k != 1 for a in found]
        return [parse_address(a) for a in [*self.control, *extra]]

    def client(self, addresses: list[str]) -> QueueClient:
        return QueueClient(raft_client(self.config, store_auth(self.config), addresses))

    async def wait_leaders(self, supervise: Callable[[], None]) -> bool:
        """Each extra set and the control set has elected a leader (SetsLaunchError after 60 s)."""
        groups = {"the control set": self.control, **{f"set {k}": a for k, a in self.sets.items() if k != 1}}
        for name, addresses in groups.items():
            queue = self.client(addresses)
            try:
                deadline = time.monotonic() + START_TIMEOUT_S
                while not any(s.get("role") == "leader" for s in await queue.node_statuses()):
                    if time.monotonic() > deadline:
                        raise SetsLaunchError(f"{name} elected no leader within 60 s (logs under {self.config.local.data_dir})")
                    supervise()
                    await asyncio.sleep(0.2)
            finally:
                await queue.raft.close()
        return True

    async def bootstrap(self) -> None:
        """Epoch 1 = every set, written once; a table written by an earlier run must be the same."""
        wanted = table.first_table({k: tuple(a) for k, a in self.sets.items()})
        control = control_set(self.config)
        try:
            found, version = await control.read()
            if found is None:
                await control.write(wanted, expected_version=version, actor="local-launcher", reason="run --sets")
            elif found.addresses() != wanted.addresses():
                have = ",".join(str(e.id) for e in found.sets)
                raise SetsLaunchError(f"{self.config.local.data_dir}/control holds a set table of sets {have}: run with"
                                      f" --sets {len(found.sets)}, or remove {self.config.local.data_dir} to start anew")  # fmt: skip
        finally:
            await control.queue.raft.close()

    def start_drivers(self) -> None:
        """Lease expiry and purge for sets 2..N (set 1's is the launcher's own driver)."""
        for k in sorted(self.sets):
            if k != 1:
                queue = self.client(self.sets[k])
                driver = MaintenanceDriver(queue, SERVICE)
                driver.start()
                self.drivers.append((driver, queue))

    async def stop_drivers(self) -> None:
        for driver, queue in self.drivers:
            await driver.stop()
            await queue.raft.close()

    def banner_lines(self) -> list[str]:
        return [
            *(f"  set {k}           {','.join(a)}" for k, a in sorted(self.sets.items()) if k != 1),
            f"  control set     {','.join(self.control)}   (holds the set table)",
            f"  every set:      COMPENSATOR_STORE__CONTROL_ADDRESSES={','.join(self.control)} compensator status"
            " (or sets list)",
        ]

    async def facade(self) -> SetsClient:
        control = control_set(self.config)
        return await SetsClient.from_control(control, connect=lambda _set_id, addresses: self.client(list(addresses)))
