"""User-facing errors: each names where the bad value came from (file:line) and the field."""

from __future__ import annotations

import re
from typing import Any

# What would break the one-line rule or act on a terminal: C0 and C1 controls, DEL, the
# Unicode line and paragraph separators, the invisible format characters (bidirectional overrides
# reorder what follows them), non-characters, and the lone surrogates a command line's
# undecodable bytes become (each one str.isprintable() refuses).
# Compiled on first use (re caches it): only an error message needs it, and compiling it takes
# ~1 ms of every command's start.
_UNPRINTABLE = ("[\x00-\x1f\x7f-\x9f\xad\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                "\ufeff\ufff9-\ufffb\ufffe\uffff\ud800-\udfff]")
ECHO_CHARS = 60


def escape(text: str) -> str:
    """`text` with every control character written as Python writes it in a repr (\\n, \\x00),
    so a message that quotes it stays one line and cannot move the cursor."""
    if text.isprintable():    # none of those characters (isprintable refuses each of them)
        return text
    return re.sub(_UNPRINTABLE, lambda m: repr(m.group())[1:-1], text)


def shorten(text: str, keep: int = ECHO_CHARS) -> str:
    """A value as an error message echoes it: a huge one is cut, not printed whole."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text):,} characters)"


def echo(value: Any) -> str:
    """A refused value as an error quotes it: a string as its repr, anything bounded."""
    return shorten(repr(value) if isinstance(value, str) else escape(str(value)))


class HpcserveError(Exception):
    """An error the CLI reports in one line with exit code 2, never as a traceback."""

    exit_code = 2


class ConfigError(HpcserveError):
    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        what = f"{self.field}: " if self.field else ""
        # Whatever a message quotes (a key, a file name, a parser's words), it stays one line.
        return escape(f"{where}{what}{self.message}")
