"""``/review/requests/{id}/edit``: edit a payload and redrive it as a new version, in two steps.

First the edited JSON is checked against the kind's schema and its diff shown, with the money the
new version will pay beside what the request held (nothing is stored);
then the reviewer confirms exactly that payload, and it goes out as version n + 1 (or as a
proposal when four eyes are needed). A refused edit keeps what was typed, with the field named
beside the form, so a long payload is never lost to a typo.

Must never: store an edit the reviewer has not seen the diff of.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.responses import Response

from api import review_actions as actions
from api.money_view import diff_rows, money_of_payload
from api.problems import Problem, invalid
from api.review_policy import current_payload
from api.web.headers import page_router
from api.web.page_support import Flash, RequestIdPath, field_messages, problem_flash, problem_page, services
from api.web.pages_detail import outcome_flash
from api.web.rights import Right
from api.web.sessions import WebUser, checked_csrf, current_user, require
from api.web.templating import pretty, render
from queues import MessageView

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PostingUser = Annotated[WebUser, Depends(checked_csrf)]


def _context(view: MessageView, request_id: str, text: str, reason: str) -> dict[str, Any]:
    return {"request_id": request_id, "view": view, "text": text, "reason": reason, "errors": {}, "changes": None,
            "previewed": "", "pays": None, "paid_before": None, "four_eyes_why": None}


@router.get("/review/requests/{request_id}/edit")
async def edit_form(request: Request, request_id: RequestIdPath, user: User) -> Response:
    require(user, Right.EDIT)
    try:
        view = await actions.request(await actions.in_set_of(services(request), request_id), request_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    text = pretty(json.loads(current_payload(view)))
    return render(request, "edit.html", _context(view, request_id, text, ""), user=user)


@router.post("/review/requests/{request_id}/edit")
async def edit(request: Request, request_id: RequestIdPath, user: PostingUser) -> Response:
    """`step=preview` checks and shows the diff; `step=submit` stores what the preview showed."""
    require(user, Right.EDIT)
    found = services(request)
    form = await request.form()
    text, reason, step = (str(form.get(name) or "") for name in ("payload", "reason", "step"))
    try:
        found = await actions.in_set_of(found, request_id)  # several sets: the request's own set
        view = await actions.request(found, request_id)
    except Problem as problem:
        return problem_page(request, user, problem)
    context = _context(view, request_id, text, reason)
    try:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise invalid([{"field": "payload", "message": f"not JSON: {error}"}]) from None
        checked = actions.checked_edit(view, document)
        before = json.loads(current_payload(view))
        context.update(changes=diff_rows(before, json.loads(checked.payload), checked.changes),
                       pays=money_of_payload(checked.payload), paid_before=money_of_payload(current_payload(view)),
                       previewed=hashlib.sha256(checked.payload).hexdigest(),
                       four_eyes_why=found.four_eyes.needs_approval([view], [checked.payload]))  # fmt: skip
        if step != "submit" or str(form.get("previewed") or "") != context["previewed"]:
            # a payload changed after its diff was shown is shown again, never stored unseen
            flashes = [Flash("info", "Check the diff, then redrive.")] if step == "submit" else []
            return render(request, "edit.html", {**context, "flashes": flashes}, user=user)
        if not reason.strip():
            raise invalid([{"field": "reason", "message": "say why, for the audit"}])
        outcome = await actions.edit(found, user.name, reason.strip(), checked)
    except Problem as problem:
        context.update(errors=field_messages(problem), flashes=[problem_flash(problem)])
        return render(request, "edit.html", context, user=user, status=problem.type.status)
    new_id = actions.public(found, outcome.new_ids[0]) if isinstance(outcome, actions.Done) else None
    flash = outcome_flash(found, outcome, f"Edited and redriven: the new version is {new_id}; {request_id} is kept, superseded.")
    return render(request, "edit.html", {**context, "flashes": [flash], "done": True, "new_id": new_id}, user=user)
