"""``/review/audit``: the audit chain, newest first, 50 a page, filtered by who, what, on what and
when; sign-ins (session and login records) left out unless asked for; each entry's before ->
after as field changes, with the stored JSON a click away; an entry links to its request,
proposal or job.

The chain is the store's (queues/audit_chain.py) and is verified by `compensator audit verify`;
this page only reads it. The filter is applied in the store's query (api/audit_view.py), so a
page is 50 matching entries and "Older" goes on from the last one shown. Payloads inside entries
(an edit's before and after) are masked for a role without personal-data rights, as everything it
reads is (api/masked_reads.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import Depends, Request
from starlette.responses import Response

from api import across_sets
from api import review_actions as actions
from api.audit_view import ACTION_PATTERN, ACTIONS, ACTOR_PATTERN, TARGET_PATTERN, audit_filter
from api.problems import Problem, invalid
from api.services import ApiServices
from api.views import audit_document
from api.web.headers import page_router
from api.web.page_support import before_param, field_messages, problem_page, services, shown_entry, typed_times
from api.web.readable import ACTION_LABELS
from api.web.rights import Right
from api.web.sessions import WebUser, current_user, require
from api.web.templating import render
from queues import AuditFilter

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PAGE_SIZE: Final = 50
FORM_FIELDS: Final = ("actor", "action", "target", "since", "until", "sign_ins")
GROUP: Final = "group:"
SIGN_INS: Final = "sign-ins"
"""The action choice that means the login records: one entry per login, logout or failed login
(their session documents, written alongside, would show each twice)."""
LOGIN_RECORDS: Final = "document:logins/"


@dataclass(frozen=True, slots=True)
class AuditForm:
    """The filter as typed (shown again and carried into the paging links), and the store's
    filter when every field made sense."""

    values: dict[str, str]
    audit_filter: AuditFilter | None
    errors: dict[str, str] = field(default_factory=dict)

    def query(self, **extra: str) -> str:
        return urlencode({**{k: v for k, v in self.values.items() if v}, **extra})


def _actions(choice: str) -> tuple[str, ...]:
    """A group's actions, one action, or none (any), from the form's single choice."""
    if choice.startswith(GROUP):
        return ACTIONS.get(choice[len(GROUP) :], ("",))  # an unknown group: refused as a bad name
    return (choice,) if choice else ()


def parse_form(source: Mapping[str, str], set_id: int) -> AuditForm:
    """The form's filter; every field that does not parse is named (the page answers 422)."""
    values = {name: str(source.get(name) or "").strip() for name in FORM_FIELDS}
    errors: dict[str, str] = {}
    for name, pattern, what in (("actor", ACTOR_PATTERN, "a user's or a process's name"),
                                ("target", TARGET_PATTERN, "1-320 printable characters")):  # fmt: skip
        if values[name] and re.match(pattern, values[name]) is None:
            errors[name] = f"give {what}"
    chosen = values["action"]
    target = values["target"]
    if chosen == SIGN_INS:
        chosen = "document_put"
        if target and not target.startswith(LOGIN_RECORDS):
            errors["action"] = "sign-ins are the login records: clear the target, or choose another action"
        target = target or LOGIN_RECORDS
    wanted = _actions(chosen)
    if any(re.match(ACTION_PATTERN, name) is None for name in wanted):
        errors["action"] = "not an action's name"
    moments = typed_times(values, ("since", "until"), errors)
    if errors:
        return AuditForm(values, None, errors)
    try:
        selected = audit_filter(set_id=set_id, actor=values["actor"] or None, actions=wanted, target=target or None,
                                since_ms=moments.get("since"), until_ms=moments.get("until"), sign_ins=bool(values["sign_ins"]))  # fmt: skip
    except Problem as problem:
        return AuditForm(values, None, field_messages(problem))
    return AuditForm(values, selected)


@router.get("/review/audit")
async def audit(request: Request, user: User) -> Response:
    require(user, Right.VIEW_AUDIT)
    found = services(request)
    target_set = across_sets.audit_scope(found, request.query_params.get("target", "").strip() or None)
    form = parse_form(request.query_params, target_set or found.settings.set_id)  # several sets: a request's own set
    before = before_param(request)
    context = {"form": form, "actions": ACTIONS, "action_labels": ACTION_LABELS, "group": GROUP,
               "sign_ins_choice": SIGN_INS, "entries": [], "count": None, "head": None, "older": None,
               "newest": before is None, "hiding_sign_ins": False}  # fmt: skip
    if form.audit_filter is None:
        return render(request, "audit.html", context, user=user, status=422)
    if found.sets is not None:
        return await _merged(request, user, found, form, context)
    try:
        read = found.queue.audit_log(before=before, limit=PAGE_SIZE, audit_filter=form.audit_filter)
        answer = (await actions.store(found, read)).value
    except Problem as problem:
        return problem_page(request, user, problem)
    entries = [shown_entry(found, audit_document(entry)) for entry in answer.entries]
    older = answer.entries[-1].seq if len(answer.entries) == PAGE_SIZE and answer.entries[-1].seq > 1 else None
    hiding = bool(form.audit_filter.exclude_target_prefixes)
    context.update(entries=entries, count=answer.count, head=answer.head.hex(), older=older, hiding_sign_ins=hiding)
    return render(request, "audit.html", context, user=user)


async def _merged(request: Request, user: WebUser, found: ApiServices, form: AuditForm, context: dict[str, Any]) -> Response:
    """Several sets: every set's chain merged by time (a request id's target: its set's only), each
    entry naming its set, a head per set; paged with a cursor of the oldest seq shown per set. A set
    that does not answer is the problem page naming it: an auditor never reads a chain as whole
    that is not."""
    cursor = request.query_params.get("cursor") or None
    only = across_sets.audit_scope(found, form.values["target"] or None)
    selected = form.audit_filter
    assert selected is not None

    def selected_in(_set_id: int) -> AuditFilter:
        return selected  # the same in every set (a request id's target is read in its own set only)

    try:
        if cursor is not None and re.match(across_sets.AUDIT_CURSOR_PATTERN, cursor) is None:
            raise invalid([{"field": "cursor", "message": "not a page this list gave: start again from the newest"}])
        page = await across_sets.audit_page(found, selected_in, cursor=cursor, limit=PAGE_SIZE, only=only)
    except Problem as problem:
        return problem_page(request, user, problem)
    entries = [{**shown_entry(s, audit_document(entry)), "set": s.settings.set_id} for s, entry in page.rows]
    context.update(entries=entries, count=page.count, heads={k: v.hex() for k, v in page.heads.items()},
                   older=page.next_cursor, newest=cursor is None,
                   hiding_sign_ins=bool(selected.exclude_target_prefixes))  # fmt: skip
    return render(request, "audit.html", context, user=user)
