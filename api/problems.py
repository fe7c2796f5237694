"""RFC 9457 problem details: every error the API answers, with a stable type per kind of error.

Each type is a relative URI, ``/problems/<name>``, that this API serves as a short description, so
a client can branch on ``type`` and a person can follow it. A `Problem` is raised anywhere below a
route and answered here; framework errors (unknown route, wrong method, a request FastAPI itself
refuses) and anything unexpected are answered as problems too, so no traceback and no HTML error
page ever reaches a caller.

Must never: put a token, a payload or an exception's text from inside the process in a problem
(an unexpected error is logged with its traceback and answered with its type only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from submission import rules as submissions
from submission.rules import field_errors

log = logging.getLogger("api.problems")
MEDIA_TYPE: Final = "application/problem+json"
BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True)
class ProblemType:
    name: str
    status: int
    title: str
    description: str

    @property
    def uri(self) -> str:
        return f"/problems/{self.name}"


def _types(*types: ProblemType) -> dict[str, ProblemType]:
    return {t.name: t for t in types}


TYPES: Final = _types(
    ProblemType("unauthenticated", 401, "Authentication required",
                "No bearer token, or one that is unknown, malformed or revoked. Send `Authorization: Bearer cmp_...`."),
    ProblemType("forbidden", 403, "Not allowed for this role",
                "The token is valid, but its role may not do this. The problem names the roles that may."),
    ProblemType("not-found", 404, "Not found",
                "No such resource, or none that this token may see (a producer sees only what it submitted)."),
    ProblemType("method-not-allowed", 405, "Method not allowed", "The resource exists; this method does not."),
    ProblemType("idempotency-key-missing", 400, "Idempotency-Key header required",
                "Every submission needs an `Idempotency-Key` header (IETF httpapi idempotency-key draft): the same"
                " key and body may be sent again safely, and is answered with the original request."),
    ProblemType("idempotency-key-invalid", 400, "Idempotency-Key header malformed",
                "The key must be 1-95 printable ASCII characters, bare or as a quoted structured-field string."),
    ProblemType("idempotency-key-reused", 422, "Idempotency-Key already used with another body",
                "This key was used before with a different request body. Nothing was created. Use a new key for"
                " a new request, or send the original body again to read the original request."),
    ProblemType("malformed-body", 400, "Body is not valid JSON", "The body could not be parsed as JSON."),
    ProblemType("body-too-deep", 400, "Body nested too deep",
                "The body is JSON nested deeper than this API reads (200 levels for a submission); nothing was"
                " stored. Flatten the document."),
    ProblemType("invalid-request", 422, "The request is invalid",
                "One or more fields are missing or invalid; `errors` names every one, as a dotted path."),
    ProblemType("body-too-large", 413, "Body too large",
                "A single request body may be at most 256 KiB of payload plus its envelope; a batch has a larger"
                " limit. Payloads are instructions, not documents."),
    ProblemType("unsupported-media-type", 415, "Unsupported media type", "Send `Content-Type: application/json`."),
    ProblemType("rate-limited", 429, "Over the intake quota",
                "This producer is over its rate: the request waited its turn as long as allowed and was not"
                " taken. Nothing was stored. Retry after `Retry-After` seconds with the same Idempotency-Key."),
    ProblemType("conflict", 409, "Conflicts with the current state", "The resource is not in a state that allows this."),
    ProblemType("store-unavailable", 503, "Store unavailable, nothing stored",
                "No leader of the replicated store accepted the request, so it was certainly not stored. Retry after"
                " `Retry-After` seconds."),
    ProblemType("outcome-unknown", 503, "Outcome unknown: retry with the same key",
                "The request reached the store but its answer was lost (a leader change, a timeout). It may or may"
                " not be stored. Retry with the same Idempotency-Key and the same body: the key makes the retry"
                " safe, and the answer then says which it was."),
    ProblemType("own-proposal", 403, "The proposer cannot approve their own proposal",
                "Four eyes: a proposal is approved by a different person with the approver role."),
    ProblemType("proposal-expired", 409, "The proposal expired",
                "A proposal is open for a configured time (review.proposal_ttl_s); nothing was done. Propose again."),
    ProblemType("partially-applied", 503, "Applied in some sets only: repeat the call",
                "A cluster-wide setting (a pause, a retry policy, a breaker's mode, a classification table) is"
                " written to every set; some did not answer. `applied_sets` and `unapplied_sets` name them. The"
                " setting is recorded as intended, so the settings repair applies it to the others once they"
                " answer; repeating the same call after `Retry-After` seconds is safe and answers when every set"
                " holds it. A redrive job group over several sets (its creation, pause, resume, cancel, approval"
                " or rejection) answers the same, with its `group`: repeating the call (a creation with the same"
                " Idempotency-Key or `group`) completes the sets that missed it. A redrive at once over several"
                " sets answers the same with what the answering sets redrove (`redriven`, `refused`): repeating it"
                " redrives only what is still dead."),
    ProblemType("not-ready", 503, "Not ready", "The store is unreachable, has no leader, or is catching up."),
    ProblemType("internal", 500, "Internal error",
                "An unexpected error; it is logged with its trace id. Nothing is known about side effects:"
                " retry submissions with the same Idempotency-Key."),
)  # fmt: skip


class Problem(Exception):
    """Raise to answer with a problem; `extra` adds members (e.g. `errors`) to the body."""

    def __init__(
        self, name: str, detail: str, *, headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.type = TYPES[name]
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})
        super().__init__(f"{name}: {detail}")


def document(problem: Problem, instance: str) -> dict[str, Any]:
    return {
        "type": problem.type.uri, "title": problem.type.title, "status": problem.type.status,
        "detail": problem.detail, "instance": instance, **problem.extra,
    }  # fmt: skip


def response(problem: Problem, instance: str) -> Response:
    return Response(
        content=msgspec.json.encode(document(problem, instance)), status_code=problem.type.status,
        media_type=MEDIA_TYPE, headers=problem.headers,
    )  # fmt: skip


def msgspec_error(error: Exception, prefix: str = "") -> dict[str, str]:
    """msgspec's ``Expected `int`, got `str` - at `$.tiers_ms[0]` `` as a field and a message."""
    message, sep, where = str(error).rpartition(" - at `$")
    if not sep:
        return {"field": prefix or "(body)", "message": str(error)}
    path = where.rstrip("`").lstrip(".")
    field = f"{prefix}.{path}" if prefix and path and not path.startswith("[") else f"{prefix}{path}"
    return {"field": field or "(body)", "message": message}


def invalid(errors: list[dict[str, str]]) -> Problem:
    return problem_of(submissions.invalid(errors))


def problem_of(refused: submissions.Invalid) -> Problem:
    """A refused submission as the problem the API answers it with."""
    return Problem(refused.name, refused.detail, extra={"errors": refused.errors} if refused.errors else None)


def validation_problem(request: Request, errors: Sequence[Mapping[str, Any]]) -> Problem:
    """What FastAPI refused, as the problem the API's own checks would answer: a body that is not
    JSON is malformed (400), one that is not sent as JSON is the wrong media type (415), and the
    rest names each bad field (422)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return Problem("malformed-body", "the body is not valid JSON")
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    sent_json = media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))
    if not sent_json and any(tuple(e.get("loc", ())) == ("body",) for e in errors) and request.method in BODY_METHODS:
        return Problem("unsupported-media-type", f"expected application/json, got {media_type or 'no Content-Type'}")
    return invalid(field_errors(errors, drop=("body", "query", "path", "header")))


def install(app: FastAPI) -> None:
    """Every error becomes a problem, and each type is described at its URI."""

    async def on_problem(request: Request, error: Exception) -> Response:
        assert isinstance(error, Problem)
        return response(error, request.scope["path"])

    async def on_http(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        name = {400: "malformed-body", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
                405: "method-not-allowed", 413: "body-too-large", 415: "unsupported-media-type"}.get(error.status_code)  # fmt: skip
        if error.status_code == 400 and isinstance(error.__cause__, RecursionError):  # FastAPI could not parse the body
            return response(problem_of(submissions.too_deep()), request.scope["path"])
        if name is None:
            log.warning("HTTP %d without a problem type: %s", error.status_code, error.detail)
            name = "internal" if error.status_code >= 500 else "invalid-request"
        headers = dict(error.headers or {})
        return response(Problem(name, str(error.detail), headers=headers), request.scope["path"])

    async def on_validation(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        return response(validation_problem(request, error.errors()), request.scope["path"])

    async def on_unexpected(request: Request, error: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.scope["path"])
        return response(Problem("internal", "an unexpected error occurred; it has been logged"), request.scope["path"])

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Exception, on_unexpected)

    @app.get("/problems/{name}", include_in_schema=False)
    async def describe(name: str) -> Response:
        found = TYPES.get(name)
        if found is None:
            raise Problem("not-found", f"no problem type {name!r}")
        body = {"type": found.uri, "title": found.title, "status": found.status, "description": found.description}
        return Response(content=msgspec.json.encode(body), media_type="application/json")
