"""What the command line prints goes to a terminal, and some of it came from other people: a pause's
holder or reason, a token's name, a kind, a payload's field, an API problem echoing input. A
terminal obeys control characters (ESC starts sequences that move the cursor, rewrite the title,
or on some terminals write files); bidirectional and zero-width format characters make a line
read other than it is (`rp-\\u202eevil` shows as "rp-live"). So every line the `compensator`
command writes passes through `visible`: control (Cc), format (Cf), line and paragraph separator
and surrogate characters are written as `\\uXXXX` escapes, which a person can read and which keep
JSON output valid JSON; newlines and tabs stay. `compensator.cli.main` installs it on standard
output and error for the whole command, so no command has to remember it.

Must never: change a printable character, or the newlines and tabs that lay out the output.
"""

from __future__ import annotations

import io
import re
import unicodedata
from typing import Final, TextIO

_SUSPECT: Final = re.compile(r"[^\x20-\x7e\n\t]")
"""Anything but printable ASCII, newline and tab: only these lines need a closer look."""
_ESCAPED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escape(character: str) -> str:
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a JSON-style surrogate pair, so escaped JSON stays JSON
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible(text: str) -> str:
    """`text` with every character a terminal would act on, or that hides what a line says, escaped."""
    if _SUSPECT.search(text) is None:
        return text
    return "".join(
        _escape(character)
        if character not in "\n\t" and unicodedata.category(character) in _ESCAPED_CATEGORIES
        else character
        for character in text
    )


class VisibleStream(io.TextIOBase):
    """A text stream that writes through `visible` to the one it wraps."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self.wrapped.flush()

    def isatty(self) -> bool:
        return self.wrapped.isatty()

    def fileno(self) -> int:
        return self.wrapped.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.wrapped.encoding
