"""The control set's own clock (docs/sets.md, "The control set's clock"): `compensator run --sets N`
gives the control set's hosted replicas `local.control_tick_ms` and leaves the data sets' at
`node.tick_ms`, as the node process reads its flags; deploy/compose.sets.yaml and the benchmarks'
sets do the same; one set has no control set and keeps its tick."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.sets_cluster import SetProcesses
from compensator import cli
from compensator.commands import node as node_command
from compensator.commands.run_sets import LocalSets
from compensator.config import ConfigError, LocalConfig, load
from compensator.wiring.node import hosted_configs, node_config
from raft_store.testing.credentials import cluster_auth

ROOT = Path(__file__).resolve().parents[2]


def _ticks(tmp_path: Path, count: int, **settings: str) -> dict[int, int]:
    """Each replica's tick in set 1's node 1 of `run --sets count`, as `compensator node` reads its
    `--replica` flags over the configuration (`settings`), by set id (set 1: its own)."""
    environ = {"COMPENSATOR_STORE__SECRET_FILE": str(cluster_auth(tmp_path).secrets.path), **settings}
    planned = LocalSets.plan(load(None, environ), count, tmp_path / "data")
    args = cli.build_parser().parse_args(["node", "--id", "1", *planned.replica_args(1)])
    config = load(None, environ, flags=node_command.flags(args))
    own = node_config(config)
    return {1: own.tick_ms, **{replica.set_id: found.tick_ms for replica, found in hosted_configs(config, own)}}


def test_run_sets_hosts_the_control_set_on_its_own_clock_and_the_data_sets_on_theirs(tmp_path: Path) -> None:
    assert _ticks(tmp_path / "a", 3) == {0: 100, 1: 30, 2: 30, 3: 30}
    tuned = {"COMPENSATOR_LOCAL__CONTROL_TICK_MS": "250", "COMPENSATOR_NODE__TICK_MS": "20"}
    assert _ticks(tmp_path / "b", 2, **tuned) == {0: 250, 1: 20, 2: 20}
    assert load(None, {}).node.tick_ms == 30  # one set (`make run`): no control set, the tick as before
    with pytest.raises(ConfigError, match=r"local.control_tick_ms: must be in 1..10000"):
        load(None, {"COMPENSATOR_LOCAL__CONTROL_TICK_MS": "0"})


def test_compose_and_the_benchmarks_sets_tick_the_control_set_as_run_does(tmp_path: Path) -> None:
    default = LocalConfig().control_tick_ms
    services = yaml.safe_load((ROOT / "deploy" / "compose.sets.yaml").read_text())["services"]
    control = {name: s["environment"].get("COMPENSATOR_NODE__TICK_MS") for name, s in services.items()
               if name.startswith("control")}  # fmt: skip
    assert control == {f"control{i}": str(default) for i in (1, 2, 3)}
    data_nodes = [s for name, s in services.items() if name.startswith("set") and "-node" in name]
    assert data_nodes and all("COMPENSATOR_NODE__TICK_MS" not in s["environment"] for s in data_nodes)

    hosted = SetProcesses(tmp_path / "hosted", 2, control=True)
    assert hosted.node_settings == {0: {"tick_ms": default}}
    assert all(c.extra_args == [] for c in hosted.clusters.values())
    alone = SetProcesses(tmp_path / "alone", 2, control=True, hosted=False)
    assert alone.clusters[0].extra_args == ["--tick-ms", str(default)]
    assert all(alone.clusters[k].extra_args == [] for k in (1, 2))
