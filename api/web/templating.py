"""The review pages' Jinja2 environment: templates from the package, autoescaped, every printed
value with its invisible characters shown escaped, with the filters finance reads by (money in
major units per ISO 4217, times in UTC).

Amounts are formatted from integers with the currency's minor-unit digits (ledger/currencies.py),
never through a float: ``12345 JPY`` is ``12,345 JPY``, ``12345 BHD`` is ``12.345 BHD``. Times are
UTC, to the second, because the store, the downstreams' logs and the reconciliation all are.

Must never: turn autoescaping off, or put a value into a template unescaped (`|safe` is for
nothing that came from a request or a payload).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from api.money_view import display
from api.web import readable
from api.web.rights import Right, allowed
from ledger.text import escaped

TEMPLATES: Final = Path(__file__).parent / "templates"


def money(amount_minor: int | None, currency: str | None) -> str:
    """``123456, "USD"`` -> ``"1,234.56 USD"`` (api/money_view.py, which the JSON answers share)."""
    return display(amount_minor, currency)


def when(moment: int | str | None, *, precise: bool = False) -> str:
    """A time as finance reads it, ``2026-11-25 17:32:59 UTC``, from the store's milliseconds or
    the JSON answers' RFC 3339 text (``2026-11-25T17:32:59.146Z``); `precise` keeps the
    milliseconds, for a timeline whose steps are milliseconds apart."""
    if moment is None:
        return "—"
    if isinstance(moment, str):
        try:
            parsed = dt.datetime.fromisoformat(moment.replace("Z", "+00:00")).astimezone(dt.UTC)
        except ValueError:
            return moment
    else:
        parsed = dt.datetime.fromtimestamp(moment / 1000, dt.UTC)
    text = parsed.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{parsed.microsecond // 1000:03d} UTC" if precise else f"{text} UTC"


def pretty(document: Any) -> str:
    """JSON for a person: indented, keys sorted, non-ASCII kept readable."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)


class Editable(str):
    """A form field's value (`|editable`): given back to the browser exactly as it was typed or
    stored, so that sending the form again sends the same text (HTML-escaped all the same)."""


def editable(value: Any) -> Editable:
    return Editable("" if value is None else value)


def shown(value: Any) -> Any:
    """Every value a template prints, before it is HTML-escaped: control and format characters
    written as their escapes (``rp-\\u202eevil``, never "rp-live": ledger/text.py), whatever the
    value is and wherever it came from (a ref key stored before intake refused them, an error
    text, a memo). Newlines and tabs stay: a pretty-printed payload keeps its lines. A form field's
    value (`Editable`) is given back as it was: escaping it would change what the form sends."""
    if isinstance(value, Editable):
        return str(value)
    if isinstance(value, str):
        text = escaped(value, keep_layout=True)
        return type(value)(text) if isinstance(value, Markup) else text
    return value


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, finalize=shown,
    )  # fmt: skip
    environment.filters.update(money=money, when=when, pretty=pretty, editable=editable, duration=readable.duration,
                               step=readable.step_label, detail_label=readable.detail_label)  # fmt: skip
    environment.globals["Right"] = Right
    return environment


ENVIRONMENT: Final = _environment()


def render(
    request: Request, template: str, context: Mapping[str, Any], *, user: Any = None, status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:  # fmt: skip
    """A page (or an htmx fragment) for this user: `can(Right.X)` in a template hides what the
    user's role may not do (the route refuses it anyway)."""

    def can(right: Right) -> bool:
        return user is not None and allowed(user.role, right)

    frame = {"user": user, "can": can, "csrf_token": getattr(user, "csrf_token", ""), "path": request.url.path,
             "htmx": request.headers.get("hx-request") == "true"}  # fmt: skip
    body = ENVIRONMENT.get_template(template).render({**context, **frame})
    return HTMLResponse(body, status_code=status, headers=dict(headers or {}))
