"""``compensator token``: create (or rotate), revoke and list API tokens, and set a producer's quota.

A token is printed once, on stdout alone, so it can be captured (``TOKEN=$(compensator token
create ...)``); the store keeps only its SHA-256. Every change is a replicated command recorded as
an event with the operator who ran it (``--actor``, default the login name) and the reason.

Must never: print or log a token anywhere but that one line, or print a hash.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from api.tokens import new_token, token_hash
from compensator.config import Config
from compensator.config_file import add_config_argument, load_for
from compensator.store import access_addresses, access_client
from queues import AuthenticationFailed, ClientError, Code, QueueClient, QueueError, Role, TokenResult

T = TypeVar("T")


class TokenCommandError(ValueError):
    """One line for the operator; the command exits 1."""


def actor_name() -> str:
    """Who runs an admin command, as the audit records it: ``cli:<login name>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    token = subparsers.add_parser("token", help="create, revoke and list API tokens; set quotas")
    actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token, or rotate an existing one (printed once)")
    create.add_argument("--name", required=True, help="who holds it, e.g. red-packet (a-z, 0-9, _.-)")
    create.add_argument("--role", required=True, choices=[role.value for role in Role])
    revoke = actions.add_parser("revoke", help="revoke a token (every API process stops taking it within seconds)")
    revoke.add_argument("--name", required=True)
    quota = actions.add_parser("quota", help="set a producer's intake rate and burst (omit both: the defaults)")
    quota.add_argument("--name", required=True)
    quota.add_argument("--rate", type=int, help="requests per second, across all API processes")
    quota.add_argument("--burst", type=int)
    listing = actions.add_parser("list", help="every token: name, role, created, revoked, quota (never secrets)")
    for parser in (create, revoke, quota, listing):
        add_config_argument(parser)
        if parser is not listing:
            parser.add_argument("--actor", default=actor_name(), help="who is doing this (recorded)")
            parser.add_argument("--reason", default="", help="why (recorded)")
    token.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_for(args)
    action: Callable[[QueueClient], Awaitable[int]] = {
        "create": lambda q: _create(q, args), "revoke": lambda q: _revoke(q, args),
        "quota": lambda q: _quota(q, args), "list": lambda q: _list(q),
    }[args.action]  # fmt: skip
    return asyncio.run(with_store(config, action))


async def with_store(
    config: Config, action: Callable[[QueueClient], Awaitable[T]], error_type: type[ValueError] = TokenCommandError,
    queue: QueueClient | None = None,
) -> T:
    """`action` on a client of where tokens and users live (`store.access_client`: the control set
    with several sets), or of `queue`; closed after; the store's failures as one line."""
    addresses = access_addresses(config) if queue is None else [f"{h}:{p}" for h, p in queue.raft.addresses]
    queue = queue or access_client(config)
    try:
        return await action(queue)
    except AuthenticationFailed as error:
        raise error_type(f"the store refused this command's cluster secret ({config.secret_path}): {error}") from None
    except ClientError as error:
        raise error_type(f"the store at {','.join(addresses)} did not answer: {error}") from None
    except QueueError as error:
        raise error_type(f"the store refused it: {error}") from None
    finally:
        await queue.raft.close()


def _checked(result: TokenResult, name: str) -> TokenResult:
    if result.code is Code.NOT_FOUND:
        raise TokenCommandError(f"no token named {name!r}")
    if result.code is not Code.OK:
        raise TokenCommandError(f"the store refused it: {result.code.name}")
    return result


async def _create(queue: QueueClient, args: argparse.Namespace) -> int:
    token = new_token()
    result = await queue.put_token(args.name, Role(args.role), token_hash(token), actor=args.actor, reason=args.reason)
    _checked(result, args.name)
    print(token)
    print(f"token for {args.name} ({args.role}) stored; it is shown only this once", file=sys.stderr)
    return 0


async def _revoke(queue: QueueClient, args: argparse.Namespace) -> int:
    _checked(await queue.revoke_token(args.name, actor=args.actor, reason=args.reason), args.name)
    print(f"token {args.name} revoked", file=sys.stderr)
    return 0


async def _quota(queue: QueueClient, args: argparse.Namespace) -> int:
    for flag in ("rate", "burst"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise TokenCommandError(f"--{flag} must be a positive integer")
    result = await queue.set_quota(args.name, actor=args.actor, rate_per_s=args.rate, burst=args.burst)
    _checked(result, args.name)
    print(f"quota of {args.name}: rate {args.rate or 'default'}/s, burst {args.burst or 'default'}", file=sys.stderr)
    return 0


async def _list(queue: QueueClient) -> int:
    from api.schemas import utc

    for view in (await queue.tokens()).value.tokens:
        print(json.dumps({
            "name": view.name, "role": view.role.value, "created_at": utc(view.created_ms),
            "created_by": view.created_by, "revoked_at": None if view.revoked_ms is None else utc(view.revoked_ms),
            "rate_per_s": view.rate_per_s, "burst": view.burst,
        }))  # fmt: skip
    return 0
