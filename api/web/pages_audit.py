"""``/review/audit``: the whole audit chain, newest first, a page at a time: who, when, what, why,
and before -> after; an entry about a request links to it.

The chain is the store's (queues/audit_chain.py) and is verified by `compensator audit verify`;
this page only reads it. Payloads inside entries (an edit's before and after) are masked as the
request page masks them.

Must never: show an entry's payload unmasked to a role without personal-data rights.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api import review_actions as actions
from api.problems import Problem
from api.views import audit_document
from api.web.page_support import before_param, problem_page, services, shown_audit
from api.web.rights import Right
from api.web.sessions import WebUser, current_user, require
from api.web.templating import render

router = APIRouter(include_in_schema=False)
User = Annotated[WebUser, Depends(current_user)]
PAGE_SIZE: Final = 50
_MESSAGE: Final = "message:"


@router.get("/review/audit")
async def audit(request: Request, user: User) -> Response:
    require(user, Right.VIEW_AUDIT)
    found = services(request)
    before = before_param(request)
    try:
        answer = (await actions.store(found, found.queue.audit_log(before=before, limit=PAGE_SIZE))).value
    except Problem as problem:
        return problem_page(request, user, problem)
    entries = []
    for entry in answer.entries:
        document = audit_document(entry)
        target = entry.target
        request_id = None
        if target.startswith(_MESSAGE) and target[len(_MESSAGE):].isdigit():
            request_id = actions.public(found, int(target[len(_MESSAGE):]))
        entries.append({**shown_audit(user, document), "request_id": request_id})
    older = answer.entries[-1].seq if answer.entries and answer.entries[-1].seq > 1 else None
    return render(request, "audit.html", {"entries": entries, "count": answer.count, "head": answer.head.hex(),
                                          "older": older, "newest": before is None}, user=user)  # fmt: skip
