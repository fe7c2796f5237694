"""The intake's single POST served straight from its endpoint, past the router and FastAPI's request
handling.

Why: most producers send one failed request at a time, and on that path the framework cost more
than the intake itself. py-spy on `bench.api`'s single phase (2026-11-25) put a third of the API's
CPU in matching the path against every route in order (the review pages come first), FastAPI's
request handler and its exception and exit-stack layers; the endpoint reads its own body and
checks its own token, so none of that does anything for it.

Owns: an ASGI layer that answers the routes it is given (method and path, no path parameters,
an endpoint taking only the `Request`) by calling their endpoint as the router would, with the
route in the scope (the tracing and metrics layers outside it name the route from it), and a
`Problem` raised by the endpoint answered as the exception handlers answer it. Every other
request, and anything else raised, goes on as if this layer were not there.

Must never: serve a route whose endpoint needs FastAPI to solve a parameter or a dependency, or
answer differently from the routed path (the API's tests run through this layer).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api import problems


def direct_routes(routes: Iterable[object], paths: Iterable[tuple[str, str]]) -> dict[tuple[str, str], APIRoute]:
    """The routes for these (method, path) pairs; ValueError for one that cannot be served directly."""
    wanted = set(paths)
    found: dict[tuple[str, str], APIRoute] = {}
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        for method in route.methods or ():
            if (method, route.path) in wanted:
                found[(method, route.path)] = route
    for key in wanted:
        route = found.get(key)
        if route is None:
            raise ValueError(f"no route {key[0]} {key[1]}")
        parameters = list(inspect.signature(route.endpoint).parameters.values())
        if route.param_convertors or len(parameters) != 1 or parameters[0].annotation not in (Request, "Request"):
            raise ValueError(f"{key[0]} {key[1]}: only an endpoint taking the Request alone can be served directly")
        if route.dependencies:
            raise ValueError(f"{key[0]} {key[1]}: a route with dependencies needs the router")
    return found


class DirectRoutes:
    """Pure ASGI, inside the tracing and metrics layers and outside the router."""

    def __init__(self, app: ASGIApp, routes: dict[tuple[str, str], APIRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get((scope["method"], _route_path(scope))) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        try:
            response = await route.endpoint(Request(scope, receive))
        except problems.Problem as problem:
            response = problems.response(problem, scope["path"])
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path the router matches: without the root path the app is served under (as Starlette's)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path
