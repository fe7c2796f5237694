"""Which payload fields are account numbers or personal data, and how they are shown to those who
may not see them (the viewer role: ledger-minded people who read, never act).

Per kind, read from its schema (ledger/kinds.py):
- ``transfer``: ``payer`` and ``payee`` are accounts; ``memo`` is free text a person typed, so it
  is hidden whole (a last four of a sentence identifies nobody and tells nothing);
- ``list_update``: ``receiver`` is a user's id; the red packet's id is the business's own;
- ``callback``: ``body`` is what the merchant's user-info callback writes (names, phones, user
  ids): every value in it is hidden, its keys stay so the shape can still be reviewed.

An identifier keeps its last four characters (``****1234``), enough to tell two accounts apart in a
list and to match a customer's complaint, too few to pay anyone; one of eight characters or fewer is hidden whole (its last four would
be half of it). A kind this module does not know
has every string hidden: a new kind is private until someone lists its fields here.

Must never: do I/O, or return any part of a masked value beyond those last four characters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ledger.kinds import PAYLOAD_MODELS, Kind

MASK: Final = "****"
KEEP_LAST: Final = 4

IDENTIFIERS: Final[Mapping[str, frozenset[str]]] = {
    Kind.TRANSFER: frozenset({"payer", "payee"}),
    Kind.LIST_UPDATE: frozenset({"receiver"}),
    Kind.CALLBACK: frozenset(),
}
"""Account numbers and user ids: shown as their last four characters."""
FREE_TEXT: Final[Mapping[str, frozenset[str]]] = {
    Kind.TRANSFER: frozenset({"memo"}),
    Kind.LIST_UPDATE: frozenset(),
    Kind.CALLBACK: frozenset(),
}
"""Text a person wrote: hidden whole."""
NESTED: Final[Mapping[str, frozenset[str]]] = {
    Kind.TRANSFER: frozenset(),
    Kind.LIST_UPDATE: frozenset(),
    Kind.CALLBACK: frozenset({"body"}),
}
"""Objects of personal data whose schema is the merchant's: every value inside hidden, keys kept."""


def mask_identifier(value: object) -> str:
    text = str(value)
    return MASK + text[-KEEP_LAST:] if len(text) > 2 * KEEP_LAST else MASK


def _hidden(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _hidden(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_hidden(item) for item in value]
    return None if value is None else MASK


def mask_payload(kind: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a payload with its personal fields masked; the other fields as they were."""
    if kind not in IDENTIFIERS:
        return {key: MASK if isinstance(value, str) else _hidden(value) if isinstance(value, dict | list) else value
                for key, value in document.items()}  # fmt: skip
    masked: dict[str, Any] = {}
    for key, value in document.items():
        if value is not None and key in IDENTIFIERS[kind]:
            masked[key] = mask_identifier(value)
        elif value is not None and key in FREE_TEXT[kind]:
            masked[key] = MASK
        elif key in NESTED[kind]:
            masked[key] = _hidden(value)
        else:
            masked[key] = value
    return masked


def kind_of(document: Mapping[str, Any]) -> str:
    """The kind a payload is shaped like (its schema's required fields all present), for payloads
    shown without their request (a proposal, an audit entry); "" for none: then every string is hidden."""
    for kind, model in PAYLOAD_MODELS.items():
        required = {name for name, field in model.model_fields.items() if field.is_required()}
        if required <= document.keys() and document.keys() <= model.model_fields.keys():
            return kind.value
    return ""


def mask_any_payload(document: Mapping[str, Any]) -> dict[str, Any]:
    return mask_payload(kind_of(document), document)


def mask_payload_text(text: str) -> str:
    """A payload kept as JSON text (an audit entry's before and after), masked; text that is not
    a JSON object (a SHA-256 of a large payload) as it is."""
    try:
        document = json.loads(text)
    except ValueError:
        return text
    if not isinstance(document, dict):
        return text
    return json.dumps(mask_any_payload(document), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
