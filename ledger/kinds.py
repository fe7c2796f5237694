"""The request kinds and their payload schemas: what a service may hand us to compensate.

Three calls of the red-packet flow fail now and then, and each is one kind:
- ``transfer``: a payment from one account to another, keyed by the transfer id that the payment
  system deduplicates on (the handler sends it as the idempotency key and asks for it before it
  ever sends twice);
- ``list_update``: an entry of a red packet's receive list at a version; the red-packet service
  applies only a newer version, so an older update can never overwrite a newer one;
- ``callback``: a body POSTed to a registered target (by name, never a URL from the request:
  where we send signed requests is configuration, not input).

Amounts are integers in minor units with an ISO 4217 currency: no float ever holds money. Each
payload is a frozen pydantic model that refuses unknown fields, strings for numbers and floats
for amounts (strict mode): a request that says ``"amount_minor": "100"`` is refused, not guessed.

Must never: do I/O, read a clock, or know how a kind is delivered (that is handlers/).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from ledger.currencies import MINOR_UNIT_DIGITS, is_currency
from ledger.text import IDENTIFIER_TEXT

AMOUNT_MINOR_MAX: Final = 10**15
"""Ten trillion major units of any two-digit currency, and under 2**53, so a JavaScript client
reads every amount exactly."""
VERSION_MAX: Final = 2**53 - 1
MEMO_LENGTH_MAX: Final = 256
IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$"
TARGET_PATTERN: Final = r"^[a-z][a-z0-9_.-]{0,63}$"


class Kind(enum.StrEnum):
    TRANSFER = "transfer"
    LIST_UPDATE = "list_update"
    CALLBACK = "callback"


def _whole(value: object) -> object:
    """JSON has one number type: ``246.0`` *is* the integer 246 (JSON Schema says so too), so an
    integral float is taken as that integer. A fraction, a string or a bool is still refused."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


Whole = BeforeValidator(_whole)


def _currency(code: str) -> str:
    if not is_currency(code):
        raise ValueError(f"{code!r} is not an active ISO 4217 currency code")
    return code


Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
"""An id in another system (account, transfer, red packet, user): 1-128 characters, no spaces."""
AmountMinor = Annotated[
    int, Field(gt=0, le=AMOUNT_MINOR_MAX, description="Amount in minor units (cents, fen)."), Whole
]
Currency = Annotated[
    str, StringConstraints(pattern=r"^[A-Z]{3}$"), AfterValidator(_currency),
    Field(description="An active ISO 4217 alphabetic code, e.g. CNY.", examples=["CNY"],
          json_schema_extra={"enum": sorted(MINOR_UNIT_DIGITS)}),
]  # fmt: skip


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TransferPayload(_Payload):
    """Pay ``amount_minor`` of ``currency`` from ``payer`` to ``payee``, once, as ``transfer_id``.
    The payer and the payee must differ (a rule JSON Schema cannot state)."""

    transfer_id: Identifier = Field(description="The payment system's idempotency key for this transfer.")
    payer: Identifier
    payee: Identifier
    amount_minor: AmountMinor
    currency: Currency
    memo: Annotated[str, StringConstraints(max_length=MEMO_LENGTH_MAX)] | None = None

    @model_validator(mode="after")
    def _distinct_accounts(self) -> TransferPayload:
        if self.payer == self.payee:
            raise ValueError("payer and payee must differ")
        return self


class ListUpdatePayload(_Payload):
    """Record that ``receiver`` received ``amount_minor`` from ``red_packet_id``, at ``version``."""

    red_packet_id: Identifier
    receiver: Identifier
    version: Annotated[int, Field(ge=1, le=VERSION_MAX, description="Only a newer version is applied."), Whole]
    amount_minor: AmountMinor
    currency: Currency


class CallbackPayload(_Payload):
    """POST ``body`` to the registered callback target named ``target``."""

    target: Annotated[str, StringConstraints(pattern=TARGET_PATTERN)] = Field(
        description="The name of a callback target registered in this deployment's configuration (its URL and secret"
        " are configuration); a callback naming any other is refused at intake."
    )
    body: dict[str, Any] = Field(description="The JSON object to deliver.")


Payload = TransferPayload | ListUpdatePayload | CallbackPayload

PAYLOAD_MODELS: Final[Mapping[Kind, type[_Payload]]] = {
    Kind.TRANSFER: TransferPayload,
    Kind.LIST_UPDATE: ListUpdatePayload,
    Kind.CALLBACK: CallbackPayload,
}


REF_KEY_PATTERNS: Final[Mapping[Kind, str]] = {
    Kind.TRANSFER: IDENTIFIER_PATTERN,
    Kind.LIST_UPDATE: IDENTIFIER_TEXT,
    Kind.CALLBACK: IDENTIFIER_TEXT,
}
"""What each kind's ref key may be: what its downstream accepts, so a request is never stored that
can only dead-letter. A transfer's ref key goes to the payment system as the transfer's
``business_id``, an identifier there (handlers/transfer.py); the red-packet service and the
callback targets never see it, so it may be any text without control or format characters
(ledger/text.py: they would hide what the key says on every page that shows it)."""


DOWNSTREAM_OF: Final[Mapping[Kind, str]] = {
    Kind.TRANSFER: "payment",
    Kind.LIST_UPDATE: "red_packet",
    Kind.CALLBACK: "callback",
}
"""The system each kind's call goes to: the unit of circuit breakers and classification tables."""


@dataclass(frozen=True, slots=True)
class Money:
    amount_minor: int
    currency: str


def money_of(payload: Payload) -> Money | None:
    """The amount at stake, for kinds that move money or record it; None for a callback."""
    if isinstance(payload, TransferPayload | ListUpdatePayload):
        return Money(payload.amount_minor, payload.currency)
    return None


def encode_payload(payload: Payload) -> bytes:
    """Canonical JSON (keys sorted at every level, no spaces, UTF-8): the bytes the store keeps and
    deduplicates on, so the same payload sent twice with its keys in another order is the same
    request."""
    return canonical_json(payload.model_dump(exclude_none=True))


def canonical_json(document: Any) -> bytes:
    return _canonical.encode(document)


_canonical: Final = msgspec.json.Encoder(order="sorted")


def decode_payload(kind: Kind, data: bytes) -> Payload:
    """The stored bytes of a message of ``kind`` as its payload model (raises ValidationError)."""
    model = PAYLOAD_MODELS[kind]
    payload: Payload = model.model_validate_json(data)  # type: ignore[assignment]
    return payload
