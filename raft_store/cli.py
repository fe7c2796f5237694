"""`raft-store`: run one node, show cluster status, change membership, transfer leadership.

Bad arguments end with one line on stderr and exit status 2; an unreachable cluster with 1.

Another command line runs a node with a machine of its own, with no `--machine module:factory`
string, through the same pieces `raft-store run` uses: `add_node_arguments(parser)`,
`node_config(args)`, `prepare_node_process()`, then `asyncio.run(run_node(config, machine))`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raft_store.auth import AuthConfigError, StoreAuth
from raft_store.client import RaftClient
from raft_store.files import private_dir
from raft_store.hosting import Replica, check_distinct, run_nodes
from raft_store.machines import CounterMachine, KvMachine
from raft_store.node import Node
from raft_store.node_config import NodeConfig
from raft_store.process import configure_logging, install_uvloop
from raft_store.state_machine import StateMachine
from raft_store.wal import GroupCommitPolicy

log = logging.getLogger("raft_store.cli")


class UsageError(Exception):
    """Bad input from the command line or its config file; the message is one line for stderr."""


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"address {text!r} is not host:port")
    return host, int(port)


def parse_peers(items: list[str], what: str = "peer") -> dict[int, tuple[str, int]]:
    peers: dict[int, tuple[str, int]] = {}
    for item in items:
        node, sep, address = item.partition("=")
        if not sep or not node.isdigit():
            raise UsageError(f"{what} {item!r} is not ID=host:port")
        peers[int(node)] = parse_address(address)
    return peers


def _address_map(items: object, what: str) -> dict[int, tuple[str, int]]:
    """A config file's {"id": "host:port"} map."""
    if not isinstance(items, dict):
        raise UsageError(f"'{what}' in the config file is not an object of id: host:port")
    return parse_peers([f"{node}={address}" for node, address in items.items()], what)


def store_auth(args: argparse.Namespace, settings: dict[str, Any] | None = None) -> StoreAuth:
    """The cluster secret file and TLS files from the options of `add_auth_arguments` (or a node's
    config file); raises UsageError on a missing, unreadable or too open file."""
    settings = settings or {}

    def path(name: str) -> Path | None:
        value = getattr(args, name, None) or settings.get(name)
        return Path(value) if value else None

    secret_file = path("secret_file")
    if secret_file is None:
        raise UsageError("--secret-file is required: the file holding the cluster secret (docs/security.md)")
    try:
        return StoreAuth.from_files(secret_file, tls_ca=path("tls_ca"), tls_cert=path("tls_cert"), tls_key=path("tls_key"))
    except AuthConfigError as exc:
        raise UsageError(str(exc)) from None


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The node's configuration from the options of `add_node_arguments` and the JSON file named
    by --config (options win); raises UsageError on bad input."""
    settings: dict[str, Any] = {}
    if args.config:
        try:
            settings = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read config {args.config}: {exc}") from None
    node_id = args.id if args.id is not None else settings.get("id")
    if node_id is None:
        raise UsageError("--id (or 'id' in the config file) is required")
    peers = parse_peers(args.peer) if args.peer else _address_map(settings.get("peers", {}), "peers")
    client_addresses = (
        parse_peers(args.client_address, "client address")
        if args.client_address
        else _address_map(settings.get("client_addresses", {}), "client_addresses")
    )
    listen = parse_address(args.listen) if args.listen else peers.get(int(node_id))
    if listen is None:
        raise UsageError("--listen is required when the node is not in --peer")
    voters = settings.get("initial_voters")
    if args.voters:
        try:
            voters = [int(v) for v in args.voters.split(",") if v]
        except ValueError:
            raise UsageError(f"--voters {args.voters!r} is not a list of node ids") from None
    if args.join:
        voters = []
    elif voters is None:
        voters = sorted(peers) if peers else [int(node_id)]
    data_dir = Path(args.data or settings.get("data_dir") or f"var/node{node_id}")
    config = NodeConfig(
        node_id=int(node_id),
        data_dir=data_dir,
        listen=listen,
        peers=peers,
        initial_voters=frozenset(int(v) for v in voters),
        tick_ms=int(settings.get("tick_ms", args.tick_ms)),
        election_ticks=int(settings.get("election_ticks", 10)),
        group_commit=GroupCommitPolicy(
            max_entries=int(settings.get("group_commit_entries", args.group_commit_entries)),
            max_delay_ms=float(settings.get("group_commit_delay_ms", args.group_commit_delay_ms)),
        ),
        snapshot_every_entries=int(settings.get("snapshot_every_entries", args.snapshot_every)),
        snapshot_every_bytes=int(settings.get("snapshot_every_mib", args.snapshot_every_mib)) << 20,
        volatile_until_fsync=bool(args.volatile or settings.get("volatile_until_fsync", False)),
        wal_preallocate=bool(settings.get("wal_preallocate", True)),
        client_addresses=client_addresses,
        auth=store_auth(args, settings),
    )
    try:
        config.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def make_machine(name: str, data_dir: Path) -> StateMachine:
    """`kv`, `counter`, or `package.module:factory` where factory(data_dir) returns a machine:
    other packages plug their machines in without raft_store importing them."""
    private_dir(data_dir)
    if name == "counter":
        return CounterMachine()
    if name == "kv":
        return KvMachine(data_dir / "kv.sqlite")
    module_name, sep, attribute = name.partition(":")
    if not sep:
        raise UsageError(f"unknown state machine {name!r} (kv, counter or module:factory)")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load state machine {name!r}: {exc}") from None
    machine: StateMachine = factory(data_dir)
    return machine


def prepare_node_process() -> None:
    """Process-wide settings for a node, before its event loop starts."""
    # The node's files hold password hashes and unmasked payloads: whatever the caller's umask,
    # what this process creates (SQLite's -wal and -shm files too) is its user's alone.
    os.umask(0o077)
    # The WAL and apply threads hand results back often; a shorter GIL switch interval keeps
    # them from waiting 5 ms behind a busy event loop.
    sys.setswitchinterval(0.0005)
    install_uvloop()


async def run_node(
    config: NodeConfig, machine: StateMachine,
    beside: Callable[[Node], contextlib.AbstractAsyncContextManager[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> int:  # fmt: skip
    """Runs the node until SIGTERM or SIGINT (0), or until `stop` is set when an embedding process
    gives one (its own signal handling sets it), or until it stops itself on a storage failure
    (1). It owns `machine` from here on and closes it, which only it can do after the node's
    last apply. `beside` is entered once the node started and left once it stopped (an
    embedding command's endpoints on the node's loop, such as its metrics).

    After a failure nothing is committed on the way out (the machine's open transaction is
    rolled back: the log replays it), and the last line on stderr names what failed and what to
    do (`stop_reason`), never an error raised by the clean-up. A process of one node is a host of
    one replica (raft_store/hosting.py)."""
    hosted_beside = None if beside is None else (lambda nodes: beside(nodes[0]))
    return await run_nodes([Replica(config, machine)], hosted_beside, stop)


def host_configs(args: argparse.Namespace) -> list[tuple[str, NodeConfig]]:
    """Each `--replica` file's group name and settings (the shared options of `add_node_arguments`
    apply to every replica; a file's own settings win); UsageError, naming the file, before any
    data directory is opened."""
    if args.config or args.id is not None or args.peer or args.listen or args.data or args.join or args.voters:
        raise UsageError("host: a replica's id, peers, listen, data and voters are in its --replica file")
    configs: list[tuple[str, NodeConfig]] = []
    for path in args.replica:
        try:
            group = str(json.loads(Path(path).read_text()).get("group", Path(path).stem))
        except (OSError, ValueError, AttributeError) as exc:
            raise UsageError(f"cannot read replica file {path}: {exc}") from None
        try:
            configs.append((group, node_config(argparse.Namespace(**{**vars(args), "config": path}))))
        except UsageError as exc:
            raise UsageError(f"replica {path}: {exc}") from None
    try:
        check_distinct(configs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return configs


def run_host(args: argparse.Namespace) -> int:
    configs = host_configs(args)
    prepare_node_process()
    replicas = [Replica(config, make_machine(args.machine, config.data_dir), group) for group, config in configs]
    return asyncio.run(run_nodes(replicas))


async def show_status(addresses: list[tuple[str, int]], auth: StoreAuth) -> int:
    client = RaftClient(addresses, auth=auth, attempt_timeout_s=1.0)
    rows = []
    for address in addresses:
        try:
            rows.append(await client.status(address))
        except Exception as exc:
            rows.append({"address": f"{address[0]}:{address[1]}", "error": repr(exc)})
    await client.close()
    print(json.dumps(rows, indent=2))
    return 0 if any("error" not in r for r in rows) else 1


async def admin(addresses: list[tuple[str, int]], auth: StoreAuth, op: str, node: int, address: str | None) -> int:
    client = RaftClient(addresses, auth=auth, deadline_s=10)
    try:
        print((await client.admin(op, node, address)).decode())
    finally:
        await client.close()
    return 0


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster secret and optional TLS files, for `store_auth` (a node's and a client's alike)."""
    parser.add_argument("--secret-file", help="the cluster secret (mode 0600; one per line: the first is presented)")
    parser.add_argument("--tls-ca", help="PEM CA that node and client certificates chain to (TLS on when given)")
    parser.add_argument("--tls-cert", help="PEM certificate of this node or client")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of `raft-store run` except --machine, for `node_config`."""
    parser.add_argument(
        "--config", help="JSON file with id, peers, client_addresses, data_dir, tick_ms, secret_file, tls_*, ..."
    )
    add_auth_arguments(parser)
    parser.add_argument("--id", type=int)
    parser.add_argument("--listen")
    parser.add_argument("--peer", action="append", help="ID=host:port, once per node (including this one)")
    parser.add_argument(
        "--client-address",
        action="append",
        help="ID=host:port clients use for node ID, once per node (when peers talk on another network)",
    )
    parser.add_argument("--data")
    parser.add_argument("--join", action="store_true", help="start empty and wait to be added")
    parser.add_argument("--voters", help="initial voters of a new cluster, e.g. 1,2,3 (default: every --peer)")
    parser.add_argument("--tick-ms", type=int, default=30)
    parser.add_argument("--group-commit-entries", type=int, default=8192)
    parser.add_argument("--group-commit-delay-ms", type=float, default=0.0)
    parser.add_argument("--snapshot-every", type=int, default=20_000, help="log entries between snapshots")
    parser.add_argument("--snapshot-every-mib", type=int, default=64, help="MiB of log between snapshots")
    parser.add_argument("--volatile", action="store_true", help="hold writes in memory until fsync (crash tests)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raft-store", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one node")
    add_node_arguments(run)
    run.add_argument("--machine", default="kv", help="kv, counter, or module:factory")
    host = sub.add_parser("host", help="run several nodes (each of its own group) in one process")
    add_node_arguments(host)
    host.add_argument("--replica", action="append", required=True,
                      help="a JSON node file (as --config: id, peers, data_dir, ...; 'group' names it), once per node")  # fmt: skip
    host.add_argument("--machine", default="kv", help="kv, counter, or module:factory (every replica's)")
    status = sub.add_parser("status", help="role, term, commit, applied and follower lag of each node")
    status.add_argument("--addresses", required=True, help="host:port,host:port,...")
    add_auth_arguments(status)
    for name in ("add-voter", "add-learner", "remove", "transfer"):
        cmd = sub.add_parser(name, help=f"{name.replace('-', ' ')} (through the leader)")
        cmd.add_argument("--addresses", required=True)
        cmd.add_argument("--node", type=int, required=True)
        add_auth_arguments(cmd)
        if name.startswith("add"):
            cmd.add_argument("--address", help="host:port of the node being added")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging("warning")
    try:
        if args.command == "run":
            config = node_config(args)
            prepare_node_process()
            machine = make_machine(args.machine, config.data_dir)
            return asyncio.run(run_node(config, machine))
        if args.command == "host":
            return run_host(args)
        addresses = [parse_address(a) for a in args.addresses.split(",") if a]
        auth = store_auth(args)
        if args.command == "status":
            return asyncio.run(show_status(addresses, auth))
        op = {"add-voter": "add_voter", "add-learner": "add_learner", "remove": "remove", "transfer": "transfer"}[
            args.command
        ]
        return asyncio.run(admin(addresses, auth, op, args.node, getattr(args, "address", None)))
    except UsageError as exc:
        print(f"raft-store: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"raft-store: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
