"""The audit chain as finance reviewers and auditors read it: the filter they give (the JSON API's
query parameters and the page's form mean the same), the sign-ins left out unless asked for, each
entry's before -> after as field changes, and the request, proposal or job an entry is about.

Why sign-ins are left out by default: every login writes a session and a login record, every
logout another, so on a working day they outnumber the review actions many times over and bury
them. They are left out in the store's query (`AuditFilter.exclude_target_prefixes`), so a page
is still 50 review entries and its paging is exact. Users and passwords stay: adding a user or
changing a role is an administrative action an auditor looks for.

Why changes field by field: an entry's before and after are canonical JSON with payloads and
document bodies inside as JSON text (the chain hashes text), which reads as escaped quotes. A
JSON object held as text is parsed and compared field by field like the rest.

Must never: decide who may see what (a viewer's entries come masked from the store: api/masked_reads.py), or
read the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from api.money_view import AMOUNT_FIELDS, MONEY_FIELD, display, money_of_document
from api.problems import invalid
from api.review_policy import diff
from ledger.request_ids import RequestId
from queues import AuditFilter

SIGN_IN_PREFIXES: Final = ("document:sessions/", "document:logins/")
"""The sessions and logins namespaces (api/web/accounts.py): a login, a logout, a failed login."""
ACTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "Review": ("edit_redrive", "redriven", "discarded", "propose", "approve", "reject", "withdraw", "expire"),
    "Redrive jobs": ("redrive_job", "pause_job", "resume_job", "cancel_job", "job_done"),
    "Administration": ("document_put", "token_put", "token_revoked", "quota_set", "policy_set", "retention_set",
                       "paused", "resumed"),
}  # fmt: skip
"""The actions the chain holds, grouped as the page's filter offers them."""
ACTOR_PATTERN: Final = r"^[^\x00-\x1f\x7f]{1,128}$"
ACTION_PATTERN: Final = r"^[a-z][a-z_]{0,39}$"
TARGET_PATTERN: Final = r"^[^\x00-\x1f\x7f]{1,320}$"
FOLD_CHARS: Final = 80
"""A value longer than this is shown folded (its start, the rest on request)."""
_MESSAGE: Final = re.compile(r"^message:([0-9]{1,18})$")
_NUMBERED: Final = re.compile(r"^(proposal|job):([0-9]{1,18})$")


def target_fields(target: str, set_id: int) -> dict[str, Any]:
    """What a target as typed selects: a request id (`1-42`) every entry that concerns that
    request (its own, and its proposal's and approval's); text ending in `/` or `*` the targets
    that start with it; anything else exactly that target (`proposal:7`, `document:users/ann`)."""
    request = RequestId.parse(target)
    if request is not None:
        if request.set_id != set_id:
            raise invalid([{"field": "target", "message": f"not a request of this set (its ids start {set_id}-)"}])
        return {"message_id": request.message_id}
    if target.endswith(("/", "*")):
        prefix = target.rstrip("*")
        return {"target_prefix": prefix} if prefix else {}
    return {"target": target}


def audit_filter(
    *, set_id: int, actor: str | None = None, actions: Sequence[str] = (), target: str | None = None,
    since_ms: int | None = None, until_ms: int | None = None, sign_ins: bool = False,
) -> AuditFilter:  # fmt: skip
    """The store's filter, or the invalid-request problem naming the field that makes it impossible.

    Sign-ins are left out unless `sign_ins`, or unless the target asked for is itself a session
    or a login record (asking for `document:logins/ann` means wanting them)."""
    fields = target_fields(target, set_id) if target else {}
    if since_ms == 0:  # the epoch, or a time before it clamped there: no entry is older, so no bound
        since_ms = None
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise invalid([{"field": "until", "message": "must be after since"}])
    asked = fields.get("target") or fields.get("target_prefix") or ""
    hidden = () if sign_ins or asked.startswith(SIGN_IN_PREFIXES) else SIGN_IN_PREFIXES
    return AuditFilter(actor=actor or None, actions=tuple(dict.fromkeys(actions)), from_ms=since_ms, to_ms=until_ms,
                       exclude_target_prefixes=hidden, **fields)  # fmt: skip


def _parsed(value: Any) -> Any:
    """A JSON object kept as text (a payload, a document's body) as the object; anything else as it is."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            document = json.loads(value)
        except ValueError:
            return value
        return document if isinstance(document, dict) else value
    return value


def _aligned(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides with JSON text parsed, and an object that appears (a proposal's payload) or goes
    set against an empty one, so that `diff` lists its fields one by one rather than as one blob."""
    old_side: dict[str, Any] = {}
    new_side: dict[str, Any] = {}
    for name in set(before) | set(after):
        old, new = _parsed(before.get(name)), _parsed(after.get(name))
        present = [side for side in (old, new) if side is not None]
        if present and all(isinstance(side, dict) for side in present):
            old_side[name], new_side[name] = _aligned(old or {}, new or {})
            continue
        if name in before:
            old_side[name] = old
        if name in after:
            new_side[name] = new
    return old_side, new_side


def _shown(value: Any) -> str | None:
    """A value as one line of text: strings as they are, the rest as JSON; None for nothing."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _at(document: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    for part in path.split(".") if path else ():
        found = document.get(part)
        if not isinstance(found, Mapping):
            return None
        document = found
    return document


def _money(
    old_side: Mapping[str, Any], new_side: Mapping[str, Any], name: str
) -> tuple[str, str | None, str | None] | None:
    """A change of `amount_minor` or `currency` as the money it is: (the row's field, `<path>.amount`,
    and the money before and after as text), or None when the field is neither or holds no money."""
    path, _, last = name.rpartition(".")
    if last not in AMOUNT_FIELDS:
        return None
    sides = [_at(side, path) for side in (old_side, new_side)]
    old, new = (money_of_document(side) for side in sides)
    if old is None and new is None:
        return None
    field = f"{path}.{MONEY_FIELD}" if path else MONEY_FIELD
    return field, None if old is None else display(old.amount_minor, old.currency), \
        None if new is None else display(new.amount_minor, new.currency)


def field_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each field the entry changed, nested ones as dotted paths (`payload.payer`), in name order:
    `{"field", "before", "after", "fold"}` with the values as text (None: not there), `fold` when
    either is too long to read in a row. A payload's `amount_minor` and `currency` are one row,
    `payload.amount`, in money terms (``60.00 USD`` -> ``99,999.00 USD``)."""
    changes = []
    old_side, new_side = _aligned(before, after)
    shown_money: set[str] = set()
    for name, change in diff(old_side, new_side).items():
        money = _money(old_side, new_side, name)
        if money is not None:
            if money[0] not in shown_money:
                shown_money.add(money[0])
                changes.append({"field": money[0], "before": money[1], "after": money[2], "fold": False})
            continue
        old, new = _shown(change["before"]), _shown(change["after"])
        if old == new:  # a field absent on one side and null on the other: nothing a reader would call a change
            continue
        fold = any(value is not None and len(value) > FOLD_CHARS for value in (old, new))
        changes.append({"field": name, "before": old, "after": new, "fold": fold})
    return changes


def links(document: Mapping[str, Any], public_id: Any) -> dict[str, Any]:
    """The request, proposal and job an entry (`audit_document`) is about, from its target and the
    proposal or job its action was part of; `public_id(message_id)` names a request."""
    found: dict[str, Any] = {"request_id": None, "proposal_id": None, "job_id": None}
    target = str(document["target"])
    message = _MESSAGE.match(target)
    if message is not None:
        found["request_id"] = public_id(int(message[1]))
    numbered = _NUMBERED.match(target)
    if numbered is not None:
        found[f"{numbered[1]}_id"] = int(numbered[2])
    after = document["after"] if isinstance(document["after"], Mapping) else {}
    for name in ("proposal", "job"):
        value = after.get(name)
        if found[f"{name}_id"] is None and isinstance(value, int) and not isinstance(value, bool):
            found[f"{name}_id"] = value
    return found
