"""What the review pages share: the dead-letter filter as a person types it, flash messages, the
page a refused action renders, and the services as the logged-in user may use them (a store read
masked for those without personal-data rights).

The filter is typed in major units ("12.50" CNY) and UTC times, because that is how finance reads
them; it becomes the store's `DeadLetterFilter` (minor units, milliseconds) here, exactly (no float
touches an amount), and a value that cannot be converted is named next to its field.

Must never: decide what an action does (api/review_actions.py does, for the JSON API too), or
read the store other than through `services` (which masks for a role without
`Right.VIEW_PERSONAL_DATA`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final
from urllib.parse import urlencode

from fastapi import Path
from starlette.requests import Request
from starlette.responses import HTMLResponse

from api import review_actions as actions
from api.audit_view import field_changes, links
from api.problems import Problem
from api.review_schemas import NAME_PATTERN
from api.services import ApiServices
from api.services import of as services_of
from api.web.readable import action_label, changes_for_people, target_label
from api.web.templating import render
from ledger.currencies import MINOR_UNIT_DIGITS
from ledger.kinds import AMOUNT_MINOR_MAX, Kind
from ledger.request_ids import NUMBER_MAX, PUBLIC_ID_LENGTH_MAX
from queues import DeadLetterFilter
from submission.models import REF_KEY_PATTERN

FILTER_FIELDS: Final = ("kind", "error_class", "ref_key", "dead_from", "dead_to", "currency", "amount_min",
                        "amount_max", "attempts_min", "attempts_max", "set")  # fmt: skip
"""The filter's form fields, in the order the form shows them."""
FILTER_LABELS: Final = {
    "kind": "Kind", "error_class": "Error class", "ref_key": "Ref key", "dead_from": "Dead from (UTC)",
    "dead_to": "Dead before (UTC)", "currency": "Currency", "amount_min": "Amount from", "amount_max": "Amount to",
    "attempts_min": "Attempts from", "attempts_max": "Attempts to", "set": "Set",
}  # fmt: skip
"""Each field's label, as the list's form and the dry run's "acts on" show it."""
KINDS: Final = tuple(kind.value for kind in Kind)
CURRENCIES: Final = tuple(sorted(MINOR_UNIT_DIGITS))
_NAME: Final = re.compile(NAME_PATTERN)
_REF_KEY: Final = re.compile(REF_KEY_PATTERN)
COUNT_MAX: Final = 1_000_000


RequestIdPath = Annotated[str, Path(max_length=PUBLIC_ID_LENGTH_MAX)]
"""A page's request id: longer is no id (a 422); one that is not this set's is a 404 page."""
NumberPath = Annotated[int, Path(ge=1, le=NUMBER_MAX)]
"""A page's proposal or job number, range-checked at the edge: 2**64 is a 422, never an overflow."""


def services(request: Request) -> ApiServices:
    """The services as the logged-in user may use them: a store read masked unless their role may
    see personal data (api/masked_reads.py, the one place that masks)."""
    return services_of(request)


def before_param(request: Request) -> int | None:
    """A newest-first list's `before` (the last number the page before showed); anything else is
    the first page."""
    text = request.query_params.get("before", "")
    return int(text) if text.isdigit() and len(text) <= 19 and 0 < int(text) <= NUMBER_MAX else None


def set_param(request: Request) -> int | None:
    """Several sets: the set a proposal or a job lives in (`?set=3`, as the pages link it); left out:
    the home set. Anything else names no set (a 404 page)."""
    text = request.query_params.get("set")
    if text is None:
        return None
    if not (text.isdigit() and len(text) <= 5 and int(text) >= 1):
        raise Problem("not-found", f"no set {text[:20]}")
    return int(text)


@dataclass(frozen=True, slots=True)
class Flash:
    kind: str
    """success (done), proposed (waits for a second person), error (nothing was done), info."""
    text: str


@dataclass(frozen=True, slots=True)
class FilterForm:
    """The filter as typed (to show it again, and to carry it into links and hidden fields), and
    the store's filter when every field made sense."""

    values: dict[str, str]
    dead_filter: DeadLetterFilter | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def set_id(self) -> int | None:
        """Several sets: the one set the list is narrowed to (`set`), None for every set."""
        text = self.values.get("set", "")
        return int(text) if text else None

    def query(self, **extra: str) -> str:
        """The query string of this filter (empty fields left out), with `extra` parameters."""
        return urlencode({**{k: v for k, v in self.values.items() if v}, **extra})


def time_ms(text: str) -> int:
    """A date or a date and time (the browser's datetime-local), read as UTC unless it says otherwise."""
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return actions.store_ms(moment)


def typed_times(values: Mapping[str, str], names: tuple[str, ...], errors: dict[str, str]) -> dict[str, int]:
    """The time fields given, in milliseconds; one that does not parse is named in `errors`."""
    found: dict[str, int] = {}
    for name in names:
        if values[name]:
            try:
                found[name] = time_ms(values[name])
            except ValueError:
                errors[name] = "a date (2026-11-20) or a date and time (2026-11-20T14:30), UTC"
    return found


def minor_units(text: str, currency: str) -> int:
    """ "12.50" CNY -> 1250, exactly; more decimals than the currency has is an error, not a rounding."""
    try:
        amount = decimal.Decimal(text.replace(",", "").strip())
    except decimal.InvalidOperation:
        raise ValueError("an amount in major units, e.g. 12.50") from None
    minor = amount.scaleb(MINOR_UNIT_DIGITS[currency])
    if not amount.is_finite() or minor != minor.to_integral_value() or not 0 <= minor <= AMOUNT_MINOR_MAX:
        raise ValueError(f"a non-negative amount with at most {MINOR_UNIT_DIGITS[currency]} decimals")
    return int(minor)


def _count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= COUNT_MAX:
        raise ValueError
    return value


def parse_filter(source: Mapping[str, Any], *, sets: bool = False) -> FilterForm:
    """The filter from a query string or a form; every field that does not parse is named. `sets`:
    several sets, where the list may be narrowed to one (`set`); one set has no such field."""
    values = {name: str(source.get(name) or "").strip() for name in (FILTER_FIELDS if sets else FILTER_FIELDS[:-1])}
    errors: dict[str, str] = {}
    typed: dict[str, Any] = {}
    for name, pattern, what in (("kind", _NAME, "a kind's name"), ("error_class", _NAME, "an error class's name"),
                                ("ref_key", _REF_KEY, "1-128 printable characters")):  # fmt: skip
        if values[name]:
            if pattern.match(values[name]) is None:
                errors[name] = f"give {what}"
            typed[name] = values[name]
    currency = values["currency"].upper()
    if currency:
        values["currency"] = currency
        if currency not in MINOR_UNIT_DIGITS:
            errors["currency"] = "not an active ISO 4217 code"
        typed["currency"] = currency
    typed.update({f"{name}_ms": ms for name, ms in typed_times(values, ("dead_from", "dead_to"), errors).items()})
    for name in ("amount_min", "amount_max"):
        if values[name] and "currency" not in errors:
            if not currency:
                errors["currency"] = "an amount range needs a currency"
                continue
            try:
                typed[f"{name}_minor"] = minor_units(values[name], currency)
            except ValueError as error:
                errors[name] = str(error)
    if values.get("set") and not (values["set"].isdigit() and len(values["set"]) <= 5 and int(values["set"]) >= 1):
        errors["set"] = "a set's number"
    for name in ("attempts_min", "attempts_max"):
        if values[name]:
            try:
                typed[name] = _count(values[name])
            except ValueError:
                errors[name] = "a whole number of attempts"
    if errors:
        return FilterForm(values, None, errors)
    try:
        return FilterForm(values, actions.filter_of(**typed))
    except Problem as problem:
        return FilterForm(values, None, field_messages(problem))


def field_messages(problem: Problem) -> dict[str, str]:
    """Field -> message of an invalid-request problem (each shown next to its field)."""
    return {str(e["field"]): str(e["message"]) for e in problem.extra.get("errors", ())}


def problem_flash(problem: Problem, *, acted: bool = True) -> Flash:
    """What a refused action tells a person: nothing was done, and why (a page that could not be
    read, `acted=False`, only says why: reading it was never going to do anything)."""
    fields = field_messages(problem)
    detail = "; ".join(f"{name}: {message}" for name, message in fields.items()) or problem.detail
    return Flash("error", f"{'Nothing was done. ' if acted else ''}{problem.type.title}: {detail}")


def problem_page(request: Request, user: Any, problem: Problem) -> HTMLResponse:
    flash = problem_flash(problem, acted=request.method not in ("GET", "HEAD"))
    return render(request, "problem.html", {"flashes": [flash], "problem": problem}, user=user,
                  status=problem.type.status)  # fmt: skip


def shown_entry(services: ApiServices, document: dict[str, Any]) -> dict[str, Any]:
    """An audit entry (`audit_document`) as the pages show it: what it did and to what in words,
    its changes field by field (api/web/readable.py) and what it links to (its payloads are as the
    user may see them: the store was read masked for those who may not see them, api/masked_reads.py)."""
    def public(message_id: int) -> str:
        return actions.public(services, message_id)

    target = str(document["target"])
    changes = changes_for_people(field_changes(document["before"], document["after"]), target, public)
    return {**document, "changes": changes, "label": action_label(str(document["action"]), target),
            "target_label": target_label(target), **links(document, public)}  # fmt: skip


def row(services: ApiServices, view: Any) -> dict[str, Any]:
    """A dead letter as the list, the dry run and the CSV show it."""
    money = actions.amount(view)
    return {
        "id": actions.public(services, view.message_id), "kind": view.kind, "ref_key": view.ref_key,
        "attempts": view.attempts, "error_class": view.last_error_class, "error_text": view.last_error_text or "",
        "dead_ms": view.dead_ms, "dead_reason": view.dead_reason or "", "state": view.state.value,
        "amount_minor": None if money is None else money[0], "currency": None if money is None else money[1],
    }  # fmt: skip
