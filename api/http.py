"""Reading a request the way the intake needs it: the Idempotency-Key header, the media type, a
body read only up to its limit, and JSON answers without a second validation pass.

Must never: buffer more than the limit of a body, or trust Content-Length alone (a chunked body
has none, and a lying one is cut at the limit all the same).
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
from fastapi import Request
from starlette.responses import Response

from api.problems import Problem, invalid, problem_of
from submission import rules as submissions

QUOTED_KEY_PATTERN: Final = r'^"((?:[\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$'
_QUOTED: Final = re.compile(QUOTED_KEY_PATTERN)
JSON: Final = "application/json"


def idempotency_key(request: Request) -> str:
    """The key as the producer meant it: a bare token (as most clients send it) or an RFC 8941
    sf-string (``"..."``, as the IETF draft writes it). 400 when missing or malformed."""
    raw = request.headers.get("idempotency-key")
    if raw is None:
        raise Problem("idempotency-key-missing", "send an Idempotency-Key header; a UUID is a good key")
    quoted = _QUOTED.match(raw)
    key = re.sub(r'\\(["\\])', r"\1", quoted[1]) if quoted else raw
    return check_key(key)


def check_key(key: str) -> str:
    try:
        return submissions.check_key(key)
    except submissions.Invalid as refused:
        raise problem_of(refused) from None


def require_json(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != JSON and not (media_type.startswith("application/") and media_type.endswith("+json")):
        raise Problem("unsupported-media-type", f"expected {JSON}, got {media_type or 'no Content-Type'}")


async def read_body(request: Request, limit_bytes: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise Problem("body-too-large", f"the body is {declared} bytes; at most {limit_bytes} are taken here")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise Problem("body-too-large", f"the body is over {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def whole_numbers(value: Any) -> Any:
    """JSON has one number type: ``500.0`` is the integer 500 (JSON Schema agrees), so integral
    floats become ints before a strict decoder sees them; fractions and strings stay as they are."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(item) for item in value]
    if isinstance(value, dict):
        return {key: whole_numbers(item) for key, item in value.items()}
    return value


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(content=msgspec.json.encode(document), status_code=status, media_type=JSON, headers=headers)


_QUERY_NAMES: Final = "_compensator_query_names"


def _query_names(route: Any) -> frozenset[str]:
    """The query parameters a route declares, its dependencies' included (read once per route, kept on it)."""
    known: frozenset[str] | None = getattr(route, _QUERY_NAMES, None)
    if known is None:
        names: set[str] = set()
        stack = [route.dependant]
        while stack:
            dependant = stack.pop()
            names.update(field.alias for field in dependant.query_params)
            stack.extend(dependant.dependencies)
        known = frozenset(names)
        setattr(route, _QUERY_NAMES, known)
    return known


async def known_query(request: Request) -> None:
    """A dependency of the filter endpoints: a query parameter the route does not declare is a 422
    naming it, never silently ignored (`?currency=USD` on a list that cannot filter by currency
    would answer every dead letter as if it were the filtered list)."""
    route = request.scope.get("route")
    if route is None or not request.query_params:
        return
    unknown = sorted(set(request.query_params) - _query_names(route))
    if unknown:
        raise invalid([{"field": name, "message": "not a parameter of this endpoint"} for name in unknown])
