"""``compensator sets``: the set table in the control set (docs/sets.md).

    compensator sets list [--json]
    compensator sets init [--set ID=h:p,h:p,h:p ...]        (default: store.set_id at store.addresses)
    compensator sets add --addresses h:p,h:p,h:p [--addresses ...] --reason R
    compensator sets add --resume --reason R                 (finish an add that stopped half-way)
    compensator sets addresses --set ID --addresses h:p,h:p,h:p --reason R   (a node of the set replaced)
    compensator sets settings [--repair]                     (which sets miss an intended setting; apply them)
    compensator sets settings --adopt SET --reason R         (record what SET holds as intended: after an upgrade)
    compensator sets access --adopt SET --reason R           (copy SET's tokens and users to the control set)

Adding sets is three steps, each a replicated, audited write: the new epoch written as pending in
the control set; the intended cluster-wide settings copied to the new sets and a `RouteFence(new
epoch)` committed on every set of the epoch before; the epoch marked active. A step that fails stops the command (exit 1) and `--resume` finishes it: each step
is idempotent. The new sets must answer before anything is written.

Why against the store with the cluster secret, as `compensator token` is, and not through the
API: the set table is what the API routes by, and the actor is recorded in the control set's
document event (`--actor`, default ``cli:<login name>``) and in each fence's audit entry.

Must never: write a table that does not validate, mark an epoch active before every set of the
epoch before holds its fence, or print a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from compensator.commands.token import actor_name, with_store
from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from compensator.config_processes import parse_address
from compensator.store import control_set, raft_client, store_auth
from queues import ClientError, Code, ControlSet, QueueClient, QueueError, SetsClient, StoreAuth, cluster_settings
from queues.sets import table
from queues.sets.table import SetTable, TableError
from services.worker.breaker import NAMESPACE as BREAKERS
from services.worker.documents import TABLES

T = TypeVar("T")


class SetsCommandError(ValueError):
    """One line for the operator; the command exits 1, and nothing further was changed."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    sets = subparsers.add_parser("sets", help="the set table: list it, start it, add sets online")
    actions = sets.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the sets, their addresses and the routing epochs")
    listing.add_argument("--json", action="store_true", help="the table as JSON")
    init = actions.add_parser("init", help="write epoch 1 when the control set holds no table yet")
    init.add_argument("--set", dest="sets", action="append", default=[], metavar="ID=h:p,h:p,h:p",
                      help="a set of epoch 1 (repeat; default: store.set_id at store.addresses)")  # fmt: skip
    add = actions.add_parser("add", help="add sets online: pending epoch, fence every set, activate")
    add.add_argument("--addresses", action="append", default=[], metavar="h:p,h:p,h:p",
                     help="one new set's client addresses (repeat for several sets)")  # fmt: skip
    add.add_argument("--resume", action="store_true", help="finish a pending epoch (fence, activate)")
    moved = actions.add_parser("addresses", help="a set's addresses after a node of it was replaced (keeping a majority)")
    moved.add_argument("--set", dest="set_id", type=int, required=True, metavar="ID", help="the set")
    moved.add_argument("--addresses", required=True, metavar="h:p,h:p,h:p", help="its client addresses now")
    drift = actions.add_parser("settings", help="the cluster-wide settings each set misses (exit 1 if any); --repair applies them")
    drift.add_argument("--repair", action="store_true", help="apply what a set misses now (audited as the settings repair)")
    drift.add_argument("--adopt", type=int, metavar="SET",
                       help="record the settings SET holds and no intent names yet as intended (after upgrading a"
                            " deployment whose settings predate the fan-out); the repair then gives them to every set")  # fmt: skip
    access = actions.add_parser("access", help="copy the API tokens and review users a set holds to the control set,"
                                " where they live with several sets (once, after an upgrade)")  # fmt: skip
    access.add_argument("--adopt", type=int, required=True, metavar="SET", help="the set that holds them (the home set)")
    for parser in (init, add, moved, drift, access):
        parser.add_argument("--actor", default=actor_name(), help="who is doing this (recorded)")
        parser.add_argument("--reason", default="", help="why (recorded)")
    for parser in (listing, init, add, moved, drift, access):
        add_config_argument(parser)
    sets.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_for(args)
    if not config.store.control_addresses:
        raise SetsCommandError("store.control_addresses is empty: this deployment is one set, with no set table")
    action: Callable[[ControlSet], Awaitable[int]] = {
        "list": lambda c: _list(c, args), "init": lambda c: _init(c, config, args),
        "add": lambda c: _add(c, config, args), "addresses": lambda c: _readdress(c, config, args),
        "settings": lambda c: _settings(c, config, args),
        "access": lambda c: _adopt_access(c, config, args),
    }[args.action]  # fmt: skip
    return asyncio.run(_with_control(config, action))


async def _with_control(config: Config, action: Callable[[ControlSet], Awaitable[T]]) -> T:
    control = control_set(config)
    try:
        return await with_store(config, lambda _queue: action(control), SetsCommandError, control.queue)
    except TableError as error:
        raise SetsCommandError(str(error)) from None


def addresses_of(text: str) -> tuple[str, ...]:
    """`h:p,h:p,h:p` as a set's addresses, each checked (SetsCommandError naming a bad one)."""
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if not found:
        raise SetsCommandError(f"no addresses in {text!r}")
    for address in found:
        try:
            parse_address(address)
            table.check_address(address)
        except ValueError as error:
            raise SetsCommandError(f"--addresses: {error}") from None
    if len(set(found)) != len(found):
        raise SetsCommandError(f"--addresses: an address is listed twice in {text!r}")
    return found


async def _list(control: ControlSet, args: argparse.Namespace) -> int:
    found, version = await control.read()
    if found is None:
        raise SetsCommandError("the control set holds no set table yet (run `compensator sets init`)")
    if args.json:
        print(json.dumps({"version": version, **json.loads(table.encode(found))}))
        return 0
    for entry in found.sets:
        print(f"set {entry.id}: {','.join(entry.addresses)}")
    for epoch in found.epochs:
        print(f"epoch {epoch.epoch} ({epoch.state.value}): sets {','.join(map(str, epoch.sets))}")
    return 0


async def _init(control: ControlSet, config: Config, args: argparse.Namespace) -> int:
    wanted: dict[int, tuple[str, ...]] = {}
    for text in args.sets:
        set_id, _, addresses = text.partition("=")
        if not set_id.isdigit() or not addresses:
            raise SetsCommandError(f"--set: expected ID=h:p,h:p,h:p, got {text!r}")
        wanted[int(set_id)] = addresses_of(addresses)
    if not wanted:
        wanted = {config.store.set_id: tuple(config.store.addresses)}
    first = table.first_table(wanted)
    found, version = await control.read()
    if found is not None:
        if found == first:
            print("the set table already holds this epoch 1", file=sys.stderr)
            return 0
        raise SetsCommandError("the control set already holds a set table: `compensator sets add` grows it")
    await _answering(config, first.addresses())
    await control.write(first, expected_version=version, actor=args.actor, reason=args.reason or "sets init")
    print(f"epoch 1: sets {','.join(str(entry.id) for entry in first.sets)}", file=sys.stderr)
    return 0


async def _add(control: ControlSet, config: Config, args: argparse.Namespace) -> int:
    found, version = await control.read()
    if found is None:
        raise SetsCommandError("the control set holds no set table yet (run `compensator sets init`)")
    pending = found.pending()
    if args.resume != (pending is not None) or (args.resume and args.addresses):
        if pending is not None:
            raise SetsCommandError(f"epoch {pending.epoch} is pending: finish it with `compensator sets add --resume`")
        raise SetsCommandError("give --addresses for each new set" if not args.resume else "no epoch is pending")
    reason = args.reason or "sets add"
    if pending is None:
        added = [addresses_of(text) for text in args.addresses]
        grown, pending = table.with_new_sets(found, added)
        new_ids = [entry.id for entry in grown.sets if entry.id not in found.addresses()]
        await _answering(config, {set_id: grown.addresses()[set_id] for set_id in new_ids})
        version = await control.write(grown, expected_version=version, actor=args.actor, reason=reason)
        found = grown
        print(f"epoch {pending.epoch} pending: sets {','.join(map(str, pending.sets))}", file=sys.stderr)
    before = found.epochs[pending.epoch - 2]
    sets = _facade(config, found)
    try:
        await _copy_settings(control, sets, [s for s in pending.sets if s not in before.sets])
        fenced = await sets.fence(before.sets, pending.epoch, actor=args.actor, reason=reason)
    finally:
        await sets.close()
    print(f"fenced sets {','.join(map(str, sorted(fenced)))} at route epoch {pending.epoch}", file=sys.stderr)
    await control.write(table.activated(found, pending.epoch), expected_version=version, actor=args.actor,
                        reason=reason)  # fmt: skip
    print(f"epoch {pending.epoch} active", file=sys.stderr)
    return 0


async def _readdress(control: ControlSet, config: Config, args: argparse.Namespace) -> int:
    """After a node of a set was replaced (docs/runbook.md, "Replacing a failed node"): the table
    names the set's nodes now, so the routers (the API, the workers, the projector) reconnect
    there at their next table read. The set must answer at the new addresses first."""
    found, version = await control.read()
    if found is None:
        raise SetsCommandError("the control set holds no set table yet (run `compensator sets init`)")
    addresses = addresses_of(args.addresses)
    moved = table.readdressed(found, args.set_id, addresses)
    await _answering(config, {args.set_id: addresses})
    await control.write(moved, expected_version=version, actor=args.actor, reason=args.reason or "sets addresses")
    print(f"set {args.set_id}: {','.join(addresses)}", file=sys.stderr)
    return 0


async def _copy_settings(control: ControlSet, sets: SetsClient, new_ids: list[int]) -> None:
    """The intended cluster-wide settings (pauses, policies, breakers' modes, classification
    tables, retention: queues/sets/settings.py) written to the new sets before their epoch is
    active, so no key is leased there under settings the other sets do not have. A failure stops
    the add (`--resume` repeats it: each write is idempotent)."""
    report = await cluster_settings.repair(control.queue, {set_id: sets.client(set_id) for set_id in new_ids})
    for set_id in new_ids:
        done = report.get(set_id, [])
        if isinstance(done, Exception):
            raise SetsCommandError(f"set {set_id} did not take the cluster-wide settings ({done}); nothing was"
                                   " activated: run `compensator sets add --resume` when it answers")  # fmt: skip
        print(f"set {set_id}: {len(done)} cluster-wide setting(s) copied", file=sys.stderr)


async def _settings(control: ControlSet, config: Config, args: argparse.Namespace) -> int:
    """Each intended setting and the sets that do not hold it; with --repair, applied to them
    (what the API's settings repair does every store.sets_refresh_s, for the on-call engineer who
    wants it now: docs/runbook.md)."""
    found, _ = await control.read()
    if found is None:
        raise SetsCommandError("the control set holds no set table yet (run `compensator sets init`)")
    if args.adopt is not None:
        return await _adopt(control, config, found, args)
    wanted, _ = await cluster_settings.intended(control.queue)
    sets = _facade(config, found)
    ids = [entry.id for entry in found.sets]
    behind: dict[str, list[int]] = {name: [] for setting in wanted for name, _ in cluster_settings.intents(setting)}
    silent: list[int] = []
    try:
        if args.repair:
            report = await cluster_settings.repair(control.queue, {set_id: sets.client(set_id) for set_id in ids})
            for set_id, done in sorted(report.items()):
                if isinstance(done, Exception):
                    print(f"set {set_id}: does not answer ({done})")
                    silent.append(set_id)
                else:
                    print(f"set {set_id}: re-applied {', '.join(n for s in done for n, _ in cluster_settings.intents(s))}")
        else:
            for set_id in ids:
                try:
                    missing = await cluster_settings.drift(sets.client(set_id), wanted)
                except (ClientError, QueueError) as error:
                    print(f"set {set_id}: does not answer ({error})")
                    silent.append(set_id)
                    continue
                for setting in missing:
                    for name, _ in cluster_settings.intents(setting):
                        behind[name].append(set_id)
            for name, missed in sorted(behind.items()):
                print(f"{name}: " + (f"missing in sets {','.join(map(str, missed))}" if missed else "in every set"))
    finally:
        await sets.close()
    late = sorted({set_id for missed in behind.values() for set_id in missed})
    if silent or late:
        what = f"sets {','.join(map(str, late))} miss intended settings" if late else ""
        what += ("; " if what else "") + (f"sets {','.join(map(str, silent))} do not answer" if silent else "")
        raise SetsCommandError(f"{what}: `compensator sets settings --repair` applies them once they answer (the"
                               " API's settings repair does too, every store.sets_refresh_s)")  # fmt: skip
    return 0


ADOPTED_NAMESPACES: Final = (BREAKERS, TABLES)
"""The settings documents that are cluster-wide (the breakers' modes, the classification tables)."""


def _known(found: SetTable, set_id: int) -> None:
    """`--adopt SET` names a set of the table, or SetsCommandError (nothing was changed)."""
    if set_id not in found.addresses():
        raise SetsCommandError(f"--adopt {set_id}: the set table has no set {set_id}"
                               f" (sets {','.join(map(str, sorted(found.addresses())))})")  # fmt: skip


async def _adopt(control: ControlSet, config: Config, found: SetTable, args: argparse.Namespace) -> int:
    _known(found, args.adopt)
    if args.repair:
        raise SetsCommandError("--adopt and --repair: adopt first, then repair (or let the API's repair do it)")
    sets = _facade(config, found)
    try:
        adopted = await cluster_settings.adopt(
            control.queue, sets.client(args.adopt), ADOPTED_NAMESPACES, actor=args.actor,
            reason=args.reason or f"adopted from set {args.adopt}",
        )  # fmt: skip
    finally:
        await sets.close()
    for name in adopted:
        print(f"adopted {name}")
    print(f"{len(adopted)} setting(s) of set {args.adopt} recorded as intended; the API's settings repair gives them"
          " to every set within store.sets_refresh_s (or now: `compensator sets settings --repair`)")  # fmt: skip
    return 0


async def _adopt_access(control: ControlSet, config: Config, args: argparse.Namespace) -> int:
    """Tokens (their hashes, roles and quotas) and review users (with their password hashes) of one
    set, copied to the control set where the control set has none of that name. Revoked tokens and
    web sessions are not copied (users sign in again). Nothing secret is printed: tokens are hashes."""
    from api.web.accounts import PASSWORDS, USERS

    found, _ = await control.read()
    if found is None:
        raise SetsCommandError("the control set holds no set table yet (run `compensator sets init`)")
    _known(found, args.adopt)
    reason = args.reason or f"copied from set {args.adopt}: tokens and users live in the control set"
    sets = _facade(config, found)
    target = control.queue
    copied: list[str] = []
    try:
        source = sets.client(args.adopt)
        have = {view.name for view in (await target.tokens()).value.tokens}
        for view in (await source.tokens()).value.tokens:
            if view.name in have or view.revoked_ms is not None:
                continue
            result = await target.put_token(view.name, view.role, view.secret_hash, actor=args.actor, reason=reason)
            if result.code is not Code.OK:
                raise SetsCommandError(f"the control set refused token {view.name}: {result.code.name}")
            if view.rate_per_s is not None or view.burst is not None:
                await target.set_quota(view.name, actor=args.actor, rate_per_s=view.rate_per_s, burst=view.burst)
            copied.append(f"token {view.name} ({view.role.value})")
        for namespace in (USERS, PASSWORDS):
            existing = {d.name for d in (await target.documents(namespace)).value.documents}
            for document in (await source.documents(namespace)).value.documents:
                if document.name in existing:
                    continue
                put = await target.put_document(namespace, document.name, document.body, actor=args.actor, reason=reason)
                if put.code is not Code.OK:
                    raise SetsCommandError(f"the control set refused {namespace}/{document.name}: {put.code.name}")
                if namespace == USERS:
                    copied.append(f"user {document.name}")
    finally:
        await sets.close()
    for line in copied:
        print(f"copied {line}")
    print(f"{len(copied)} token(s) and user(s) of set {args.adopt} now also in the control set, where the API"
          " reads them", file=sys.stderr)  # fmt: skip
    return 0


def _facade(config: Config, found: SetTable) -> SetsClient:
    auth = store_auth(config)
    return SetsClient(found, connect=lambda _set_id, addresses: QueueClient(raft_client(config, auth, addresses)))


async def _answering(config: Config, sets: dict[int, tuple[str, ...]]) -> None:
    """Every one of these sets elects a leader and answers a linearizable read, or SetsCommandError."""
    auth: StoreAuth = store_auth(config)
    for set_id, addresses in sorted(sets.items()):
        queue = QueueClient(raft_client(config, auth, addresses))
        try:
            await queue.retention()
        except (ClientError, QueueError) as error:
            raise SetsCommandError(f"set {set_id} at {','.join(addresses)} does not answer ({error}); nothing was changed") from None
        finally:
            await queue.raft.close()



