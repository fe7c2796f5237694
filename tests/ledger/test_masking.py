"""Masking payloads for the viewer role: per kind, the fields ledger/masking.py names."""

from __future__ import annotations

import json

from ledger.kinds import Kind
from ledger.masking import MASK, kind_of, mask_payload, mask_payload_text

TRANSFER = {"transfer_id": "tr-77", "payer": "6222020200112233", "payee": "6222020200445566",
            "amount_minor": 888, "currency": "CNY", "memo": "for Zhang Wei"}  # fmt: skip
LIST_UPDATE = {"red_packet_id": "rp-1001", "receiver": "user-000012345678", "version": 2, "amount_minor": 5,
               "currency": "CNY"}  # fmt: skip
CALLBACK = {"target": "merchant-demo", "body": {"user": {"name": "Li Lei", "phone": "13800138000"},
                                                "tags": ["vip", 3], "none": None}}  # fmt: skip


def test_a_transfer_keeps_the_accounts_last_four_and_hides_the_memo() -> None:
    assert mask_payload(Kind.TRANSFER, TRANSFER) == {**TRANSFER, "payer": "****2233", "payee": "****5566", "memo": MASK}


def test_a_short_identifier_is_hidden_whole() -> None:
    assert mask_payload(Kind.TRANSFER, {**TRANSFER, "payee": "user-42"})["payee"] == MASK


def test_a_list_update_hides_the_receiver_not_the_red_packet() -> None:
    assert mask_payload(Kind.LIST_UPDATE, LIST_UPDATE) == {**LIST_UPDATE, "receiver": "****5678"}


def test_a_callback_body_keeps_its_shape_and_loses_every_value() -> None:
    masked = mask_payload(Kind.CALLBACK, CALLBACK)
    assert masked == {"target": "merchant-demo",
                      "body": {"user": {"name": MASK, "phone": MASK}, "tags": [MASK, MASK], "none": None}}  # fmt: skip


def test_an_unknown_kind_hides_every_string() -> None:
    assert mask_payload("new_kind", {"a": "x", "n": 5, "o": {"b": "y"}}) == {"a": MASK, "n": 5, "o": {"b": MASK}}


def test_a_payload_without_its_request_is_masked_by_its_shape() -> None:
    assert [kind_of(p) for p in (TRANSFER, LIST_UPDATE, CALLBACK, {"x": 1})] == ["transfer", "list_update", "callback", ""]
    text = json.dumps(TRANSFER)
    assert json.loads(mask_payload_text(text))["payer"] == "****2233"
    assert mask_payload_text("sha256:abc") == "sha256:abc"


def test_the_original_is_left_alone() -> None:
    copy = json.loads(json.dumps(CALLBACK))
    mask_payload(Kind.CALLBACK, copy)
    assert copy == CALLBACK
