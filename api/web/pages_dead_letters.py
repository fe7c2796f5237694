"""``/review/dead-letters``: what the machines could not finish, filtered, counted and totalled per
currency, a page at a time, with a selection to redrive; and its CSV export.

The totals come from one aggregate in the store (`dead_letter_summary`), not from the page shown,
so "412 dead letters, 1,234,567.89 CNY" is the whole filter's; asks of one filter share
reads (api/summaries.py: one at a time, each started after the ask), and the page says when. The export streams every page of
the same filter; it is masked as the page is for a role without personal-data rights, and every
text cell that a spreadsheet would read as a formula is quoted.

Must never: export more than the user may view, or let a cell start with = + - @ (CSV injection).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from api import across_sets
from api import review_actions as actions
from api.problems import Problem, invalid
from api.review_policy import FourEyes, current_payload
from api.schemas import utc
from api.services import ApiServices
from api.web.headers import page_router
from api.web.page_support import CURRENCIES, KINDS, FilterForm, Flash, parse_filter, problem_page, row, services
from api.web.rights import Right
from api.web.sessions import WebUser, current_user, require
from api.web.templating import render
from ledger.currencies import major_units
from queues import DeadLetterFilter, MessageView

router = page_router()
User = Annotated[WebUser, Depends(current_user)]
PAGE_SIZE: Final = 50
EXPORT_PAGE: Final = 1000
_CURSOR: Final = re.compile(r"^[0-9]{1,18}\.[0-9]{1,18}$")
_MERGED_CURSOR: Final = re.compile(across_sets.CURSOR_PATTERN)
FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r", "\n")
CSV_COLUMNS: Final = ("id", "kind", "ref_key", "dead_at", "attempts", "error_class", "error_text", "dead_reason",
                      "amount", "currency", "amount_minor", "payload")  # fmt: skip


@router.get("/review")
async def home(user: User) -> Response:
    return RedirectResponse("/review/dead-letters", status_code=303)


@router.get("/review/dead-letters")
async def dead_letters(request: Request, user: User) -> Response:
    require(user, Right.VIEW)
    form = parse_filter(request.query_params, sets=services(request).sets is not None)
    cursor = request.query_params.get("cursor") or None
    context: dict[str, Any] = {"form": form, "kinds": KINDS, "currencies": CURRENCIES, "rows": [], "summary": None,
                               "next_cursor": None, "cursor": cursor}  # fmt: skip
    sets = services(request).sets
    if sets is not None:
        context["set_ids"] = sets.set_ids  # several sets: the list may be narrowed to one
    if cursor is not None and (_CURSOR if services(request).sets is None else _MERGED_CURSOR).match(cursor) is None:
        form.errors["cursor"] = "not a page this list gave: start again from the first page"
    if form.dead_filter is None or form.errors:
        return render(request, "dead_letters.html", context, user=user, status=422)
    found = services(request)
    if found.sets is not None:
        return await _merged(request, user, found, form, cursor, context)
    try:
        page = (await actions.store(found, found.queue.dead_letters(form.dead_filter, cursor=cursor,
                                                                    limit=PAGE_SIZE))).value  # fmt: skip
        totals = await actions.store(found, found.summaries.get(form.dead_filter))
    except Problem as problem:
        return problem_page(request, user, problem)
    summary = totals.value
    context.update(rows=[row(found, view) for view in page.items], summary=summary, next_cursor=page.next_cursor,
                   summary_read_ms=int(totals.read_at_s * 1000),
                   oldest_id=None if summary.oldest_id is None else actions.public(found, summary.oldest_id),
                   **four_eyes_labels(found.four_eyes, page.items, summary.count, whole=cursor is None))  # fmt: skip
    return render(request, "dead_letters.html", context, user=user)


async def _merged(request: Request, user: WebUser, found: ApiServices, form: FilterForm, cursor: str | None,
                  context: dict[str, Any]) -> Response:  # fmt: skip
    """Several sets: every set's dead letters merged oldest first, the totals summed; a set that
    does not answer is named in a banner above the rows and totals it is missing from (a
    reviewer sees what can be read, never a list that reads as complete: docs/review.md)."""
    assert form.dead_filter is not None
    try:
        page, totals = await asyncio.gather(
            across_sets.dead_letter_page(found, form.dead_filter, cursor=cursor, limit=PAGE_SIZE, partial=True,
                                         only=form.set_id),
            across_sets.dead_letter_totals(found, form.dead_filter, partial=True, only=form.set_id))  # fmt: skip
    except Problem as problem:
        if problem.extra.get("errors"):
            form.errors["cursor"] = "not a page this list gave: start again from the first page"
            return render(request, "dead_letters.html", context, user=user, status=422)
        return problem_page(request, user, problem)
    missing = sorted({*page.unanswered, *totals.unanswered})
    summary = totals.summary.value
    views = [view for _, view in page.rows]
    flashes = [Flash("error", f"Set {', '.join(map(str, missing))} did not answer: its dead letters are missing from"
                              " this list and from the totals. Reload in a moment.")] if missing else []  # fmt: skip
    context.update(rows=[row(set_services, view) for set_services, view in page.rows], summary=summary,
                   next_cursor=page.next_cursor, summary_read_ms=int(totals.summary.read_at_s * 1000),
                   oldest_id=totals.oldest, flashes=flashes, unanswered_sets=missing,
                   **four_eyes_labels(found.four_eyes, views, summary.count, whole=cursor is None and not missing))  # fmt: skip
    return render(request, "dead_letters.html", context, user=user)


def four_eyes_labels(rules: FourEyes, shown: Sequence[MessageView], count: int, *, whole: bool) -> dict[str, Any]:
    """Whether the redrive buttons make a proposal, where that is known before the dry run: any
    selection of this page does when each of its rows alone would (`selection_why`); everything the
    filter matches does when there are more than the bulk count, or when this page shows them all
    (`whole` and as many as `count`) and they do (`filter_why`). Unknown is None: the button says
    "Redrive…", the note says when four eyes apply, and the dry run says which it is."""
    alone = [rules.needs_approval([view]) for view in shown]
    selection_why = alone[0] if alone and all(alone) else None
    filter_why = rules.bulk_reason(count)
    if filter_why is None and whole and len(shown) == count:
        filter_why = rules.needs_approval(shown)
    return {"selection_why": selection_why, "filter_why": filter_why, "four_eyes_rule": rules.described()}


def safe_cell(value: Any) -> Any:
    """A cell a spreadsheet shows as text: one that would start a formula gets a leading quote."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


async def _csv_lines(found: ApiServices, user: WebUser, dead_filter: DeadLetterFilter) -> AsyncIterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(cells: list[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([safe_cell(cell) for cell in cells])
        return buffer.getvalue()

    yield line(list(CSV_COLUMNS))
    cursor: str | None = None
    while True:
        page = await _export_page(found, dead_filter, cursor)
        for set_services, view in page.rows:
            item = row(set_services, view)
            try:
                payload = json.loads(current_payload(view))
            except ValueError:
                payload = {}
            shown = payload if isinstance(payload, dict) else {}
            amount = "" if item["amount_minor"] is None else major_units(item["amount_minor"], item["currency"])
            yield line([item["id"], item["kind"], item["ref_key"], "" if item["dead_ms"] is None else utc(item["dead_ms"]), item["attempts"],
                        item["error_class"] or "", item["error_text"], item["dead_reason"], amount,
                        item["currency"] or "", "" if item["amount_minor"] is None else item["amount_minor"],
                        json.dumps(shown, sort_keys=True, ensure_ascii=False)])  # fmt: skip
        cursor = page.next_cursor
        if cursor is None or not page.rows:
            return


async def _export_page(found: ApiServices, dead_filter: DeadLetterFilter, cursor: str | None,
                       limit: int = EXPORT_PAGE) -> across_sets.Page:
    """A page of the export: the one set's, or every set's merged (a set that does not answer
    stops the export: a file is never missing a set's rows)."""
    if found.sets is not None:
        return await across_sets.dead_letter_page(found, dead_filter, cursor=cursor, limit=limit)
    page = (await actions.store(found, found.queue.dead_letters(dead_filter, cursor=cursor, limit=limit))).value
    return across_sets.Page([(found, view) for view in page.items], page.next_cursor)


@router.get("/review/dead-letters.csv")
async def export(request: Request, user: User) -> Response:
    """Every dead letter of the filter, all pages, streamed: the file is as long as the filter's
    count, never held whole in memory."""
    require(user, Right.EXPORT)
    form: FilterForm = parse_filter(request.query_params, sets=services(request).sets is not None)
    if form.dead_filter is None:
        problem = invalid([{"field": k, "message": v} for k, v in form.errors.items()])
        return problem_page(request, user, problem)
    found = services(request)
    try:  # the first page before the headers go out: a store that is down is a page, not a cut file
        await _export_page(found, form.dead_filter, None, limit=1)
    except Problem as problem:
        return problem_page(request, user, problem)
    return StreamingResponse(
        _csv_lines(found, user, form.dead_filter), media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="dead-letters.csv"', "Cache-Control": "no-store"},
    )  # fmt: skip
