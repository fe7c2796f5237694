"""How a downstream's answer becomes a decision: an ordered table of rules, as data.

A rule matches an HTTP status range and, optionally, the downstream's error code (the ``code``
field of a JSON body, e.g. ``{"code": "insufficient_funds"}``); the first rule that matches decides.
Tables are msgspec Structs because operators will edit them at runtime through the replicated
store: decoding one from JSON (`decode_table`) is its validation, strict about types, ranges and
unknown fields, and `ClassificationTable.problems()` adds the checks between rules:
- the last rule matches every status with no code, so every answer is classified by data;
- no rule is unreachable behind an earlier one;
- a rule that retries a 5xx uses an unknown-outcome class (`UNKNOWN_OUTCOME_CLASSES`): a server
  error may come after the effect was made, so the next attempt must look before it repeats.

Whether a retry's outcome is unknown is not a column: it is exactly "its error class is in
`UNKNOWN_OUTCOME_CLASSES`", the set the transfer handler consults on the next attempt, so the two
can never disagree.

Must never: do I/O or read a clock (an HTTP-date Retry-After is counted from the answer's own
`received_unix_s`).
"""

from __future__ import annotations

import email.utils
import enum
from typing import Annotated, Final

import msgspec

from handlers.answers import Answer, NotSent, Outcome, OutcomeUnknown
from handlers.contract import EXCERPT_CHARS_MAX, UNKNOWN_OUTCOME_CLASSES, Decision, Permanent, Retryable, Succeeded

RULES_MAX: Final = 64
STATUS_MIN: Final = 100
STATUS_MAX: Final = 599
DETAIL_CHARS_MAX: Final = 200
NAME_PATTERN: Final = r"^[a-z][a-z0-9_.-]{0,63}$"
"""Downstream names and error classes: the API's error-class pattern."""
CODE_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"

Status = Annotated[int, msgspec.Meta(ge=STATUS_MIN, le=STATUS_MAX)]
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Code = Annotated[str, msgspec.Meta(pattern=CODE_PATTERN)]


class ClassificationError(ValueError):
    """A table that does not decode or whose rules contradict each other (an operator error)."""


class Action(enum.StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    RETRY_AFTER = "retry_after"
    """Retry, no earlier than the answer's Retry-After (seconds or an HTTP date) when it has one."""
    PERMANENT = "permanent"


class Rule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    status_min: Status
    status_max: Status
    """Inclusive; equal to status_min for a single status."""
    code: Code | None = None
    """The downstream's error code; None matches any body."""
    action: Action
    error_class: Name
    """The decision's error class; for a success, the name of what happened."""
    detail: Annotated[str, msgspec.Meta(max_length=DETAIL_CHARS_MAX)] = ""
    """Words for the review page; default: the status and the code."""

    def matches(self, status: int, code: str | None) -> bool:
        return self.status_min <= status <= self.status_max and (self.code is None or self.code == code)

    def covers(self, later: Rule) -> bool:
        """Whether every answer `later` matches is matched by this rule first."""
        return (
            self.status_min <= later.status_min
            and later.status_max <= self.status_max
            and (self.code is None or self.code == later.code)
        )

    @property
    def is_catch_all(self) -> bool:
        return (self.status_min, self.status_max, self.code) == (STATUS_MIN, STATUS_MAX, None)


class ClassificationTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    downstream: Name
    rules: Annotated[tuple[Rule, ...], msgspec.Meta(min_length=1, max_length=RULES_MAX)]

    def problems(self) -> list[str]:
        try:  # a table built in Python skipped the decoder's checks of types and ranges: run them
            msgspec.json.decode(msgspec.json.encode(self), type=ClassificationTable, strict=True)
        except msgspec.ValidationError as error:
            return [str(error)]
        found: list[str] = []
        for index, rule in enumerate(self.rules):
            where = f"rule {index + 1} ({rule.status_min}-{rule.status_max} {rule.code or '*'})"
            if rule.status_min > rule.status_max:
                found.append(f"{where}: status_min is above status_max")
            shadowing = next((i for i, earlier in enumerate(self.rules[:index]) if earlier.covers(rule)), None)
            if shadowing is not None:
                found.append(f"{where}: unreachable, rule {shadowing + 1} matches everything it does")
            retries = rule.action in {Action.RETRY, Action.RETRY_AFTER}
            if retries and rule.status_max >= 500 and rule.error_class not in UNKNOWN_OUTCOME_CLASSES:
                found.append(
                    f"{where}: a retried 5xx may have taken effect; use one of {sorted(UNKNOWN_OUTCOME_CLASSES)}"
                )
        if not self.rules or not self.rules[-1].is_catch_all:
            found.append(f"the last rule must match every status ({STATUS_MIN}-{STATUS_MAX}) with no code")
        return found

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise ClassificationError(f"{self.downstream}: " + "; ".join(problems))


def decode_table(data: bytes) -> ClassificationTable:
    """A table from its JSON, strictly decoded and validated (raises ClassificationError)."""
    try:
        table = msgspec.json.decode(data, type=ClassificationTable, strict=True)
    except msgspec.DecodeError as error:
        raise ClassificationError(str(error)) from None
    table.validate()
    return table


def encode_table(table: ClassificationTable) -> bytes:
    return msgspec.json.encode(table)


class _CodeBody(msgspec.Struct):
    code: str | None = None


_code_decoder: Final = msgspec.json.Decoder(_CodeBody)


def code_of(body: bytes) -> str | None:
    """The downstream's error code: the string ``code`` of a JSON object body, else None."""
    try:
        code = _code_decoder.decode(body).code
    except msgspec.DecodeError:
        return None
    return code if isinstance(code, str) else None


def excerpt_of(body: bytes) -> str:
    return body[: EXCERPT_CHARS_MAX * 4].decode("utf-8", errors="replace")[:EXCERPT_CHARS_MAX]


def retry_after_s(value: str | None, *, received_unix_s: float) -> float | None:
    """Retry-After as seconds from the answer: delay-seconds or an HTTP date; None if absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - received_unix_s)


def rule_for(table: ClassificationTable, status: int, code: str | None) -> Rule | None:
    return next((rule for rule in table.rules if rule.matches(status, code)), None)


def classify(table: ClassificationTable, answer: Answer) -> Decision:
    """The first matching rule's decision. An answer no rule matches (a table that never passed
    `validate`) is permanent: a person looks, rather than a guess repeating a payment."""
    code = code_of(answer.body)
    excerpt = excerpt_of(answer.body)
    rule = rule_for(table, answer.status, code)
    said = f"HTTP {answer.status}" + (f" {code}" if code else "")
    if rule is None:
        return Permanent(error_class="unclassified", detail=f"{said}: no rule matches", status=answer.status,
                         excerpt=excerpt)  # fmt: skip
    detail = rule.detail or said
    if rule.action is Action.SUCCESS:
        return Succeeded(detail=rule.detail or rule.error_class, status=answer.status, excerpt=excerpt)
    if rule.action is Action.PERMANENT:
        return Permanent(error_class=rule.error_class, detail=detail, status=answer.status, excerpt=excerpt)
    after = None
    if rule.action is Action.RETRY_AFTER:
        after = retry_after_s(answer.header("retry-after"), received_unix_s=answer.received_unix_s)
    return Retryable(
        error_class=rule.error_class, detail=detail, status=answer.status, retry_after_s=after,
        outcome_unknown=rule.error_class in UNKNOWN_OUTCOME_CLASSES, excerpt=excerpt,
    )  # fmt: skip


def decide(table: ClassificationTable, outcome: Outcome) -> Decision:
    """Any outcome of a call: an answer by the table; no answer by whether the request was sent."""
    if isinstance(outcome, Answer):
        return classify(table, outcome)
    if isinstance(outcome, NotSent):
        return Retryable(error_class=outcome.error_class.value, detail=outcome.detail, outcome_unknown=False)
    assert isinstance(outcome, OutcomeUnknown)
    return Retryable(error_class=outcome.error_class.value, detail=outcome.detail, outcome_unknown=True)
