"""The command line's output filter: control and format characters escaped, everything a person
should read left alone, JSON still JSON."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from compensator.terminal import visible


def test_printable_text_newlines_and_tabs_pass_unchanged() -> None:
    for text in ("plain ASCII line", "多语言 ünïcödé — “quotes”", "a\tb\nc", "", "emoji 😀 ok"):
        assert visible(text) == text


def test_controls_and_format_characters_are_escaped() -> None:
    assert visible("\x1b[31mred\x1b[0m") == "\\u001b[31mred\\u001b[0m"
    assert visible("rp-\u202eevil") == "rp-\\u202eevil"
    assert visible("a\rb\x00c\x7fd\x9be") == "a\\u000db\\u0000c\\u007fd\\u009be"
    assert visible("zero\u200bwidth\ufeff") == "zero\\u200bwidth\\ufeff"
    assert visible("tag\U000e0041") == "tag\\udb40\\udc41"
    assert visible("line\u2028sep") == "line\\u2028sep"


@given(st.text())
def test_escaped_json_is_still_json_of_the_same_value(text: str) -> None:
    document = json.dumps({"value": text}, ensure_ascii=False)
    shown = visible(document)
    assert json.loads(shown) == {"value": text}
    assert not any(c not in "\n\t" and (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) for c in shown)
