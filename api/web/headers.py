"""What every review page is sent with: not cached, not sniffed, not framed, and nothing run or
styled but this site's own files.

The pages show payloads, account numbers (to those who may see them) and who did what: a shared
or back-button cache must not keep them (`Cache-Control: no-store`), a browser must not guess a
type other than the one sent (`X-Content-Type-Options: nosniff`), and no other site may frame them
to trick a click on "Approve" (`frame-ancestors 'none'`, and `X-Frame-Options` for browsers that
predate it). The Content Security Policy allows scripts, styles, images and requests from this
origin only: htmx is served from the package (api/static/htmx/), the templates have no inline
script or style, and htmx's own inline indicator style and eval are turned off in base.html.

Every page route is a `PageRoute` (`page_router()`), which adds the headers to whatever the page
answers (a page, a redirect, the CSV export); the answers made outside a route (the login
redirect, the 403 page) add them with `secure`. tests/web/test_page_headers.py walks every page.

Must never: allow an inline script, `unsafe-eval`, or a source outside this origin.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Final

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def secure(response: Response) -> Response:
    for name, value in PAGE_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


class PageRoute(APIRoute):
    """A review page's route: its answers carry PAGE_HEADERS."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            return secure(await handler(request))

        return secured


def page_router(**options: Any) -> APIRouter:
    """A router of review pages: outside the OpenAPI description, every answer secured."""
    return APIRouter(include_in_schema=False, route_class=PageRoute, **options)
