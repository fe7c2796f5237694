"""The operator's command line over the HTTP API: kinds (pause, resume, retry policy), breakers,
classification tables, the dead-letter tier (list, redrive, edit, discard) and four-eyes proposals.

    compensator kind list | show KIND | pause KIND --reason R [--holder H] | resume KIND [--holder H]
    compensator kind policy KIND [--set FILE]          (FILE: JSON, `-` for standard input)
    compensator breaker list | force DOWNSTREAM open|closed|auto --reason R
    compensator classification show DOWNSTREAM | set DOWNSTREAM FILE --reason R | reset DOWNSTREAM
    compensator dead list [--kind K] [--error-class E] [--ref-key R] [--cursor C] [--limit N]
    compensator dead redrive (--id ID ... | --kind K [--error-class E] [--ref-key R]) --reason R [--limit N] [--group G]
    compensator dead edit ID FILE --reason R | discard ID --reason-code C --comment T
    compensator proposal list [--pending] | approve N [--reason R] | reject N --reason R
    compensator job-group show G | approve G [--reason R] | reject|pause|resume|cancel|repropose G --reason R
                                   (a redrive job over several sets' dead letters: docs/review.md, "Job groups")
    compensator retention show | set [--tombstones 14d] [--events 7d] --reason R   (an administrator's token)

Why through the API and not the store: the API owns the roles, the validation and the audit of
every operator action; the command line is one more client of it, so an action from a terminal is
checked and recorded exactly as one from the page or a script. The token comes from
``--token-file`` or ``$COMPENSATOR_API_TOKEN`` (never the command line, where ``ps`` shows it);
the URL from the configuration's `api.public_url` (or host:port).

Must never: print the token, or turn an API problem into a traceback: a refusal is one line with
the problem's title and detail, and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Final

from compensator.config_file import add_config_argument, load_for

TOKEN_ENV: Final = "COMPENSATOR_API_TOKEN"
TIMEOUT_S: Final = 10.0


class OperatorError(ValueError):
    """The API refused, or could not be reached: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    kind = subparsers.add_parser("kind", help="list kinds, pause or resume one, read or set its retry policy")
    kinds = kind.add_subparsers(dest="action", required=True, metavar="ACTION")
    kinds.add_parser("list", help="every kind: depth by state, oldest due, pauses")
    show = kinds.add_parser("show", help="one kind, with its retry policy")
    show.add_argument("kind")
    pause = kinds.add_parser("pause", help="stop workers leasing the kind (a named holder)")
    pause.add_argument("kind")
    pause.add_argument("--reason", required=True, help="why (recorded)")
    pause.add_argument("--holder", help="the pause's holder (default: the token's name)")
    resume = kinds.add_parser("resume", help="release a holder's pause")
    resume.add_argument("kind")
    resume.add_argument("--holder", help="the holder to release (default: the token's name)")
    policy = kinds.add_parser("policy", help="print the retry policy, or replace it (--set)")
    policy.add_argument("kind")
    policy.add_argument("--set", dest="source", help="a JSON file with the whole policy, or - for standard input")
    breaker = subparsers.add_parser("breaker", help="each downstream's circuit breaker; force one open or closed")
    breakers = breaker.add_subparsers(dest="action", required=True, metavar="ACTION")
    breakers.add_parser("list", help="each breaker's state and mode")
    force = breakers.add_parser(
        "force", help="open: hold paused, never probe; closed: never trip; auto: the workers decide"
    )
    force.add_argument("downstream")
    force.add_argument("mode", choices=("open", "closed", "auto"))
    force.add_argument("--reason", required=True, help="why (recorded)")
    table = subparsers.add_parser("classification", help="a downstream's classification of answers")
    tables = table.add_subparsers(dest="action", required=True, metavar="ACTION")
    table_show = tables.add_parser("show", help="the table in force")
    table_show.add_argument("downstream")
    table_set = tables.add_parser(
        "set", help="replace the table (validated, audited, followed by workers within a second)"
    )
    table_set.add_argument("downstream")
    table_set.add_argument("source", help="a JSON file with the whole table, or - for standard input")
    table_set.add_argument("--reason", required=True, help="why (recorded)")
    table_reset = tables.add_parser("reset", help="back to the default table")
    table_reset.add_argument("downstream")
    dead = subparsers.add_parser("dead", help="the dead-letter tier: list, redrive, edit and redrive, discard")
    deads = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = deads.add_parser("list", help="dead letters, oldest first, a page at a time")
    redrive = deads.add_parser("redrive", help="redrive a selection (--id) or what a filter matches (four eyes may apply)")
    redrive.add_argument("--id", dest="ids", action="append", help="a request id; repeat for a selection")
    for parser in (listing, redrive):
        parser.add_argument("--kind")
        parser.add_argument("--error-class")
        parser.add_argument("--ref-key")
        parser.add_argument("--limit", type=int, default=100)
    listing.add_argument("--cursor", help="next_cursor of the previous page")
    redrive.add_argument("--reason", required=True, help="why (recorded)")
    redrive.add_argument("--group", help="several sets, under four eyes: repeat the proposal of this job group (the"
                                         " partially-applied message names it)")  # fmt: skip
    edit = deads.add_parser("edit", help="redrive with an edited payload, as a new version linked to the original")
    edit.add_argument("id")
    edit.add_argument("source", help="a JSON file with the whole edited payload, or - for standard input")
    edit.add_argument("--reason", required=True, help="why (recorded)")
    discard = deads.add_parser("discard", help="discard with a reason code and a comment")
    discard.add_argument("id")
    discard.add_argument("--reason-code", required=True)
    discard.add_argument("--comment", required=True)
    proposal = subparsers.add_parser("proposal", help="four-eyes proposals: list, approve, reject or withdraw")
    proposals = proposal.add_subparsers(dest="action", required=True, metavar="ACTION")
    proposals.add_parser("list", help="proposals, newest first").add_argument("--pending", action="store_true")
    approve = proposals.add_parser("approve", help="approve: the action is done in the same command")
    approve.add_argument("number", type=int)
    approve.add_argument("--reason", default="")
    reject = proposals.add_parser("reject", help="reject (an approver), or withdraw your own (a reviewer)")
    reject.add_argument("number", type=int)
    reject.add_argument("--reason", required=True)
    job_group = subparsers.add_parser("job-group", help="a redrive job over several sets: show it, or act on every part")
    job_groups = job_group.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, helped in (("show", "the whole and each set's part"), ("approve", "approve every set's part"),
                           ("reject", "reject every part (an approver), or withdraw your own (a reviewer)"),
                           ("pause", "pause every part"), ("resume", "resume every part"), ("cancel", "cancel every part"),
                           ("repropose", "propose again every part whose proposal expired (a reviewer; then approve)")):
        chosen = job_groups.add_parser(action, help=helped)
        chosen.add_argument("group", help="the group's id (32 hex digits)")
        if action != "show":
            chosen.add_argument("--reason", required=action != "approve", default="", help="why (recorded)")
    retention = subparsers.add_parser("retention", help="how long keys (tombstones) and events are kept; change it")
    retentions = retention.add_subparsers(dest="action", required=True, metavar="ACTION")
    retentions.add_parser("show", help="the retentions in force and the store's floor")
    keep = retentions.add_parser("set", help="change them (an administrator's token; never under the floor)")
    keep.add_argument("--tombstones", type=duration_ms, help="how long a finished request's key is remembered: 14d, 36h")
    keep.add_argument("--events", type=duration_ms, help="how long events are kept: 7d")
    keep.add_argument("--reason", required=True, help="why (recorded)")
    groups = (kinds, breakers, tables, deads, proposals, job_groups, retentions)
    for parser in (parser for group in groups for parser in group.choices.values()):
        add_config_argument(parser)
        parser.add_argument("--token-file", type=Path, help=f"a file holding an API token (default ${TOKEN_ENV})")
    for parser in (kind, breaker, table, dead, proposal, job_group, retention):
        parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    api = Api(load_for(args).api_url, api_token(args.token_file))
    command = args.command
    if command == "kind":
        answer = _kind(api, args)
    elif command == "dead":
        answer = _dead(api, args)
    elif command == "proposal":
        answer = _proposal(api, args)
    elif command == "job-group":
        if re.fullmatch(r"[0-9a-f]{32}", args.group) is None:
            raise OperatorError(f"job-group: {args.group!r} is not a group id (32 hex digits)")
        path = f"/v1/review/job-groups/{args.group}"
        answer = api.call("GET", path) if args.action == "show" else api.call(
            "POST", f"{path}/{args.action}", body={"reason": args.reason})
    elif command == "retention":
        if args.action == "show":
            answer = api.call("GET", "/v1/retention")
        elif args.tombstones is None and args.events is None:
            raise OperatorError("retention set: give --tombstones, --events or both")
        else:
            given = {"retention_ms": args.tombstones, "event_retention_ms": args.events}
            body = {name: value for name, value in given.items() if value is not None}
            answer = api.call("PUT", "/v1/retention", body={**body, "reason": args.reason})
    elif command == "breaker":
        answer = (
            api.call("GET", "/v1/breakers")
            if args.action == "list"
            else api.call("PUT", f"/v1/breakers/{args.downstream}", body={"mode": args.mode, "reason": args.reason})
        )
    else:
        path = f"/v1/downstreams/{args.downstream}/classification"
        if args.action == "show":
            answer = api.call("GET", path)
        elif args.action == "reset":
            answer = api.call("DELETE", path)
        else:
            answer = api.call("PUT", path, body=_json_from(args.source), headers={"X-Reason": args.reason})
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0


def _kind(api: Api, args: argparse.Namespace) -> Any:
    if args.action == "list":
        return api.call("GET", "/v1/kinds")
    if args.action == "show":
        return api.call("GET", f"/v1/kinds/{args.kind}")
    if args.action == "pause":
        from api.schemas import HOLDER_PATTERN

        if args.holder is not None and re.match(HOLDER_PATTERN, args.holder) is None:
            raise OperatorError("--holder must be a name like a token's (a-z 0-9 _ . -, up to 32), optionally"
                                " qualified: ops:alice")  # fmt: skip
        return api.call("POST", f"/v1/kinds/{args.kind}/pause", body={"reason": args.reason, "holder": args.holder})
    if args.action == "resume":
        return api.call("POST", f"/v1/kinds/{args.kind}/resume", body={"holder": args.holder})
    if args.source is None:
        return api.call("GET", f"/v1/kinds/{args.kind}/policy")
    return api.call("PUT", f"/v1/kinds/{args.kind}/policy", body=_json_from(args.source))


def _dead(api: Api, args: argparse.Namespace) -> Any:
    selection = {"kind": args.kind, "error_class": args.error_class, "ref_key": args.ref_key} if args.action in (
        "list", "redrive") else {}  # fmt: skip
    if args.action == "list":
        query = {name: value for name, value in {**selection, "cursor": args.cursor}.items() if value is not None}
        return api.call("GET", "/v1/review/dead-letters", params={**query, "limit": args.limit})
    if args.action == "redrive":
        chosen = {name: value for name, value in selection.items() if value is not None}
        if bool(args.ids) == bool(chosen):
            raise OperatorError("redrive: give --id (a selection) or a filter (--kind, --error-class, --ref-key), not both")
        body = {"ids": args.ids} if args.ids else {"filter": chosen, "limit": args.limit}
        if args.group is not None:
            if re.fullmatch(r"[0-9a-f]{32}", args.group) is None:
                raise OperatorError(f"redrive: {args.group!r} is not a group id (32 hex digits)")
            body["group"] = args.group
        return api.call("POST", "/v1/review/redrive", body={**body, "reason": args.reason})
    if args.action == "edit":
        body = {"payload": _json_from(args.source), "reason": args.reason}
        return api.call("POST", f"/v1/review/requests/{args.id}/edit", body=body)
    body = {"reason_code": args.reason_code, "comment": args.comment}
    return api.call("POST", f"/v1/review/requests/{args.id}/discard", body=body)


def _proposal(api: Api, args: argparse.Namespace) -> Any:
    if args.action == "list":
        return api.call("GET", "/v1/review/proposals", params={"pending": "true" if args.pending else "false"})
    return api.call("POST", f"/v1/review/proposals/{args.number}/{args.action}", body={"reason": args.reason})


DURATION_UNITS_MS: Final = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}


def duration_ms(text: str) -> int:
    """`14d`, `36h`, `90m`, `3600s` as milliseconds (argparse's type: a bad one is its one-line error)."""
    match = re.fullmatch(r"([1-9][0-9]{0,6})([dhms])", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 14d, 36h, 90m or 3600s")
    return int(match.group(1)) * DURATION_UNITS_MS[match.group(2)]


def api_token(path: Path | None) -> str:
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise OperatorError(f"--token-file {path}: cannot read: {error.strerror or error}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise OperatorError(f"no API token: give --token-file, or set ${TOKEN_ENV}")
    return token


def _json_from(source: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as error:
        raise OperatorError(f"{source}: cannot read: {error.strerror or error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise OperatorError(f"{source}: not JSON: {error.msg} at line {error.lineno}") from None


class Api:
    def __init__(self, base_url: str, token: str) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def call(
        self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:  # fmt: skip
        import httpx

        try:
            answer = httpx.request(method, self._base_url + path, json=body, timeout=TIMEOUT_S, params=params,
                                   headers={**self._headers, **(headers or {})})  # fmt: skip
        except httpx.HTTPError as error:
            raise OperatorError(
                f"the API at {self._base_url} did not answer: {type(error).__name__}: {error}"
            ) from None
        if answer.status_code >= 400:
            raise OperatorError(_problem_line(answer.status_code, answer.headers.get("content-type", ""), answer.text))
        return answer.json() if answer.content else None


def _problem_line(status: int, content_type: str, text: str) -> str:
    """An RFC 9457 problem as one line: its title, detail and the first invalid fields."""
    if "json" not in content_type:
        return f"HTTP {status}"
    try:
        problem = json.loads(text)
    except json.JSONDecodeError:
        return f"HTTP {status}"
    line = f"{problem.get('title', f'HTTP {status}')} ({status})"
    if problem.get("detail"):
        line += f": {problem['detail']}"
    errors = problem.get("errors") or problem.get("invalid_params") or []
    if isinstance(errors, list) and errors:
        fields = "; ".join(f"{e.get('field', e.get('name', '?'))}: {e.get('message', e.get('reason', ''))}"
                           for e in errors[:3] if isinstance(e, dict))  # fmt: skip
        line += f" [{fields}]"
    return " ".join(line.split())
