"""`raft-store`: run one node, show cluster status, change membership, transfer leadership.

Bad arguments end with one line on stderr and exit status 2; an unreachable cluster with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from raft_store.client import RaftClient
from raft_store.machines import CounterMachine, KvMachine
from raft_store.node import Node, NodeConfig
from raft_store.state_machine import StateMachine
from raft_store.wal import GroupCommitPolicy


class UsageError(Exception):
    pass


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


def node_config(args: argparse.Namespace) -> NodeConfig:
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
    client_addresses = (parse_peers(args.client_address, "client address") if args.client_address
                        else _address_map(settings.get("client_addresses", {}), "client_addresses"))
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
        node_id=int(node_id), data_dir=data_dir, listen=listen, peers=peers,
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
        client_addresses=client_addresses,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def make_machine(name: str, data_dir: Path) -> StateMachine:
    """`kv`, `counter`, or `package.module:factory` where factory(data_dir) returns a machine:
    other packages plug their machines in without raft_store importing them."""
    data_dir.mkdir(parents=True, exist_ok=True)
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


async def run_node(config: NodeConfig, machine_name: str) -> int:
    machine = make_machine(machine_name, config.data_dir)
    node = Node(config, machine)
    await node.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"event": "started", "node": config.node_id, "listen": f"{config.listen[0]}:{config.listen[1]}"}), flush=True)
    stopped = loop.create_task(node.stopped.wait())
    await asyncio.wait([loop.create_task(stop.wait()), stopped], return_when=asyncio.FIRST_COMPLETED)
    failed = node.stopped.is_set()
    await node.stop()
    machine.close()
    return 1 if failed else 0


async def show_status(addresses: list[tuple[str, int]]) -> int:
    client = RaftClient(addresses, attempt_timeout_s=1.0)
    rows = []
    for address in addresses:
        try:
            rows.append(await client.status(address))
        except Exception as exc:
            rows.append({"address": f"{address[0]}:{address[1]}", "error": repr(exc)})
    await client.close()
    print(json.dumps(rows, indent=2))
    return 0 if any("error" not in r for r in rows) else 1


async def admin(addresses: list[tuple[str, int]], op: str, node: int, address: str | None) -> int:
    client = RaftClient(addresses, deadline_s=10)
    try:
        print((await client.admin(op, node, address)).decode())
    finally:
        await client.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raft-store", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one node")
    run.add_argument("--config", help="JSON file with id, peers, data_dir, tick_ms, ...")
    run.add_argument("--id", type=int)
    run.add_argument("--listen")
    run.add_argument("--peer", action="append", help="ID=host:port, once per node (including this one)")
    run.add_argument("--client-address", action="append",
                     help="ID=host:port clients use for node ID, once per node (when peers talk on another network)")
    run.add_argument("--data")
    run.add_argument("--machine", default="kv", help="kv, counter, or module:factory")
    run.add_argument("--join", action="store_true", help="start empty and wait to be added")
    run.add_argument("--voters", help="initial voters of a new cluster, e.g. 1,2,3 (default: every --peer)")
    run.add_argument("--tick-ms", type=int, default=30)
    run.add_argument("--group-commit-entries", type=int, default=8192)
    run.add_argument("--group-commit-delay-ms", type=float, default=0.0)
    run.add_argument("--snapshot-every", type=int, default=20_000, help="log entries between snapshots")
    run.add_argument("--snapshot-every-mib", type=int, default=64, help="MiB of log between snapshots")
    run.add_argument("--volatile", action="store_true", help="hold writes in memory until fsync (crash tests)")
    status = sub.add_parser("status", help="role, term, commit, applied and follower lag of each node")
    status.add_argument("--addresses", required=True, help="host:port,host:port,...")
    for name in ("add-voter", "add-learner", "remove", "transfer"):
        cmd = sub.add_parser(name, help=f"{name.replace('-', ' ')} (through the leader)")
        cmd.add_argument("--addresses", required=True)
        cmd.add_argument("--node", type=int, required=True)
        if name.startswith("add"):
            cmd.add_argument("--address", help="host:port of the node being added")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "run":
            config = node_config(args)
            # The WAL and apply threads hand results back often; a shorter GIL switch interval
            # keeps them from waiting 5 ms behind a busy event loop.
            sys.setswitchinterval(0.0005)
            try:
                import uvloop

                uvloop.install()
            except ImportError:
                pass
            return asyncio.run(run_node(config, args.machine))
        addresses = [parse_address(a) for a in args.addresses.split(",") if a]
        if args.command == "status":
            return asyncio.run(show_status(addresses))
        op = {"add-voter": "add_voter", "add-learner": "add_learner", "remove": "remove", "transfer": "transfer"}[args.command]
        return asyncio.run(admin(addresses, op, args.node, getattr(args, "address", None)))
    except UsageError as exc:
        print(f"raft-store: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"raft-store: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
