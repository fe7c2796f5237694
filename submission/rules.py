"""A submission's validation and its store command, shared by every intake: the HTTP API
(``POST /v1/requests``) and the Kafka ingest (``compensator kafka-ingest``).

One set of rules wherever a failed request comes from: the same body model (submission/models.py), the
same Idempotency-Key rule, the same per-producer key ``{producer}:{key}``, the same headers (the
body's fingerprint, the producer, the original failure, the trace context), so a request sent
through Kafka and then again over HTTP with the same key is recognised as the same request.

Owns: bytes -> a validated submission, a key check, and a submission -> `Enqueue`. A refusal is an
`Invalid` value with the problem type's name and one entry per bad field; the API turns it into
an RFC 9457 problem, the ingest into a rejects record.

Must never: import the web framework (the ingest runs without it), read a clock (`now_ms` is
given), or put a rejected value in an error (it may be a secret or a payload).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from delay.policy import DELAY_MAX_MS
from ledger.kinds import IDENTIFIER_PATTERN, CallbackPayload, canonical_json, encode_payload
from ledger.text import IDENTIFIER_TEXT
from queues import Enqueue
from submission.models import DELAY_MAX_S, IDEMPOTENCY_KEY_LENGTH_MAX, KIND_TAGS, SUBMISSION, AnySubmission

HEADER_FINGERPRINT: Final = "fingerprint"
HEADER_PRODUCER: Final = "producer"
HEADER_FAILURE_CLASS: Final = "failure-class"
HEADER_FAILURE_TEXT: Final = "failure-text"
HEADER_FAILURE_STATUS: Final = "failure-status"
KEY_SEPARATOR: Final = ":"
KEY_PATTERN: Final = r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$"
_KEY: Final = re.compile(KEY_PATTERN)
_UNKNOWN_KIND: Final = ("union_tag_invalid", "union_tag_not_found")
JSON_DEPTH_MAX: Final = 200
"""How deep a submission's JSON may nest (the parser's limit; a callback body gets all but two)."""
PATTERN_MESSAGES: Final = {
    IDENTIFIER_PATTERN: "1-128 letters, digits and _.:@/- starting with a letter or a digit (an identifier the"
                        " downstream takes)",
    IDENTIFIER_TEXT: "1-128 characters, none of them a control or format character (\\u202e, a zero-width space,"
                     " a line separator, ...)",
}  # fmt: skip
"""What a person is told instead of the regular expression a value did not match."""


class Invalid(Exception):
    """A refused submission: `name` is the problem type (malformed-body, invalid-request,
    idempotency-key-invalid), `errors` one {"field", "message"} per bad field."""

    def __init__(self, name: str, detail: str, errors: Sequence[Mapping[str, str]] = ()) -> None:
        self.name = name
        self.detail = detail
        self.errors = [dict(error) for error in errors]
        super().__init__(f"{name}: {detail}")


def store_key(producer: str, key: str) -> str:
    return f"{producer}{KEY_SEPARATOR}{key}"


def client_key(stored: str) -> tuple[str, str]:
    """(producer, the producer's own key) of a stored idempotency key."""
    producer, _, key = stored.partition(KEY_SEPARATOR)
    return producer, key


def check_key(key: str) -> str:
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_LENGTH_MAX or _KEY.match(key) is None:
        raise Invalid(
            "idempotency-key-invalid",
            f"the key must be 1-{IDEMPOTENCY_KEY_LENGTH_MAX} printable ASCII characters without leading or trailing spaces",
        )
    return key


def field_path(location: Sequence[int | str], drop: Sequence[str] = ()) -> str:
    """pydantic's ``("transfer", "payload", "amount_minor")`` -> ``payload.amount_minor``: the union
    tag and FastAPI's ``body`` are where the error was found, not a field of the request."""
    parts = [str(p) for p in location]
    while parts and parts[0] in drop:
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path or "(body)"


def field_errors(errors: Sequence[Mapping[str, Any]], drop: Sequence[str] = ()) -> list[dict[str, str]]:
    """One entry per bad field, with pydantic's message; never the rejected value (it may be a
    secret or a payload)."""
    seen: dict[tuple[str, str], None] = {}
    for error in errors:
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "string_pattern_mismatch":
            message = PATTERN_MESSAGES.get(str((error.get("ctx") or {}).get("pattern")), message)
        seen[(field_path(error.get("loc", ()), drop), message)] = None
    return [{"field": field, "message": message} for field, message in seen]


def invalid(errors: list[dict[str, str]]) -> Invalid:
    fields = ", ".join(dict.fromkeys(e["field"] for e in errors))
    return Invalid("invalid-request", f"invalid fields: {fields}", errors)


def parse_submission(body: bytes) -> AnySubmission:
    """A submission from JSON bytes, or `Invalid` naming every bad field."""
    try:
        return SUBMISSION.validate_json(body)
    except ValidationError as error:
        raise _refusal(error) from None


def _refusal(error: ValidationError) -> Invalid:
    errors = error.errors(include_url=False)
    invalid_json = [e for e in errors if e["type"] == "json_invalid"]
    if any("recursion limit" in str(e.get("ctx", {}).get("error", "")) for e in invalid_json):
        return too_deep()
    if invalid_json:
        return Invalid("malformed-body", "the body is not valid JSON")
    if any(e["type"] in _UNKNOWN_KIND for e in errors):
        known = ", ".join(KIND_TAGS)
        return invalid([{"field": "kind", "message": f"missing or unknown kind; known kinds: {known}"}])
    return invalid(field_errors(errors, drop=KIND_TAGS))


def too_deep() -> Invalid:
    return Invalid("body-too-deep", f"the JSON is nested deeper than {JSON_DEPTH_MAX} levels")


def check_callback_target(submission: AnySubmission, callback_targets: Collection[str]) -> None:
    """A callback to a target this deployment has not registered could only die at its first
    attempt: refused here, naming the field (the targets are configuration: handlers.callback.targets)."""
    payload = submission.payload
    if isinstance(payload, CallbackPayload) and payload.target not in callback_targets:
        raise invalid([{"field": "payload.target", "message": "not a registered callback target of this deployment"}])


def fingerprint(submission: AnySubmission, payload: bytes) -> str:
    """The whole body, canonical: the payload's stored bytes and the envelope's other members."""
    envelope = submission.model_dump(exclude={"payload"}, exclude_none=True)
    digest = hashlib.sha256(canonical_json(envelope))
    digest.update(payload)
    return digest.hexdigest()[:32]


def build_enqueue(
    *, producer: str, key: str, submission: AnySubmission, trace_headers: Mapping[str, str], now_ms: int,
    callback_targets: Collection[str],
) -> Enqueue:  # fmt: skip
    """The store command for one validated submission, or `Invalid` for a callback to a target
    that is not registered or a schedule too far ahead."""
    check_callback_target(submission, callback_targets)
    payload = encode_payload(submission.payload)
    headers = dict(trace_headers)
    headers[HEADER_FINGERPRINT] = fingerprint(submission, payload)
    headers[HEADER_PRODUCER] = producer
    if submission.failure is not None:
        headers[HEADER_FAILURE_CLASS] = submission.failure.error_class
        if submission.failure.text is not None:
            headers[HEADER_FAILURE_TEXT] = submission.failure.text
        if submission.failure.http_status is not None:
            headers[HEADER_FAILURE_STATUS] = str(submission.failure.http_status)
    delay_ms, due_ms = 0, None
    if submission.delay_s is not None:
        delay_ms = round(submission.delay_s * 1000)
    elif submission.not_before is not None:
        due_ms = int(submission.not_before.timestamp() * 1000)
        if due_ms > now_ms + DELAY_MAX_MS:
            raise Invalid(
                "invalid-request", "not_before is more than 2 years ahead",
                [{"field": "not_before", "message": f"at most {DELAY_MAX_S} s ahead"}],
            )  # fmt: skip
        due_ms = max(due_ms, 0)
    return Enqueue(
        kind=submission.kind, idempotency_key=store_key(producer, key), ref_key=submission.ref_key,
        payload=payload, headers=headers, delay_ms=delay_ms, due_ms=due_ms,
    )  # fmt: skip
