"""The service's internal names as the review pages say them to a person: what an audit entry did
(`edit_redrive` -> "edit and redrive"), what it was done to (`document:users/ann` -> "user ann"),
what a timeline step was (`attempt_failed` #2 -> "attempt 2 failed"), and the values of an
entry's changes (a store's message id -> the request id people use, epoch milliseconds -> a UTC
time or a duration).

Why here and not in the store or the JSON answers: tools read `GET /v1/audit` and the timeline by
these names, and the audit chain hashes them; only the pages translate, and each page keeps the
name itself in its data attributes (`data-action`, `data-target`, `data-field`) for tests and
scripts. A name this module does not know is shown with its underscores as spaces, never hidden.

Must never: change what an entry says (a value is reformatted, never dropped, except the
namespace and name of a document, which the entry's "On" already says), or read the store.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

ACTION_LABELS: Final[Mapping[str, str]] = {
    "edit_redrive": "edit and redrive", "redriven": "redrive", "discarded": "discard", "propose": "propose",
    "approve": "approve", "reject": "reject", "withdraw": "withdraw", "expire": "proposal expired",
    "redrive_job": "start a redrive job", "pause_job": "pause a job", "resume_job": "resume a job",
    "cancel_job": "cancel a job", "job_done": "job finished", "document_put": "set a document",
    "token_put": "set an API token", "token_revoked": "revoke an API token", "quota_set": "set a quota",
    "policy_set": "set a retry policy", "retention_set": "set the retention", "paused": "pause a kind",
    "resumed": "resume a kind",
}  # fmt: skip
"""What each audited action did, as the audit page's "What" says it."""
DOCUMENT_LABELS: Final[Mapping[str, tuple[str, str]]] = {
    "users": ("set a user", "user"), "passwords": ("set a password", "password of"),
    "sessions": ("session", "session"), "logins": ("sign-in", "sign-ins of"),
    "breakers": ("set a breaker's mode", "breaker of"), "classification": ("set a classification table", "error table of"),
    "kafka_publisher": ("events publisher lease", "events publisher"),
}  # fmt: skip
"""A settings document's namespace: (what writing it did, what its name is of)."""
STEP_LABELS: Final[Mapping[str, str]] = {
    "intake": "received", "attempt_started": "attempt {n} started", "attempt_succeeded": "attempt {n} succeeded",
    "attempt_failed": "attempt {n} failed", "attempt_expired": "attempt {n} ran out of time (lease expired)",
    "dead_lettered": "dead-lettered", "redriven": "redriven", "discarded": "discarded",
}  # fmt: skip
"""A timeline step's type (api/views.py), as the request page's timeline says it."""
DETAIL_LABELS: Final[Mapping[str, str]] = {
    "error_class": "error", "error_text": "answer", "worker": "by worker", "attempt": "after attempt",
    "reason": "why", "actor": "by", "reason_code": "reason code", "superseded_by": "superseded by",
}  # fmt: skip
REQUEST_ID_FIELDS: Final = frozenset({"superseded_by", "previous_id", "targets", "new_id", "message_id"})
"""Fields that hold the store's message ids (`targets`: several, comma-separated)."""
DURATION_FIELDS: Final = frozenset({"retention_ms", "event_retention_ms", "lateness_ms", "lateness_max_ms", "ttl_ms"})
EPOCH_MS_MIN: Final = 10**11
"""A `_ms` value this large is a moment (after 1973); a smaller one, a duration (a delay, a timeout)."""
SECRET_NAMESPACES: Final = frozenset({"passwords"})
"""Documents whose body is a secret's hash: said to be set, not printed (the stored JSON keeps it)."""
_DIGITS: Final = re.compile(r"^[0-9]{1,19}$")
_TARGET: Final = re.compile(r"^([a-z_]+):(.*)$")
PAYLOAD_PREFIX: Final = "payload."
PublicId = Callable[[int], str]


def _spaced(name: str) -> str:
    return name.replace("_", " ")


def document_of(target: str) -> tuple[str, str] | None:
    """`document:users/ann` -> ("users", "ann"); None for any other target."""
    match = _TARGET.match(target)
    if match is None or match[1] != "document" or "/" not in match[2]:
        return None
    namespace, _, name = match[2].partition("/")
    return namespace, name


def action_label(action: str, target: str) -> str:
    """What an audit entry did: `document_put` says which kind of document."""
    document = document_of(target)
    if action == "document_put" and document is not None:
        return DOCUMENT_LABELS.get(document[0], (f"set a {_spaced(document[0])} document", ""))[0]
    return ACTION_LABELS.get(action, _spaced(action))


def target_label(target: str) -> str:
    """What an entry not about a request, proposal or job was done to, in words (`token:ops` ->
    "API token ops", `kind:transfer` -> "kind transfer", `retention` -> "retention")."""
    document = document_of(target)
    if document is not None:
        namespace, name = document
        return f"{DOCUMENT_LABELS.get(namespace, ('', _spaced(namespace)))[1]} {name}"
    match = _TARGET.match(target)
    if match is None:
        return _spaced(target)
    noun = {"token": "API token", "kind": "kind", "message": "request", "proposal": "proposal", "job": "job"}
    return f"{noun.get(match[1], _spaced(match[1]))} {match[2]}"


def step_label(step: str, attempt: int | None = None) -> str:
    return STEP_LABELS.get(step, _spaced(step)).format(n="" if attempt is None else attempt).replace("  ", " ")


def detail_label(name: str, step: str = "") -> str:
    """A timeline step's detail: at intake, the error class is the producer's original failure."""
    if step == "intake" and name == "error_class":
        return "first failed with"
    return DETAIL_LABELS.get(name, _spaced(name))


def duration(ms: int) -> str:
    """``90000`` -> ``1 min 30 s``; ``250`` -> ``250 ms``: the two largest units that are not zero."""
    if ms < 1000:
        return f"{ms} ms"
    parts = []
    rest = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size} {unit}")
            rest %= size
    return " ".join(parts[:2])


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def value_text(field: str, text: str | None, public_id: PublicId) -> str | None:
    """One side of a change as a person reads it: message ids as request ids, `_ms` as a UTC time
    or a duration; anything else as it is."""
    if text is None:
        return None
    last = field.rpartition(".")[2]
    if last in REQUEST_ID_FIELDS and all(_DIGITS.match(part) for part in text.split(",")):
        return ", ".join(public_id(int(part)) for part in text.split(","))
    if last.endswith("_ms") and _DIGITS.match(text):
        ms = int(text)
        return duration(ms) if last in DURATION_FIELDS or ms < EPOCH_MS_MIN else _utc(ms)
    return text


def changes_for_people(changes: Sequence[Mapping[str, Any]], target: str, public_id: PublicId) -> list[dict[str, Any]]:
    """An entry's changes (`audit_view.field_changes`) with a `label` to show and values for people.
    A document's namespace and name are left out (the entry's "On" says them) and its body's
    fields are named without `body.`; a secret's hash is said to be set."""
    document = document_of(target)
    shown = []
    for change in changes:
        field = str(change["field"])
        if document is not None and field in ("namespace", "name"):
            continue
        before = value_text(field, change["before"], public_id)
        after = value_text(field, change["after"], public_id)
        if not before and not after:  # absent on one side, empty on the other: nothing a person would call a change
            continue
        if document is not None and document[0] in SECRET_NAMESPACES and field == "body":
            before, after = (None if side is None else "(set; stored as a hash)" for side in (before, after))
            field = "password"
        shown.append({**change, "label": field_label(field.removeprefix("body.") if document else field),
                      "before": before, "after": after})  # fmt: skip
    return shown


def field_label(field: str) -> str:
    """A changed field's name for a person: `superseded_by` -> "superseded by", `expires_ms` ->
    "expires" (its value says it is a time); a payload's own field names are kept as they are."""
    if field.startswith(PAYLOAD_PREFIX):
        return field
    return _spaced(field.removesuffix("_ms"))
