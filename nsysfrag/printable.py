"""Text from outside (traces, snapshots, the history, paths) made safe to show on a terminal.

A label, a site name or a file name is data, never instructions to the terminal: an escape
sequence in it (``ESC[2J`` clears the screen, ``ESC]8;;`` makes a hyperlink) or a bidi override
(which reorders what the reader sees) must reach the screen as visible characters. Newlines and
tabs are shown escaped too, so that one name is one line and a one-line error stays one line.
Rich markup is a separate matter: reporters pass such text to rich as ``Text``, never as markup.
"""

from __future__ import annotations

import re

# C0 and C1 control characters and DEL; the bidi embeddings, overrides and isolates; lone
# surrogates (a file name that is not UTF-8 decodes to them, and no terminal can print them).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``)."""
    return _UNSAFE.sub(_escape, text)
