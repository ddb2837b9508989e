"""Showing untrusted text to a person: the one escaping rule of every renderer and log line.

Text in Redis is data anyone with write access (or a buggy producer) may have written: a source_id
with a newline forges a table row, an ANSI escape repaints the operator's terminal, a C1 CSI or a
bidi override does the same more quietly. ``clean`` turns any value into inert text on one line;
``json_safe`` escapes what JSON may legally carry raw inside a string but a terminal must not see.
Pure functions, no I/O; the CLI (cli/render.py, cli/common.py) and logs.py use them.
"""

from __future__ import annotations

import re
from typing import Any

#: C0 controls (newline, tab, ESC, ...), DEL and C1 controls (CSI 0x9b ...), the Unicode line and
#: paragraph separators, and the bidirectional marks and overrides that reorder what a terminal shows.
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: What JSON leaves raw inside strings (it escapes only U+0000..U+001F) but a terminal must not see.
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def clean(value: Any) -> str:
    """Any value as inert text on one line: control characters written as escapes (\\n, \\x1b,
    \\u2028), everything else as it is."""
    text = value if isinstance(value, str) else str(value)
    return UNSAFE.sub(_escaped, text)


def json_safe(document: str) -> str:
    """A JSON document with DEL, C1 controls and the separators inside its strings written as \\u
    escapes: still valid JSON (those characters can only occur inside strings), and the same values."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", document)
