"""Text a person can read for what it is: the characters an identifier may not hold, and how
text that holds them anyway is shown.

An identifier (a ref key, an account, a holder's name) is read by people on pages, in CSV files
and terminals, and compared by eye. Control characters (Unicode category Cc) and format
characters (Cf: the bidirectional overrides, zero-width spaces, soft hyphens, tag characters)
are invisible or rearrange what is around them: ``rp-\\u202eevil`` is displayed as "rp-live". Line
and paragraph separators (Zl, Zp) break a one-line display. Intake refuses them in every
identifier (`IDENTIFIER_TEXT`), and whatever was stored before is shown escaped (`escaped`), so a
reader always sees that they are there.

The classes are a table of this Python's Unicode database (tests/ledger/test_text.py compares
them), written into the pattern as escapes (``\\u202e``; astral ones as the characters themselves, which every
regular-expression engine here reads), so the pattern means the same to pydantic's Rust engine,
Python's `re`, and whoever reads the OpenAPI description.

Must never: do I/O, or let an escaped form be mistaken for the text (`\\u202e` is shown, never
the character).
"""

from __future__ import annotations

import re
from typing import Final

HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _escape(point: int) -> str:
    return f"\\u{point:04x}" if point <= 0xFFFF else chr(point)


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(_escape(low) if low == high else f"{_escape(low)}-{_escape(high)}" for low, high in ranges)


HIDDEN_RANGES: Final = (
    (0x0000, 0x001f),
    (0x007f, 0x009f),
    (0x00ad, 0x00ad),
    (0x0600, 0x0605),
    (0x061c, 0x061c),
    (0x06dd, 0x06dd),
    (0x070f, 0x070f),
    (0x0890, 0x0891),
    (0x08e2, 0x08e2),
    (0x180e, 0x180e),
    (0x200b, 0x200f),
    (0x2028, 0x202e),
    (0x2060, 0x2064),
    (0x2066, 0x206f),
    (0xfeff, 0xfeff),
    (0xfff9, 0xfffb),
    (0x110bd, 0x110bd),
    (0x110cd, 0x110cd),
    (0x13430, 0x13438),
    (0x1bca0, 0x1bca3),
    (0x1d173, 0x1d17a),
    (0xe0001, 0xe0001),
    (0xe0020, 0xe007f),
)
"""(first, last) code points of Cc, Cf, Zl and Zp in Unicode 14 (Python 3.11's database; a test
checks it against the running Python's): a table, because scanning 1.1 million code points costs
80 ms at every import."""
HIDDEN_CLASS: Final = _class(HIDDEN_RANGES)
"""The body of a regular-expression character class matching every hidden character."""
VISIBLE_CHAR: Final = f"[^{HIDDEN_CLASS}]"
IDENTIFIER_TEXT: Final = rf"^{VISIBLE_CHAR}{{1,128}}$"
"""1-128 characters, none of them a control, format or separator character: a ref key of a kind
whose downstream takes any text."""
_HIDDEN: Final = re.compile(f"[{HIDDEN_CLASS}]")
KEPT: Final = frozenset("\n\t")
"""Shown as they are by `escaped(..., keep_layout=True)`: a pretty-printed document's lines."""


def has_hidden(text: str) -> bool:
    return _HIDDEN.search(text) is not None


def _visible(match: re.Match[str]) -> str:
    point = ord(match[0])
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def escaped(text: str, *, keep_layout: bool = False) -> str:
    """The text with every hidden character written as its escape (``rp-\\u202eevil``); with
    `keep_layout`, newlines and tabs stay (a pretty-printed document keeps its lines)."""
    if _HIDDEN.search(text) is None:
        return text
    if keep_layout:
        return _HIDDEN.sub(lambda m: m[0] if m[0] in KEPT else _visible(m), text)
    return _HIDDEN.sub(_visible, text)
