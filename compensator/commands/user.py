"""``compensator user``: the finance review's people: add, list, disable, enable, passwd, role, unlock.

Like ``compensator token``, it talks to the store directly (api/web/accounts.py keeps users,
password hashes, sessions and logins as documents there), and each change is an audited
`document_put` with the operator who ran it (``--actor``, default the login name). Disabling a
user, or changing their role or password, ends their sessions at once in every API process.

A password comes from ``--password-file``, else from standard input when it is not a terminal
(``printf %s "$PW" | compensator user add ...``), else from a prompt asked twice; never from the
command line, where other users of the machine could read it.

Must never: print or log a password or its hash (``user list`` shows neither).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from api.web.accounts import AccountError, Accounts
from api.web.rights import WEB_ROLES
from compensator.commands.token import actor_name, with_store
from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from queues import QueueClient, Role


class UserCommandError(ValueError):
    """One line for the operator; the command exits 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    user = subparsers.add_parser("user", help="the review pages' users: add, list, disable, enable, passwd, role, unlock")
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    roles = [role.value for role in WEB_ROLES]
    add = actions.add_parser("add", help="add a user (the password from --password-file, stdin or a prompt)")
    add.add_argument("--role", required=True, choices=roles)
    listing = actions.add_parser("list", help="every user: name, role, disabled, created, last login (never a hash)")
    disable = actions.add_parser("disable", help="disable a user and end their sessions")
    disable.add_argument("--reason", required=True, help="why (recorded)")
    enable = actions.add_parser("enable", help="enable a user again (and lift a login lock)")
    passwd = actions.add_parser("passwd", help="set a user's password and end their sessions")
    role = actions.add_parser("role", help="change a user's role and end their sessions")
    role.add_argument("--role", required=True, choices=roles)
    unlock = actions.add_parser("unlock", help="lift a login lock (after failed logins) and forget the failures")
    for parser in (add, disable, enable, passwd, role, unlock):
        parser.add_argument("--name", required=True, help="the login name (a-z, 0-9, _.-; up to 32)")
        parser.add_argument("--actor", default=actor_name(), help="who is doing this (recorded)")
        if parser is not disable:
            parser.add_argument("--reason", default="", help="why (recorded)")
    for parser in (add, passwd):
        parser.add_argument("--password-file", type=Path, help="a file holding the password (its first line)")
    for parser in (add, listing, disable, enable, passwd, role, unlock):
        add_config_argument(parser)
    user.set_defaults(handler=run)


def read_password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        try:
            lines = args.password_file.read_text().splitlines()
        except OSError as error:
            raise UserCommandError(f"{args.password_file}: cannot read: {error.strerror or error}") from None
        return lines[0] if lines else ""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise UserCommandError("the two passwords differ; nothing was changed")
    return first


def run(args: argparse.Namespace) -> int:
    config = load_for(args)
    password = read_password(args) if args.action in ("add", "passwd") else ""
    action: Callable[[Accounts], Awaitable[str]] = {
        "add": lambda a: _add(a, args, password),
        "list": _list,
        "disable": lambda a: _ended(a.disable(args.name, actor=args.actor, reason=args.reason), f"{args.name} disabled"),
        "enable": lambda a: _done(a.enable(args.name, actor=args.actor, reason=args.reason), f"{args.name} enabled"),
        "passwd": lambda a: _ended(a.set_password(args.name, password, actor=args.actor, reason=args.reason or "password changed"),
                                   f"password of {args.name} changed"),
        "role": lambda a: _ended(a.set_role(args.name, Role(args.role), actor=args.actor, reason=args.reason),
                                 f"{args.name} is now {args.role}"),
        "unlock": lambda a: _unlocked(a.unlock(args.name, actor=args.actor, reason=args.reason), args.name),
    }[args.action]  # fmt: skip
    print(asyncio.run(_with_store(config, action)), file=sys.stderr if args.action != "list" else sys.stdout)
    return 0


async def _with_store(config: Config, action: Callable[[Accounts], Awaitable[str]]) -> str:
    async def on(queue: QueueClient) -> str:
        try:
            return await action(Accounts(queue, clock_ms=lambda: time.time_ns() // 1_000_000))
        except AccountError as error:
            raise UserCommandError(str(error)) from None

    return await with_store(config, on, UserCommandError)


async def _add(accounts: Accounts, args: argparse.Namespace, password: str) -> str:
    await accounts.add(args.name, Role(args.role), password, actor=args.actor)
    return f"user {args.name} ({args.role}) added"


async def _ended(change: Awaitable[int], what: str) -> str:
    ended = await change
    return f"{what}; {ended} session{'' if ended == 1 else 's'} ended"


async def _unlocked(change: Awaitable[bool], name: str) -> str:
    return f"{name} unlocked" if await change else f"{name} was not locked; its failed logins are forgotten"


async def _done(change: Awaitable[None], what: str) -> str:
    await change
    return what


async def _list(accounts: Accounts) -> str:
    from api.schemas import utc

    users, logins = await asyncio.gather(accounts.users(), accounts.logins())
    lines = []
    for name, user in sorted(users.items()):
        login = logins.get(name)
        last = None if login is None or login.last_login_ms is None else utc(login.last_login_ms)
        locked = None if login is None or login.locked_until_ms is None else utc(login.locked_until_ms)
        lines.append(json.dumps({
            "name": name, "role": user.role.value, "disabled": user.disabled, "disabled_reason": user.disabled_reason or None,
            "created_at": utc(user.created_ms), "created_by": user.created_by, "last_login_at": last,
            "locked_until": locked,
        }))  # fmt: skip
    return "\n".join(lines)
