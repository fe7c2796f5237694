"""The control set's own clock (docs/sets.md, "The control set's clock"): `compensator run --sets N`
starts the control set's nodes with `local.control_tick_ms` and the data sets' with `node.tick_ms`,
as the node processes read their settings; deploy/compose.sets.yaml and the benchmarks' sets do
the same; one set has no control set and keeps its tick."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.sets_cluster import SetProcesses
from compensator.commands.run_sets import LocalSets
from compensator.config import ConfigError, LocalConfig, load
from compensator.wiring.node import node_config
from raft_store.testing.credentials import cluster_auth

ROOT = Path(__file__).resolve().parents[2]


def _node_ticks(planned: LocalSets, tmp_path: Path, **base: str) -> dict[str, int]:
    """Each planned node's tick as its `compensator node` process reads it: the launcher's
    environment for it (run.py gives a node nothing else), its `--id`."""
    secret = cluster_auth(tmp_path).secrets.path
    ticks = {}
    for name, args, _log, env in planned.nodes:
        environ = {"COMPENSATOR_STORE__SECRET_FILE": str(secret), **env,
                   "COMPENSATOR_NODE__ID": args[args.index("--id") + 1]}  # fmt: skip
        ticks[name] = node_config(load(None, {**base, **environ})).tick_ms
    return ticks


def test_run_sets_starts_the_control_set_on_its_own_clock_and_the_data_sets_on_theirs(tmp_path: Path) -> None:
    config = load(None, {})
    ticks = _node_ticks(LocalSets.plan(config, 3, tmp_path / "data"), tmp_path)
    assert ticks == {**{f"control node {i}": 100 for i in (1, 2, 3)},
                     **{f"set {k} node {i}": 30 for k in (2, 3) for i in (1, 2, 3)}}  # fmt: skip

    settings = {"COMPENSATOR_LOCAL__CONTROL_TICK_MS": "250", "COMPENSATOR_NODE__TICK_MS": "20"}  # a config file's
    tuned = load(None, settings)
    ticks = _node_ticks(LocalSets.plan(tuned, 2, tmp_path / "tuned"), tmp_path, **settings)
    assert {t for n, t in ticks.items() if n.startswith("control")} == {250}
    assert {t for n, t in ticks.items() if n.startswith("set")} == {20}
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

    processes = SetProcesses(tmp_path / "sets", 2, control=True)
    assert processes.clusters[0].extra_args == ["--tick-ms", str(default)]
    assert all(processes.clusters[k].extra_args == [] for k in (1, 2))
