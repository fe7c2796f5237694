"""Identifiers hold no hidden characters, and text that holds them anyway is shown escaped."""

from __future__ import annotations

import re
import sys
import unicodedata

from handlers.standins.payment import TransferRequest
from ledger.kinds import REF_KEY_PATTERNS, Kind
from ledger.text import HIDDEN_CATEGORIES, HIDDEN_RANGES, IDENTIFIER_TEXT, escaped, has_hidden


def test_the_table_is_this_pythons_control_format_and_separator_characters() -> None:
    hidden = {point for point in range(sys.maxunicode + 1) if unicodedata.category(chr(point)) in HIDDEN_CATEGORIES}
    assert {point for low, high in HIDDEN_RANGES for point in range(low, high + 1)} == hidden


def test_the_pattern_refuses_each_hidden_character_and_takes_visible_text() -> None:
    pattern = re.compile(IDENTIFIER_TEXT)
    for low, high in HIDDEN_RANGES:
        for point in (low, high):
            assert pattern.match(f"rp-{chr(point)}1") is None, hex(point)
            assert has_hidden(f"a{chr(point)}")
    for text in ("rp-1", "订单 <42> é", "a b", "x" * 128, "\U0001f600"):
        assert pattern.match(text) is not None and not has_hidden(text), text
    assert pattern.match("x" * 129) is None and pattern.match("") is None


def test_hidden_characters_are_shown_as_their_escapes() -> None:
    assert escaped("rp-\u202eevil") == "rp-\\u202eevil"
    assert escaped("a\u200bb\x00c\U000e0041") == "a\\u200bb\\u0000c\\U000e0041"
    assert escaped("line 1\n\tline 2\u2028", keep_layout=True) == "line 1\n\tline 2\\u2028"
    assert escaped("plain") == "plain"


def test_a_transfers_ref_key_is_what_the_payment_system_takes_as_its_business_id() -> None:
    """The stand-in's pattern stands for the payment system's: intake must refuse what it would."""
    business_id = TransferRequest.model_fields["business_id"].metadata
    patterns = {getattr(item, "pattern", None) for item in business_id} - {None}
    assert patterns == {REF_KEY_PATTERNS[Kind.TRANSFER]}
