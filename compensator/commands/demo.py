"""``compensator demo``: traffic for the local run that a red-packet flow would really send.

    compensator demo [--transfers N] [--amount-minor A] [--currency C] [--api-url URL] [--red-packet-url URL]

In the flow we compensate, a transfer is never made up: a user opens a red packet, the red-packet
service records who received how much (a grant, `<red_packet_id>:<receiver>`), and only then asks
the payment system to pay it, with the grant's id as the business id. When that call fails, the
red-packet service hands the transfer to us. The demo does the same, one red packet shared by N
receivers: for each, the grant at the red-packet service (`PUT /red-packets/{id}/receivers/{who}`,
version 1; `make run`'s stand-in records it in ``red_packet_grants``), then the failed transfer
submitted to the API (ref key = the grant's id, payee = the receiver, the grant's amount). So the
nightly reconciliation of the local run finds a grant behind every payout, and a healthy run
reconciles clean: only real breaks show (a dead letter, a payout nobody granted).

The token is a producer's, from ``--token-file`` or ``$COMPENSATOR_API_TOKEN`` (never the command
line); `make run` prints the command with its producer token. URLs default to the configuration's
(`api.public_url` or host:port, `handlers.red_packet.base_url`).

Must never: submit a transfer whose grant was refused, or print the token.
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from compensator.commands.operator import TOKEN_ENV, Api, api_token
from compensator.config_file import add_config_argument, load_for

PAYER: Final = "red-packet-escrow"
"""The escrow account red packets are paid from (also `compensator reconcile`'s default payer)."""
TRANSFERS_MAX: Final = 1000
TIMEOUT_S: Final = 10.0


class DemoError(ValueError):
    """A grant or a submission was refused, or a service did not answer: one line, exit 1."""


@dataclass(frozen=True, slots=True)
class Share:
    """One receiver's share of a red packet: granted first, then its transfer."""

    red_packet_id: str
    receiver: str
    amount_minor: int
    currency: str

    @property
    def grant_id(self) -> str:
        """The red-packet service's grant id, which its transfer carries as business id (our ref key)."""
        return f"{self.red_packet_id}:{self.receiver}"

    @property
    def grant_path(self) -> str:
        return f"/red-packets/{quote(self.red_packet_id, safe='')}/receivers/{quote(self.receiver, safe='')}"

    @property
    def grant_key(self) -> str:
        return f"grant-{self.red_packet_id}-{self.receiver}"

    def grant(self) -> dict[str, Any]:
        return {"version": 1, "amount_minor": self.amount_minor, "currency": self.currency}

    @property
    def submission_key(self) -> str:
        return f"transfer-{self.red_packet_id}-{self.receiver}"

    def submission(self) -> dict[str, Any]:
        """The failed transfer, as the red-packet service POSTs it to us."""
        return {
            "kind": "transfer", "ref_key": self.grant_id,
            "payload": {"transfer_id": f"tr-{self.red_packet_id}-{self.receiver}", "payer": PAYER,
                        "payee": self.receiver, "amount_minor": self.amount_minor, "currency": self.currency},
            "failure": {"error_class": "timeout", "text": "payment system did not answer in 2 s"},
        }  # fmt: skip


def red_packet_id(now: dt.datetime) -> str:
    """A new red packet's id: readable, and not one granted before (a run per second at most would
    not do: two demos in one second must not share receivers)."""
    return f"rp-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"


def shares(packet: str, count: int, amount_minor: int, currency: str) -> list[Share]:
    """`count` receivers of one red packet, amounts varied around `amount_minor` (a red packet's
    shares differ), none below one minor unit."""
    return [Share(packet, f"user-{i}", max(1, amount_minor + (i * 37) % 200 - 100), currency)
            for i in range(1, count + 1)]  # fmt: skip


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    demo = subparsers.add_parser(
        "demo", help="grant a red packet's shares at the red-packet service and submit their failed transfers"
    )
    add_config_argument(demo)
    demo.add_argument("--transfers", type=_whole(TRANSFERS_MAX), default=10,
                      help=f"receivers of the red packet (1..{TRANSFERS_MAX})")  # fmt: skip
    demo.add_argument("--amount-minor", type=_whole(10**12), default=888, help="about each share, in minor units")
    demo.add_argument("--currency", default="CNY")
    demo.add_argument("--api-url", help="the compensation API (default: the configuration's)")
    demo.add_argument("--red-packet-url", help="the red-packet service (default: handlers.red_packet.base_url)")
    demo.add_argument("--token-file", type=Path, help=f"a file holding a producer token (default ${TOKEN_ENV})")
    demo.set_defaults(handler=run)


def _whole(most: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is not within 1..{most}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    config = load_for(args)
    api_url = (args.api_url or config.api_url).rstrip("/")
    red_packet_url = (args.red_packet_url or config.handlers.red_packet.base_url).rstrip("/")
    api = Api(api_url, api_token(args.token_file))
    packet = red_packet_id(dt.datetime.now(dt.UTC))
    print(f"red packet {packet}: {args.transfers} receivers, each granted at {red_packet_url}, then its failed"
          f" transfer submitted to {api_url}", flush=True)  # fmt: skip
    for share in shares(packet, args.transfers, args.amount_minor, args.currency):
        _grant(red_packet_url, share)
        answer = api.call("POST", "/v1/requests", body=share.submission(), headers={"Idempotency-Key": share.submission_key})
        print(f"  {share.grant_id}  {share.amount_minor} {share.currency} (minor units)  request {answer['id']}"
              f"  {answer['state']}", flush=True)  # fmt: skip
    print(f"Read one back: curl -sS {api_url}/v1/requests/<id> -H \"Authorization: Bearer ${TOKEN_ENV}\"")
    return 0


def _grant(base_url: str, share: Share) -> None:
    import httpx

    try:
        answer = httpx.put(base_url + share.grant_path, json=share.grant(), timeout=TIMEOUT_S,
                           headers={"Idempotency-Key": share.grant_key})  # fmt: skip
    except httpx.HTTPError as error:
        raise DemoError(f"the red-packet service at {base_url} did not answer: {type(error).__name__}: {error}") from None
    if answer.status_code != 200:
        code = answer.json().get("code", "") if "json" in answer.headers.get("content-type", "") else ""
        raise DemoError(
            f"the red-packet service refused the grant {share.grant_id}: HTTP {answer.status_code} {code}".rstrip()
            + " (its faults: GET /_faults); its transfer was not submitted"
        )
