"""compose.yaml and the Dockerfile, checked statically (no Docker engine runs here): every command
of ours parses with our command line, every variable is one the configuration reads and documents
and validates as the configuration, ports and volumes are not shared, every service has a health
check, the store's peer network is the nodes' alone, the set's addresses are written once, and
the image is multi-stage, pinned, built from the lock, holds every package and runs as a non-root
user."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from compensator import cli
from compensator import config as configuration

ROOT = Path(__file__).resolve().parents[2]
OURS = "compensator:latest"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return loaded


def ours(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose["services"].items() if service.get("image") == OURS}


def test_the_whole_service_is_there(compose: dict[str, Any]) -> None:
    services = compose["services"]
    commands = {name: service["command"][1] for name, service in ours(compose).items()}
    assert [commands[f"store{i}"] for i in (1, 2, 3)] == ["node"] * 3
    for command in ("api", "worker", "project", "events-publish", "kafka-ingest", "reconcile", "standins"):
        assert command in commands.values(), command
    assert services["api"]["deploy"]["replicas"] == 2 and services["worker"]["deploy"]["replicas"] == 2
    images = {service.get("image", "").split(":")[0] for service in services.values()}
    assert {
        "apache/kafka",
        "postgres",
        "otel/opentelemetry-collector-contrib",
        "prom/prometheus",
        "grafana/grafana",
    } <= images
    assert services["standins"]["profiles"] == ["demo"]
    assert all("profiles" not in service for name, service in services.items() if name not in {"standins", "reconcile"})
    assert "KAFKA_PROCESS_ROLES" in services["kafka"]["environment"]  # KRaft, no ZooKeeper


def test_every_command_parses_with_our_command_line(compose: dict[str, Any]) -> None:
    parser = cli.build_parser()
    for name, service in ours(compose).items():
        command = service["command"]
        assert command[0] == "compensator", name
        try:
            parser.parse_args([str(part) for part in command[1:]])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(map(str, command))}` is not a valid compensator command")


def test_every_variable_is_read_documented_and_valid(compose: dict[str, Any]) -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    sections = {
        field.name: {f.name for f in msgspec.structs.fields(field.type)}
        for field in msgspec.structs.fields(configuration.Config)
    }
    for name, service in ours(compose).items():
        environment = {key: str(value) for key, value in (service.get("environment") or {}).items()}
        for variable in environment:
            assert f"`{variable}`" in reference, f"{name}: {variable} is not in docs/configuration.md"
            if "__" in variable:
                section, _, field = variable.removeprefix(configuration.ENV_PREFIX).lower().partition("__")
                assert field in sections.get(section, set()), f"{name}: {variable} is no setting"
            else:
                assert variable in configuration.OTHER_VARIABLES, f"{name}: {variable} is read by nothing"
        configuration.load(None, environment)  # raises ConfigError, one line per problem


def test_ports_and_volumes_are_not_shared_and_files_exist(compose: dict[str, Any]) -> None:
    host_ports: list[int] = []
    named: list[str] = []
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            published = str(mapping).split(":")[0]
            low, _, high = published.partition("-")
            host_ports += range(int(low), int(high or low) + 1)
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"
                named.append(source)
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"], f"{name}: secret {secret} is not declared"
    assert len(host_ports) == len(set(host_ports)), host_ports
    assert len(named) == len(set(named)), named
    for secret in compose["secrets"].values():
        assert secret["file"].startswith("./deploy/secrets/")  # files kept out of git, never literals


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in {"CMD", "CMD-SHELL"} and len(test) > 1, name


def test_the_nodes_alone_talk_on_the_peer_network(compose: dict[str, Any]) -> None:
    assert compose["networks"]["peers"]["internal"] is True
    on_peers = {name for name, service in compose["services"].items() if "peers" in service.get("networks", [])}
    assert on_peers == {"store1", "store2", "store3"}
    for i in (1, 2, 3):
        node = compose["services"][f"store{i}"]
        assert [str(part) for part in node["command"]] == ["compensator", "node", "--id", str(i)]
        environment = {key: str(value) for key, value in node["environment"].items()}
        peers = environment["COMPENSATOR_STORE__PEER_ADDRESSES"].split(",")
        clients = environment["COMPENSATOR_STORE__ADDRESSES"].split(",")
        assert (peers[i - 1], clients[i - 1]) == (f"store{i}-peer:7000", f"store{i}:7000")
        assert node["networks"]["peers"] == {"aliases": [f"store{i}-peer"]}
        assert node["volumes"] == [f"store{i}-data:/var/lib/compensator/node"]
        assert environment["COMPENSATOR_NODE__DATA_DIR"] == "/var/lib/compensator/node"


def test_the_sets_addresses_are_written_once(compose: dict[str, Any]) -> None:
    """The nodes and every client of the store read the same [store] addresses: one line of the
    file says them (the nodes' peer network another), never a node's flags beside them."""
    text = (ROOT / "compose.yaml").read_text()
    assert text.count("store1:7000") == 1 and text.count("store1-peer:7000") == 1
    addresses = {name: str(service["environment"]["COMPENSATOR_STORE__ADDRESSES"])
                 for name, service in ours(compose).items()
                 if "COMPENSATOR_STORE__ADDRESSES" in (service.get("environment") or {})}  # fmt: skip
    assert {"store1", "store2", "store3", "api", "worker", "projector"} <= set(addresses)
    assert len(set(addresses.values())) == 1, addresses


def test_the_image_is_multi_stage_pinned_non_root_and_built_from_the_lock() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert len(stages) >= 2
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base.group(1)), (
        "the base image is pinned to a release"
    )
    user = re.findall(r"^USER (\S+)", dockerfile, flags=re.MULTILINE)
    assert user and not user[-1].startswith(("root", "0")), user
    assert "pip install --no-deps -r requirements.lock" in dockerfile
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, flags=re.MULTILINE))
    assert {package.removesuffix("*") for package in packages} <= copied, "a package the image would lack"
    lock = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines()
                if line and not line.startswith("#"))  # fmt: skip
    normalised = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in lock.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *project["optional-dependencies"]["spark"]]
    for pin in pins:
        name, sep, version = pin.partition("==")
        if sep:
            assert normalised.get(re.sub(r"[-_.]+", "-", name).lower()) == version, f"{pin} is not in requirements.lock"


def test_every_node_and_every_store_client_holds_the_cluster_secret(compose: dict[str, Any]) -> None:
    """Nothing reaches the store without the cluster secret: the nodes are started with it, and
    every service of ours that is a store client has it mounted and configured."""
    assert compose["secrets"]["cluster_secret"] == {"file": "./deploy/secrets/cluster_secret"}
    for name, service in ours(compose).items():
        environment = service.get("environment") or {}
        if {"COMPENSATOR_STORE__ADDRESSES", "COMPENSATOR_STORE__CONTROL_ADDRESSES"} & environment.keys():
            # a node reads the secret as its clients do; a client of the control set alone is a client too
            assert environment["COMPENSATOR_STORE__SECRET_FILE"] == "/run/secrets/cluster_secret", name
            assert "cluster_secret" in service.get("secrets", []), name
        else:
            assert "cluster_secret" not in service.get("secrets", []), f"{name} is no store client: no secret"


def test_make_secrets_makes_each_file_once_private_and_a_cluster_secret_the_nodes_accept(tmp_path: Path) -> None:
    import os
    import stat
    import subprocess

    from raft_store.auth import read_secret_file

    folder = tmp_path / "secrets"
    environ = {**os.environ, "COMPENSATOR_SECRETS_OWNER": f"{os.getuid()}:{os.getgid()}"}
    made = subprocess.run([str(ROOT / "deploy" / "make-secrets"), str(folder)], capture_output=True, text=True,
                          env=environ, timeout=60, check=True)  # fmt: skip
    names = {secret["file"].removeprefix("./deploy/secrets/") for secret in yaml.safe_load(
        (ROOT / "compose.yaml").read_text())["secrets"].values()} - {"api_metrics_token"}  # fmt: skip
    assert {path.name for path in folder.iterdir()} == names, made.stdout
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in folder.iterdir())
    assert len(read_secret_file(folder / "cluster_secret")) == 1
    before = (folder / "cluster_secret").read_text()
    again = subprocess.run([str(ROOT / "deploy" / "make-secrets"), str(folder)], capture_output=True, text=True,
                           env=environ, timeout=60, check=True)  # fmt: skip
    assert "nothing made" in again.stdout and (folder / "cluster_secret").read_text() == before


def test_every_intake_knows_the_callback_targets_the_workers_deliver_to(compose: dict[str, Any]) -> None:
    """The API and the Kafka ingest refuse a callback to a target that is not registered: they must
    read the same targets as the workers, or every callback would be refused (or die unsent)."""
    services = compose["services"]
    targets = {name: services[name]["environment"].get("COMPENSATOR_HANDLERS__CALLBACK")
               for name in ("api", "worker", "kafka-ingest")}  # fmt: skip
    assert targets["worker"] and len(set(targets.values())) == 1, targets


def _merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`docker compose -f base -f overlay`, as compose merges them: a service in both keeps the
    base's keys, mappings (environment, depends_on) merged key by key, any other key replaced."""
    merged = {**base, "services": dict(base["services"]), "volumes": {**base["volumes"], **overlay.get("volumes", {})}}
    for name, service in overlay["services"].items():
        if name not in merged["services"]:
            merged["services"][name] = service
            continue
        combined = dict(merged["services"][name])
        for key, value in service.items():
            if isinstance(value, dict) and isinstance(combined.get(key), dict):
                combined[key] = {**combined[key], **value}
            else:
                combined[key] = value
        merged["services"][name] = combined
    return merged


@pytest.fixture(scope="module")
def three_sets(compose: dict[str, Any]) -> dict[str, Any]:
    overlay: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "compose.sets.yaml").read_text())
    return _merged(compose, overlay)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def test_the_three_set_overlay_passes_every_check_of_the_one_set_file(three_sets: dict[str, Any]) -> None:
    test_every_command_parses_with_our_command_line(three_sets)
    test_every_variable_is_read_documented_and_valid(three_sets)
    test_ports_and_volumes_are_not_shared_and_files_exist(three_sets)
    test_every_service_has_a_health_check(three_sets)
    test_every_node_and_every_store_client_holds_the_cluster_secret(three_sets)


def test_the_three_set_overlay_is_a_control_set_and_three_sets_that_every_router_and_reader_knows(
    three_sets: dict[str, Any],
) -> None:
    """Each group's nodes agree on their addresses and talk on the peer network alone; the table's
    epoch 1 names sets 1-3 at their nodes' addresses; the API, the workers and the ingest know the
    control set, and so does the one projector of every set; each extra set has its own events
    publisher at its addresses."""
    services = three_sets["services"]
    groups = {"control": [f"control{i}" for i in (1, 2, 3)], **{
        str(k): [f"set{k}-node{i}" for i in (1, 2, 3)] for k in (2, 3)}, "1": [f"store{i}" for i in (1, 2, 3)]}  # fmt: skip
    addresses = {}
    for group, names in groups.items():
        seen = {_environment(services[name])["COMPENSATOR_STORE__ADDRESSES"] for name in names}
        assert len(seen) == 1, (group, seen)
        addresses[group] = seen.pop()
        assert addresses[group] == ",".join(f"{name}:7000" for name in names)
        for i, name in enumerate(names, 1):
            assert [str(part) for part in services[name]["command"]] == ["compensator", "node", "--id", str(i)]
    on_peers = {name for name, service in services.items() if "peers" in service.get("networks", [])}
    assert on_peers == {name for names in groups.values() for name in names}
    init = [str(part) for part in services["sets-init"]["command"]]
    assert [init[i + 1] for i, part in enumerate(init) if part == "--set"] == [f"{k}={addresses[str(k)]}" for k in (1, 2, 3)]
    for name in ("api", "worker", "kafka-ingest", "sets-init", "projector"):
        assert _environment(services[name])["COMPENSATOR_STORE__CONTROL_ADDRESSES"] == addresses["control"], name
    assert not any(name.startswith("projector-set") for name in services), "one projector for every set"
    assert services["projector"]["depends_on"]["sets-init"] == {"condition": "service_completed_successfully"}
    for k in (2, 3):
        for reader in (f"events-publisher-set{k}",):
            environment = _environment(services[reader])
            assert (environment["COMPENSATOR_STORE__ADDRESSES"], environment["COMPENSATOR_STORE__SET_ID"]) == (
                addresses[str(k)], str(k)), reader  # fmt: skip
    assert services["api"]["depends_on"]["sets-init"] == {"condition": "service_completed_successfully"}
