"""The parts of the OpenAPI description that FastAPI cannot derive from signatures.

Submissions are read and validated by the intake itself (so a missing key is a 400 before the
body is looked at, a batch is validated item by item, and errors are problems), so their bodies,
the Idempotency-Key header and the problem documents are described here, from the very models
that validate them (pydantic's and msgspec's own JSON Schema), and merged into the document.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from fastapi import FastAPI
from pydantic import BaseModel, Field, TypeAdapter

from api.http import QUOTED_KEY_PATTERN
from api.problems import MEDIA_TYPE, TYPES
from api.schemas import BatchSubmission
from delay.policy import RetryPolicy
from handlers.classification import ClassificationTable
from submission.models import IDEMPOTENCY_KEY_LENGTH_MAX, Submission
from submission.rules import KEY_PATTERN

_REF: Final = "#/components/schemas/{model}"


class ProblemDocument(BaseModel):
    """RFC 9457 problem details."""

    type: str = Field(description="A stable URI per kind of error, e.g. /problems/idempotency-key-reused.")
    title: str
    status: int
    detail: str
    instance: str
    errors: list[dict[str, str]] | None = Field(None, description="invalid-request: every bad field and why.")


def _pydantic(name: str, adapter: TypeAdapter[Any]) -> dict[str, Any]:
    schema = adapter.json_schema(ref_template=_REF)
    found: dict[str, Any] = schema.pop("$defs", {})
    found[name] = schema
    return found


def _msgspec(name: str, kind: Any) -> dict[str, Any]:
    (schema,), defs = msgspec.json.schema_components([kind], ref_template=_REF.replace("{model}", "{name}"))
    return {**defs, name: schema} if "$ref" not in schema else dict(defs)


COMPONENTS: Final = {
    **_pydantic("Submission", TypeAdapter(Submission)),
    **_pydantic("BatchSubmission", TypeAdapter(BatchSubmission)),
    **_pydantic("Problem", TypeAdapter(ProblemDocument)),
    **_msgspec("RetryPolicy", RetryPolicy),
    **_msgspec("ClassificationTable", ClassificationTable),
}

IDEMPOTENCY_KEY_HEADER: Final = {
    "name": "Idempotency-Key", "in": "header", "required": True,
    "description": "Unique per request of this producer (a UUID is a good key). The same key and body again is"
    " answered with the original request; the same key with another body is refused (422).",
    "schema": {"type": "string", "anyOf": [
        {"pattern": KEY_PATTERN, "minLength": 1, "maxLength": IDEMPOTENCY_KEY_LENGTH_MAX},
        {"pattern": QUOTED_KEY_PATTERN.replace("*", "+"), "minLength": 3, "maxLength": IDEMPOTENCY_KEY_LENGTH_MAX + 2},
    ]},
}  # fmt: skip


def body(schema_name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=schema_name)}}},
        },
        "parameters": [IDEMPOTENCY_KEY_HEADER] if schema_name == "Submission" else [],
        "security": [{"HTTPBearer": []}],  # these routes authenticate by themselves (api.auth.authenticate)
    }


BODY_PROBLEMS: Final = (400, 415, 422)
"""What any operation with a body may answer besides its own: a body that is not JSON (or nested
too deep), one not sent as JSON, and one whose fields are invalid."""


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Problem answers for these statuses, each listing the problem types it may carry."""
    answers: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        names = sorted(t.uri for t in TYPES.values() if t.status == status)
        answers[status] = {
            "description": "Problem: " + ", ".join(names),
            "content": {MEDIA_TYPE: {"schema": {"$ref": _REF.format(model="Problem")}}},
        }
    return answers


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    if isinstance(operation, dict) and "requestBody" in operation:
                        added = {str(status): answer for status, answer in problems(*BODY_PROBLEMS).items()}
                        operation["responses"] = {**added, **operation["responses"]}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
