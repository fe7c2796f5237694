"""The login and logout pages: GET/POST /review/login, POST /review/logout, and what a page
answers without a session (a redirect here) or without the right (the forbidden page): `install`.

A failed login answers the same page, with the same words and status, whether the name is
unknown, the password wrong, the user disabled or locked: which names exist is not for anyone who
can reach the page to learn. A client address that failed too often lately is answered 429 with
`Retry-After` before anything is tried (api/web/throttle.py), whatever the name. The login form is
not CSRF-protected by a token (there is no session yet to bind one to); its Origin and
Sec-Fetch-Site are checked instead, which is what stops a site from logging a browser in as the
attacker.

Must never: echo the password back into the page, or redirect anywhere but a path on this site.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Depends, FastAPI, Form, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from api.web import sessions
from api.web.accounts import AccountError
from api.web.headers import page_router, secure
from api.web.templating import render
from queues import ClientError, QueueError

router = page_router()
FAILED: Final = "Wrong name or password, or the account is locked for a while. Try again, or ask an admin."
THROTTLED: Final = "Too many failed logins from your address. Try again in {minutes} minute{s}, or ask an admin."


def forbidden_page(request: Request, detail: str) -> HTMLResponse:
    return render(request, "forbidden.html", {"detail": detail}, status=403)


def unavailable_page(request: Request) -> HTMLResponse:
    """Who is logged in could not be read: the store did not answer (never the login page, which
    would say the session ended)."""
    detail = "The store did not answer, so who you are could not be checked. Try again in a moment."
    return render(request, "forbidden.html", {"detail": detail, "title": "Not available"}, status=503,
                  headers={"Retry-After": "1"})  # fmt: skip


def _login_page(request: Request, next_path: str, *, name: str = "", error: str = "", status: int = 200) -> HTMLResponse:
    return render(request, "login.html", {"next": sessions.safe_next(next_path), "name": name, "error": error},
                  status=status, headers={"Cache-Control": "no-store"})  # fmt: skip


@router.get("/review/login", include_in_schema=False)
async def login_form(request: Request, next: str = sessions.HOME_PATH) -> Response:
    try:
        await sessions.current_user(request)
    except sessions.LoginRequired:
        return _login_page(request, next)
    return RedirectResponse(sessions.safe_next(next), status_code=303)


@router.post("/review/login", include_in_schema=False)
async def login(
    request: Request, name: Annotated[str, Form(max_length=64)] = "", password: Annotated[str, Form(max_length=1024)] = "",
    next: Annotated[str, Form(max_length=2048)] = sessions.HOME_PATH,  # the query string's name, as GET has it
) -> Response:  # fmt: skip
    sessions.check_origin(request)
    web = sessions._auth(request)
    client = request.client.host if request.client else ""
    try:
        found = await web.login(name.strip(), password, client=client)
    except sessions.LoginThrottled as throttled:
        minutes = -(-throttled.retry_after_s // 60)
        page = _login_page(request, next, name=name, error=THROTTLED.format(minutes=minutes, s="" if minutes == 1 else "s"),
                           status=429)  # fmt: skip
        page.headers["Retry-After"] = str(throttled.retry_after_s)
        return page
    except (ClientError, QueueError):
        return _login_page(request, next, name=name, error="The store did not answer: try again in a moment.", status=503)
    except AccountError as error:
        return _login_page(request, next, name=name, error=str(error), status=503)
    if found is None:
        return _login_page(request, next, name=name, error=FAILED, status=401)
    session_id, _user = found
    response = RedirectResponse(sessions.safe_next(next), status_code=303)
    sessions.set_cookie(response, session_id, web.settings)
    return response


@router.post("/review/logout", include_in_schema=False)
async def logout(request: Request, user: Annotated[sessions.WebUser, Depends(sessions.checked_csrf)]) -> Response:
    session_id = request.cookies.get(sessions.COOKIE, "")
    try:
        await sessions._auth(request).logout(session_id)
    except (ClientError, QueueError):
        return forbidden_page(request, "The store did not answer, so the session is still open: try again.")
    response = RedirectResponse(sessions.LOGIN_PATH, status_code=303)
    sessions.clear_cookie(response)
    return response


def install(app: FastAPI) -> None:
    """The answers to LoginRequired and Forbidden, and the login and logout routes. Here, not in
    sessions.py: the sessions are what this page builds on, never the other way round."""

    async def login_required(request: Request, error: Exception) -> Response:
        target = sessions.login_url(sessions.return_path(request))
        if request.headers.get("hx-request") == "true":
            return secure(Response(status_code=401, headers={"HX-Redirect": target}))
        response = RedirectResponse(target, status_code=303)
        if sessions.COOKIE in request.cookies:
            sessions.clear_cookie(response)
        return secure(response)

    async def forbidden(request: Request, error: Exception) -> Response:
        assert isinstance(error, sessions.Forbidden)
        return secure(forbidden_page(request, error.detail))

    async def unreachable(request: Request, error: Exception) -> Response:
        return secure(unavailable_page(request))

    app.add_exception_handler(sessions.LoginRequired, login_required)
    app.add_exception_handler(sessions.Forbidden, forbidden)
    app.add_exception_handler(sessions.StoreUnreachable, unreachable)
    app.router.routes.extend(router.routes)
