"""The login and logout pages: GET/POST /review/login, POST /review/logout, and what a page
answers without a session (a redirect here) or without the right (the forbidden page): `install`.

A failed login answers the same page, with the same words and status, whether the name is
unknown, the password wrong, the user disabled or locked: which names exist is not for anyone who
can reach the page to learn. The login form is not CSRF-protected by a token (there is no session
yet to bind one to); its Origin and Sec-Fetch-Site are checked instead, which is what stops a
site from logging a browser in as the attacker.

Must never: echo the password back into the page, or redirect anywhere but a path on this site.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from api.web import sessions
from api.web.accounts import AccountError
from api.web.templating import render
from queues import ClientError, QueueError

router = APIRouter()
FAILED: Final = "Wrong name or password, or the account is locked for a while. Try again, or ask an admin."


def forbidden_page(request: Request, detail: str) -> HTMLResponse:
    return render(request, "forbidden.html", {"detail": detail}, status=403)


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
    try:
        found = await web.login(name.strip(), password)
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
            return Response(status_code=401, headers={"HX-Redirect": target})
        response = RedirectResponse(target, status_code=303)
        if sessions.COOKIE in request.cookies:
            sessions.clear_cookie(response)
        return response

    async def forbidden(request: Request, error: Exception) -> Response:
        assert isinstance(error, sessions.Forbidden)
        return forbidden_page(request, error.detail)

    app.add_exception_handler(sessions.LoginRequired, login_required)
    app.add_exception_handler(sessions.Forbidden, forbidden)
    app.router.routes.extend(router.routes)
