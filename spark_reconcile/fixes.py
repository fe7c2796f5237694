"""Closing the loop: fixable discrepancies become transfer requests the compensation API accepts.

Owns: which classes are fixable and how (today: a granted red packet that was never paid becomes a
``transfer`` of the granted amount from the funding account to the recipient), the key derived from
the discrepancy, and the JSONL file of proposed fixes. Sending them is :mod:`spark_reconcile.delivery`.

Every payload is built through :class:`ledger.kinds.TransferPayload`, the model the API validates
requests with, so a fix the API would refuse is never proposed: a row that makes no valid transfer
(a currency outside ISO 4217, a recipient that is no account id, the funding account paying itself,
an amount out of range) is refused with the reason, and stays in the discrepancy listing for finance.

The key is a hash of what identifies the break (class, business id, recipient, amount, currency) and
nothing about the run: a rerun, or the same unpaid grant found again the next night, derives the same
key. It is the transfer id the payment system deduplicates on and the Idempotency-Key the API
deduplicates on, so a rerun proposes nothing twice and the API answers a replay instead of paying.

Must never: include run-specific values (run id, date, time) in the key or the payload.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from ledger.kinds import IDENTIFIER_PATTERN, Kind, TransferPayload
from spark_reconcile.schemas import DiscrepancyClass

KEY_PREFIX: Final = "recon-"
REASON_LENGTH_MAX: Final = 500
FIXABLE_CLASSES: Final = frozenset({DiscrepancyClass.MISSING_IN_PAYMENT.value})


def check_account(account: str) -> str:
    """``account`` when it is an account id a transfer may name; ValueError otherwise."""
    if re.fullmatch(IDENTIFIER_PATTERN, account) is None:
        raise ValueError(
            f"an account id is 1-128 letters, digits or _.:@/- starting with a letter or digit, got {account!r}"
        )
    return account


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FixRequest:
    """One proposed transfer request: the API's body, and the key it is sent under."""

    idempotency_key: str
    ref_key: str
    payload: TransferPayload

    def __post_init__(self) -> None:
        assert self.payload.transfer_id == self.idempotency_key, "the transfer id is the idempotency key"

    @property
    def kind(self) -> Kind:
        return Kind.TRANSFER

    def body(self) -> dict[str, Any]:
        """What ``POST /v1/requests`` takes; the key travels in the Idempotency-Key header, not here."""
        return {
            "kind": self.kind.value,
            "ref_key": self.ref_key,
            "payload": self.payload.model_dump(mode="json", exclude_none=True),
        }

    def record(self) -> dict[str, Any]:
        """One line of ``fixes.jsonl``: the body with its key, so a person can replay it."""
        return {"idempotency_key": self.idempotency_key, **self.body()}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A fixable break that makes no valid transfer, and why."""

    business_id: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FixPlan:
    proposed: tuple[FixRequest, ...]  # sorted by key
    refused: tuple[Refusal, ...]  # sorted by business id


def idempotency_key(row: Mapping[str, Any]) -> str:
    identity = [
        row["discrepancy_class"],
        row["business_id"],
        row["recipient"],
        str(row["amount_minor"]),
        row["currency"],
    ]
    return KEY_PREFIX + hashlib.sha256("\x1f".join(map(str, identity)).encode()).hexdigest()[:40]


def _reason(error: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or 'transfer'}: {e['msg']}" for e in error.errors()]
    return "; ".join(parts)[:REASON_LENGTH_MAX]


def build_fixes(rows: Iterable[Mapping[str, Any]], *, payer_account: str) -> FixPlan:
    """Transfers for the fixable rows, paid from ``payer_account``; rows that make none are refused."""
    check_account(payer_account)
    proposed: dict[str, FixRequest] = {}
    refused: dict[str, Refusal] = {}
    for row in rows:
        if row["discrepancy_class"] not in FIXABLE_CLASSES or not row["fixable"]:
            continue
        key = idempotency_key(row)
        try:
            payload = TransferPayload(
                transfer_id=key,
                payer=payer_account,
                payee=row["recipient"],
                amount_minor=row["amount_minor"],
                currency=row["currency"],
                memo=f"reconciliation: {row['discrepancy_class']}",
            )
        except ValidationError as error:
            refused[row["business_id"]] = Refusal(business_id=row["business_id"], reason=_reason(error))
            continue
        proposed[key] = FixRequest(idempotency_key=key, ref_key=row["business_id"], payload=payload)
    return FixPlan(
        proposed=tuple(proposed[key] for key in sorted(proposed)),
        refused=tuple(refused[business_id] for business_id in sorted(refused)),
    )


def write_jsonl(fixes: Iterable[FixRequest], path: Path) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for fix in fixes:
            handle.write(json.dumps(fix.record(), sort_keys=True) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> list[FixRequest]:
    """The fixes a run proposed, validated again: a hand-edited file cannot smuggle in a bad transfer."""
    fixes: list[FixRequest] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            document = json.loads(line)
            if document["kind"] != Kind.TRANSFER.value:
                raise ValueError(f"a fix is a {Kind.TRANSFER.value} request, got kind {document['kind']!r}")
            fixes.append(
                FixRequest(
                    idempotency_key=document["idempotency_key"],
                    ref_key=document["ref_key"],
                    payload=TransferPayload.model_validate_json(json.dumps(document["payload"])),
                )
            )
    return fixes
