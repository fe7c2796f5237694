"""``compensator node``: one store node running the queue machine.

    compensator node --config service.toml --id 2
    COMPENSATOR_NODE__ID=2 compensator node           # the same from the environment

The node reads the same configuration as every other process: the set is `[store] addresses`
(node N is the N-th; `store.peer_addresses` when the nodes talk on a network of their own), its
own settings are `[node]`, its cluster secret is `store.secret_file`. Every flag overrides the
setting it names. A node given its peers on the command line (``--peer ID=host:port``, once per
node, and ``--client-address``), as before, still starts from them.

``--config`` is the service's TOML file, as for every other command; a JSON node file (the format
``raft-store run --config`` reads) is refused with one line that says so.

One process may host replicas of more sets beside its own (``node.replicas``, ``--replica JSON``
once each): one process per machine instead of one per replica (docs/sets.md).

The process is built by the composition root (compensator/wiring/node.py) and run by the process
shell (compensator/shell.py); this module owns the flags.

Must never: open the node's data directory before its settings validated.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from compensator.config_file import add_config_argument, config_path


class NodeCommandError(ValueError):
    """Bad node options: one line, exit 1."""


FLAGS: tuple[tuple[str, str, str], ...] = (
    ("id", "node", "id"), ("listen", "node", "listen"), ("data", "node", "data_dir"), ("join", "node", "join"),
    ("tick_ms", "node", "tick_ms"), ("group_commit_entries", "node", "group_commit_entries"),
    ("group_commit_delay_ms", "node", "group_commit_delay_ms"), ("snapshot_every", "node", "snapshot_every_entries"),
    ("snapshot_every_mib", "node", "snapshot_every_mib"), ("secret_file", "store", "secret_file"),
    ("tls_ca", "store", "tls_ca"), ("tls_cert", "store", "tls_cert"), ("tls_key", "store", "tls_key"),
)  # fmt: skip
"""argparse's name, and the (section, field) the flag overrides."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    node = subparsers.add_parser("node", help="run one store node (Raft, the queue machine)")
    add_config_argument(node)
    node.add_argument("--id", type=int, help="this node's place in store.addresses, from 1 (node.id)")
    node.add_argument("--listen", help="host:port to listen on (node.listen; default its address in the set)")
    node.add_argument("--data", help="its data folder (node.data_dir; default var/node<id>)")
    node.add_argument("--join", action="store_true", default=None, help="start empty and wait to be added (node.join)")
    node.add_argument("--voters", help="initial voters of a new set, e.g. 1,2,3 (node.voters; default: every node)")
    node.add_argument("--peer", action="append", help="ID=host:port, once per node: the set from the command line"
                                                      " instead of store.addresses")  # fmt: skip
    node.add_argument("--client-address", action="append",
                      help="ID=host:port clients use for node ID, once per node (with --peer)")  # fmt: skip
    node.add_argument("--tick-ms", type=int, help="node.tick_ms")
    node.add_argument("--group-commit-entries", type=int, help="node.group_commit_entries")
    node.add_argument("--group-commit-delay-ms", type=float, help="node.group_commit_delay_ms")
    node.add_argument("--snapshot-every", type=int, help="log entries between snapshots (node.snapshot_every_entries)")
    node.add_argument("--snapshot-every-mib", type=int, help="MiB of log between snapshots (node.snapshot_every_mib)")
    node.add_argument("--volatile", action="store_true", help="hold writes in memory until fsync (crash tests)")
    node.add_argument("--secret-file", help="the cluster secret (store.secret_file)")
    node.add_argument("--tls-ca", help="store.tls_ca")
    node.add_argument("--tls-cert", help="store.tls_cert")
    node.add_argument("--tls-key", help="store.tls_key")
    node.add_argument("--replica", action="append", metavar="JSON",
                      help='one more replica to host, once each: {"set_id": 2, "id": 1, "addresses": [...], "data_dir": ...}'
                           " (node.replicas; docs/sets.md)")  # fmt: skip
    node.add_argument("--metrics-address", help="serve Prometheus metrics on HOST:PORT (node.metrics_host and"
                                                " metrics_port); default off")  # fmt: skip
    node.set_defaults(handler=serve)


def _not_json(path: Path | None) -> None:
    """The node's --config was once raft_store's JSON node file: say what it is now, in one line."""
    if path is None or not path.is_file():
        return
    try:
        text = path.read_text()
        json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if text.lstrip().startswith("{"):
        raise NodeCommandError(
            f"{path} is a JSON node file: `compensator node --config` reads the service's TOML configuration,"
            " the set in [store] addresses and this node in [node] (docs/configuration.md); flags such as --id"
            " and --peer still work, and `raft-store run --config` still reads JSON"
        )


def flags(args: argparse.Namespace) -> dict[tuple[str, str], tuple[Any, str]]:
    """The flags given, as overrides of the settings they name (`configuration.load`'s `flags`)."""
    given: dict[tuple[str, str], tuple[Any, str]] = {
        (section, field): (getattr(args, name), "--" + name.replace("_", "-"))
        for name, section, field in FLAGS if getattr(args, name) is not None
    }  # fmt: skip
    if args.voters is not None:
        try:
            voters = [int(v) for v in args.voters.split(",") if v.strip()]
        except ValueError:
            raise NodeCommandError(f"--voters {args.voters!r} is not a list of node ids") from None
        given[("node", "voters")] = (voters, "--voters")
    if args.replica:
        replicas = []
        for text in args.replica:
            try:
                replica = json.loads(text)
            except ValueError:
                raise NodeCommandError(f"--replica {text!r} is not a JSON object") from None
            if not isinstance(replica, dict):
                raise NodeCommandError(f"--replica {text!r} is not a JSON object")
            replicas.append(replica)
        given[("node", "replicas")] = (replicas, "--replica")
    if args.metrics_address:
        from compensator.config_processes import parse_address

        try:
            host, port = parse_address(args.metrics_address)
        except ValueError as error:
            raise NodeCommandError(f"--metrics-address: {error}") from None
        given[("node", "metrics_host")] = (host, "--metrics-address")
        given[("node", "metrics_port")] = (port, "--metrics-address")
    return given


def serve(args: argparse.Namespace) -> int:
    from compensator import config as configuration
    from compensator import shell
    from compensator.wiring import node
    from raft_store import cli as raft_cli

    path = config_path(args)
    _not_json(path)
    config = configuration.load(path, flags=flags(args))
    peers = clients = None
    if args.peer:
        try:
            peers = raft_cli.parse_peers(args.peer)
            clients = raft_cli.parse_peers(args.client_address or [], "client address")
        except raft_cli.UsageError as error:
            raise NodeCommandError(str(error)) from None
    settings = node.node_config(config, peers=peers, client_addresses=clients, volatile=args.volatile)
    hosted = node.hosted_configs(config, settings, volatile=args.volatile)
    raft_cli.prepare_node_process()
    return shell.run(node.shell(config), functools.partial(node.process, config, settings, hosted))
